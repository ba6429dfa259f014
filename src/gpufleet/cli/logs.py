"""How every long-running gpufleet process logs: one format, libraries kept quiet.

httpx logs every request it sends at INFO ("HTTP Request: GET ... 200 OK"); the
syncer polls slurmrestd and the apiserver every second, so at INFO its log was
almost only those lines. The HTTP clients (httpx, httpcore, kr8s) and kopf log
at WARNING unless ``--verbose`` asks for everything.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

QUIET = ("httpx", "httpcore", "kr8s", "kopf", "asyncio")
"""Loggers that say what every request did: WARNING unless verbose."""


def configure(verbose: bool = False) -> None:
    """INFO (DEBUG with ``verbose``) for gpufleet; WARNING for :data:`QUIET` unless verbose."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format=FORMAT, stream=sys.stderr
    )
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
