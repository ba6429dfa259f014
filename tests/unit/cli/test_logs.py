"""Long-running commands keep the HTTP clients' per-request lines out of the log, and
write text or, by flag or environment, one JSON object per line."""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpufleet.cli import logs
from gpufleet.cli.main import app


def test_http_clients_log_warnings_only_unless_verbose() -> None:
    logs.configure(verbose=False)
    assert all(logging.getLogger(n).level == logging.WARNING for n in logs.QUIET)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    logs.configure(verbose=True)
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO)
    logs.configure(verbose=False)


def _emit_in_a_fresh_process(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """Run a tiny long-running-command stand-in: configure logging the way the CLI
    does from ``--log-format`` / ``GPUFLEET_LOG_FORMAT``, log three records."""
    code = (
        "import logging, sys, typer\n"
        "from gpufleet.cli import logs\n"
        "app = typer.Typer()\n"
        "@app.command()\n"
        "def run(log_format: logs.LogFormatOpt = logs.LogFormat.TEXT) -> None:\n"
        "    logs.configure(log_format=log_format)\n"
        "    log = logging.getLogger('gpufleet.lifecycle')\n"
        "    log.info('cordoned %s', 'gpu-7', extra={'node': 'gpu-7', 'xid': 79})\n"
        "    logging.getLogger('httpx').info('HTTP Request: GET /api 200')\n"
        "    try:\n"
        "        raise ValueError('bad\\nline')\n"
        "    except ValueError:\n"
        "        log.exception('step failed')\n"
        "app()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_json_logs_are_one_object_per_line_with_the_records_fields() -> None:
    lines = _emit_in_a_fresh_process("--log-format", "json")
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert [r["message"] for r in records] == ["cordoned gpu-7", "step failed"]
    first, failed = records
    assert first["level"] == "INFO" and first["logger"] == "gpufleet.lifecycle"
    assert first["node"] == "gpu-7" and first["xid"] == 79
    assert datetime.datetime.fromisoformat(first["time"]).tzinfo is not None
    assert failed["level"] == "ERROR"
    assert "ValueError: bad\nline" in failed["exception"]


def test_the_environment_chooses_json_and_text_stays_the_default() -> None:
    lines = _emit_in_a_fresh_process(env={"GPUFLEET_LOG_FORMAT": "json"})
    assert json.loads(lines[0])["node"] == "gpu-7"
    text = _emit_in_a_fresh_process(env={"GPUFLEET_LOG_FORMAT": ""})
    assert " INFO gpufleet.lifecycle cordoned gpu-7" in text[0]
    assert not text[0].startswith("{")


def test_kopf_records_name_their_object_without_the_operator_settings() -> None:
    record = logging.LogRecord("kopf.objects", logging.INFO, "", 0, "handled", None, None)
    record.k8s_ref = {"kind": "Node", "name": "gpu-7"}
    record.settings = object()
    record.k8s_skip = False
    entry = json.loads(logs.JsonFormatter().format(record))
    assert entry["object"] == {"kind": "Node", "name": "gpu-7"}
    assert "settings" not in entry and "k8s_skip" not in entry


@pytest.mark.parametrize(
    "argv",
    [
        ["controller"],
        ["agent"],
        ["syncer", "run"],
        ["slurm", "operator"],
        ["provision", "serve"],
    ],
    ids=" ".join,
)
def test_every_long_running_command_takes_log_format(argv: list[str]) -> None:
    r = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "--log-format" in r.stdout and "GPUFLEET_LOG_FORMAT" in r.stdout
