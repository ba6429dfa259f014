"""How every long-running gpufleet process logs: one format, libraries kept quiet.

Text by default, for a person reading ``kubectl logs``; ``--log-format json`` (or
``GPUFLEET_LOG_FORMAT=json``, which the chart sets) writes one JSON object per line
for a log pipeline (Loki, Elasticsearch, Cloud Logging): ``time`` (RFC 3339, UTC),
``level``, ``logger``, ``message``, the fields a call passed with ``extra=`` and, on an
error, ``exception`` (the traceback as one string), so a multi-line traceback stays
one record.

httpx logs every request it sends at INFO ("HTTP Request: GET ... 200 OK"); the
syncer polls slurmrestd and the apiserver every second, so at INFO its log was
almost only those lines. The HTTP clients (httpx, httpcore, kr8s) and kopf log
at WARNING unless ``--verbose`` asks for everything.
"""

from __future__ import annotations

import datetime
import enum
import json
import logging
import sys
from typing import Annotated, Any

import typer

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

QUIET = ("httpx", "httpcore", "kr8s", "kopf", "asyncio")
"""Loggers that say what every request did: WARNING unless verbose."""

ENV = "GPUFLEET_LOG_FORMAT"


class LogFormat(enum.StrEnum):
    """What a long-running command writes to stderr."""

    TEXT = "text"
    JSON = "json"


LogFormatOpt = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        envvar=ENV,
        case_sensitive=False,
        help="text (default) or json: one JSON object per line with time, level, logger, "
        "message and the record's fields.",
    ),
]

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
"""A LogRecord's own attributes; anything else on a record came from ``extra=``."""

_DROPPED = frozenset({"settings", "k8s_skip"})
"""What kopf puts on its records for its own use (the whole operator settings)."""
_RENAMED = {"k8s_ref": "object"}
"""kopf's reference to the object a handler ran for, under the key kopf's own JSON uses."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD or key in _DROPPED or key.startswith("_"):
                continue
            entry.setdefault(_RENAMED.get(key, key), value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(verbose: bool = False, log_format: LogFormat = LogFormat.TEXT) -> None:
    """INFO (DEBUG with ``verbose``) for gpufleet; WARNING for :data:`QUIET` unless verbose.

    As :func:`logging.basicConfig`, it does nothing to a root logger that has handlers
    already (a test's capture, an embedding program's own).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format is LogFormat.JSON else logging.Formatter(FORMAT)
    )
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
