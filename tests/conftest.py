"""Suite-wide hooks: the summary of where the run's time went (:mod:`suite_timing`) and, under
pytest-xdist (``scripts/test`` runs ``-n 2 --dist loadscope``), how modules are shared between
the workers (:mod:`suite_schedule`, decision 0150)."""

from __future__ import annotations

from typing import Any

import pytest

from suite_timing import TimingReport


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(TimingReport(), "gpufleet-timing")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole modules and groups of modules, longest first (``--dist loadscope`` or
    ``loadgroup``; xdist's own ``load`` and the others are left as they are)."""
    if config.getvalue("dist") not in ("loadscope", "loadgroup"):
        return None
    from suite_schedule import LongestFirst

    return LongestFirst(config, log)
