"""Long-running commands keep the HTTP clients' per-request lines out of the log."""

from __future__ import annotations

import logging

from gpufleet.cli import logs


def test_http_clients_log_warnings_only_unless_verbose() -> None:
    logs.configure(verbose=False)
    assert all(logging.getLogger(n).level == logging.WARNING for n in logs.QUIET)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    logs.configure(verbose=True)
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO)
    logs.configure(verbose=False)
