"""Which pods leave a draining node, and how."""

from __future__ import annotations

from typing import Any

from gpufleet.domain.policy import DrainMode
from gpufleet.lifecycle import draining


def pod(name: str, *, ds: bool = False, interruptible: bool = False, phase: str = "Running") -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "annotations": {}}
    if ds:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "agent"}]
    if interruptible:
        meta["annotations"]["gpufleet.io/interruptible"] = "true"
    return {"metadata": meta, "status": {"phase": phase}}


PODS = [
    pod("train"),
    pod("batch", interruptible=True),
    pod("agent", ds=True),
    pod("old", phase="Succeeded"),
]


def test_evict_mode_evicts_every_workload_but_not_daemonsets() -> None:
    p = draining.plan(PODS, mode=DrainMode.EVICT, elapsed=0, timeout=600)
    assert p.evict == (("ns", "train"), ("ns", "batch")) and not p.delete and p.remaining == 2


def test_wait_mode_evicts_only_interruptible_pods() -> None:
    p = draining.plan(PODS, mode=DrainMode.WAIT, elapsed=10_000, timeout=600)
    assert p.evict == (("ns", "batch"),) and p.remaining == 2


def test_delete_after_timeout_deletes_what_is_left() -> None:
    early = draining.plan(PODS, mode=DrainMode.DELETE_AFTER_TIMEOUT, elapsed=10, timeout=600)
    late = draining.plan(PODS, mode=DrainMode.DELETE_AFTER_TIMEOUT, elapsed=601, timeout=600)
    assert early.evict and not early.delete
    assert late.delete == (("ns", "train"), ("ns", "batch"))


def test_only_daemonsets_and_finished_pods_is_drained() -> None:
    assert draining.plan(PODS[2:], mode=DrainMode.EVICT, elapsed=0, timeout=1).done
