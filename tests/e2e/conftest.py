"""One demo fleet (local cluster, agents, controller, syncer) shared by every e2e test.

Each test runs one ``gpufleet demo`` scenario on it; the demo resets the fleet
between scenarios (no job, no incident, fresh agents and FleetPolicy), so the
order of the tests does not matter.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from gpufleet.demo.runner import Demo
from gpufleet.local import processes


@pytest.fixture(scope="session")
def demo() -> Iterator[Demo]:
    run_dir = Path(tempfile.mkdtemp(prefix="gpufleet-e2e-"))
    run_dir.chmod(0o755)
    console = Console(highlight=False, width=140, force_terminal=False)
    nodes = int(os.environ.get("GPUFLEET_E2E_NODES", "4"))
    with processes.terminate_on_signals():
        fleet = Demo.start(nodes=nodes, run_dir=run_dir / "cluster", console=console)
        try:
            yield fleet
        finally:
            fleet.stop()
    leftovers = processes.processes_using(run_dir / "cluster")
    assert not leftovers, f"processes left behind: {leftovers}"
    if not os.environ.get("GPUFLEET_KEEP_RUN_DIR"):
        shutil.rmtree(run_dir, ignore_errors=True)
