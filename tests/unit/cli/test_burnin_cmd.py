"""``gpufleet burn-in domain`` refuses before Slurm is asked: a tray still in production (or
without a state), a domain of one tray, an injection on the real backend. The run itself is
the local cluster's test (tests/integration/test_domain_burnin.py)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli import burnin_cmd
from gpufleet.cli.main import app

LABEL = "network.topology.nvidia.com/accelerator"
runner = CliRunner()


def _node(name: str, domain: str, state: str | None) -> dict[str, Any]:
    labels = {LABEL: domain}
    if state is not None:
        labels["gpufleet.io/state"] = state
    return {"metadata": {"name": name, "labels": labels}}


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    monkeypatch.setattr(burnin_cmd, "_nodes", lambda kubeconfig: found)

    def no_slurm(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Slurm must not be asked")

    monkeypatch.setattr("gpufleet.slurm.domain_burnin.run", no_slurm)
    return found


def test_a_tray_in_production_stops_it_before_slurm_is_asked(nodes: list[dict[str, Any]]) -> None:
    nodes += [
        _node("t1", "nvl-7", "burn-in"),
        _node("t2", "nvl-7", "production"),
        _node("t3", "nvl-7", None),
        _node("x1", "nvl-8", "production"),
    ]
    r = runner.invoke(app, ["burn-in", "domain", "nvl-7", "--backend", "simulated"])
    assert r.exit_code == 2, r.output
    assert "t2 (production)" in r.output and "t3 (no state)" in r.output
    assert "x1" not in r.output


def test_a_domain_of_one_tray_and_an_injection_on_gpus_are_refused(
    nodes: list[dict[str, Any]],
) -> None:
    nodes += [_node("t1", "nvl-7", "burn-in")]
    one = runner.invoke(app, ["burn-in", "domain", "nvl-7"])
    assert one.exit_code == 2 and "needs two or more" in one.output
    real = runner.invoke(app, ["burn-in", "domain", "nvl-7", "--inject-slow", "t1"])
    assert real.exit_code == 2 and "need --backend simulated" in real.output
