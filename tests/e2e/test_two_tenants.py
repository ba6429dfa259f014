"""``gpufleet demo --scenario two-tenants`` on the fleet of its own it needs (Slurm 24.11,
slurmdbd and MariaDB with limits enforced, the tenant controller; decision 0289): one
tenant refused over its quota by the apiserver and by sbatch, the other unaffected, and
nothing of either left afterwards. About 40 s with its cluster."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from gpufleet.demo import tenant_scenarios as ts
from gpufleet.demo.runner import Demo
from gpufleet.local import processes

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet() -> Iterator[Demo]:
    run_dir = Path(tempfile.mkdtemp(prefix="gpufleet-e2e-tenants-"))
    run_dir.chmod(0o755)
    console = Console(highlight=False, width=140, force_terminal=False)
    with processes.terminate_on_signals():
        demo = Demo.start(nodes=4, run_dir=run_dir / "cluster", console=console, tenants=True)
        try:
            yield demo
        finally:
            demo.stop()
    assert not processes.processes_using(run_dir / "cluster")


def test_two_tenants_one_refused_from_each_scheduler(fleet: Demo) -> None:
    result = fleet.run("two-tenants")
    f = result.figures
    assert "exceeded quota: gpufleet-tenant-vision" in f["pod_refused"], f
    assert "limited: requests.nvidia.com/gpu=4" in f["pod_refused"], f
    assert "AssocGrpGRES" in f["sbatch_refused"], f
    assert "GrpTRES is gres/gpu=4" in f["sbatch_meaning"], f
    notes = [e.text for e in result.entries if e.kind == "demo"]
    assert any(n.startswith("speech: sbatch --gres=gpu:8 as bob -> job") for n in notes), notes
    assert any("speech holds 8 GPUs in pods and 8 in Slurm jobs of its 16" in n for n in notes)
    # Cleaned up: no Tenant, no tenant's account, no labelled node.
    api, info = fleet.fleet.api, fleet.fleet.info
    assert not api.get(ts.TENANTS_PATH).get("items")
    accounts = subprocess.run(
        ["sacctmgr", "-nP", "show", "account", "format=account"],
        env=info.slurm_env(), capture_output=True, text=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip
    assert accounts == ["root"]
    nodes = api.get("/api/v1/nodes", params={"labelSelector": ts.POOL_LABEL}).get("items")
    assert not nodes
