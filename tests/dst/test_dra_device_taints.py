"""DRA device taints in the deterministic simulation: bounded runs with the GPU quarantine
and the controllers' DeviceTaintRules hold every invariant, 13 included
(:mod:`gpufleet.dst.dra_checks`), and do taint and release GPUs."""

from __future__ import annotations

from typing import Any

from gpufleet.api import dra as codec
from gpufleet.domain import dra
from gpufleet.domain.well_known import CONTROLLER
from gpufleet.dst.dra_checks import DeviceTaintChecks
from gpufleet.dst.kube import Write
from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config
from gpufleet.kubeapi.resources import DEVICE_TAINT_RULES

TAINTS = Config(duration=300.0, calm_s=300.0, quarantine=True, device_taints=True)
SEEDS = 2
"""About 10 s each on two cores under load; both seeds taint a GPU and release it."""


def _said(r: Result, reason: str) -> int:
    return sum(1 for ln in r.lines if f" {reason} " in ln.text())


def test_runs_with_device_taints_hold_every_invariant_and_taint_and_release_gpus() -> None:
    tainted = untainted = 0
    for seed in range(SEEDS):
        r = run(Spec(seed, TAINTS))
        assert r.violation is None, (seed, r.violation)
        tainted += _said(r, "GpuTainted")
        untainted += _said(r, "GpuUntainted")
    assert tainted > 0, "no run tainted a GPU: the path was not exercised"
    assert untainted > 0, "no taint was released"


def _rule(labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = codec.taint_rule(dra.TaintRule("n1", 3, "", "xid-48"))
    if labels is not None:
        body["metadata"]["labels"] = labels
    return body


class _Api:
    def __init__(self, record: Any) -> None:
        self.record = record

    def find(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        return {"name": name}


def test_invariant_11_fails_a_rule_without_a_quarantine_or_someone_elses_touched() -> None:
    failed: list[str] = []
    quarantined: set[int] = set()

    class Rec:
        @property
        def quarantined_gpus(self) -> list[Any]:
            return [type("Q", (), {"index": i})() for i in quarantined]

    checks = DeviceTaintChecks(
        lambda inv, node, text: failed.append(inv),
        _Api(None),
        lambda obj: Rec(),  # type: ignore[arg-type]
    )
    res = str(DEVICE_TAINT_RULES)
    name = dra.rule_name("n1", 3)
    checks.on_write(Write(CONTROLLER, res, "", name, "create", None, _rule(), 1.0))
    assert failed == ["13a"]
    quarantined.add(3)
    checks.on_write(Write(CONTROLLER, res, "", name, "create", None, _rule(), 2.0))
    assert failed == ["13a"] and checks.created == 1
    theirs = _rule({"app.kubernetes.io/managed-by": "someone"})
    checks.on_write(Write(CONTROLLER, res, "", name, "delete", theirs, None, 3.0))
    assert failed == ["13a", "13b"]
    checks.on_write(Write(CONTROLLER, res, "", name, "delete", _rule(), None, 4.0))
    assert failed == ["13a", "13b"] and checks.deleted == 1
