"""What ``gpufleet cleanup`` takes off a Node, and which Nodes it keeps as they are."""

from __future__ import annotations

from typing import Any

from gpufleet.domain import uninstall
from gpufleet.domain import well_known as wk
from gpufleet.domain.records import NodeRecord, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.uninstall import recorded


def plan_of(node: dict[str, Any]) -> uninstall.Cleanup:
    return uninstall.cleanup(node, recorded(node))


def node(
    state: str | None = "production",
    *,
    cordoned_by_us: bool = False,
    cordoned: bool = False,
    taints: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    ann = {"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock"}
    labels = {"gpufleet.io/pool": "train", "kubernetes.io/hostname": "n1"}
    if state is not None:
        labels[wk.LABEL_STATE] = state
        record = NodeRecord.new("n1", at=1.0, state=NodeState(state), reason="test")
        ann[wk.ANNOTATION_RECORD] = record_to_json(record)
        ann[wk.ANNOTATION_LEMON_SCORE] = "0.50"
    if cordoned_by_us:
        ann[wk.ANNOTATION_CORDONED] = wk.CONTROLLER
    ann.update(annotations or {})
    spec: dict[str, Any] = {"taints": taints or []}
    if cordoned or cordoned_by_us:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": "n1", "labels": labels, "annotations": ann, "resourceVersion": "7"},
        "spec": spec,
        "status": {"conditions": conditions or []},
    }


def test_a_production_node_loses_our_marks_and_keeps_its_identity_and_others() -> None:
    n = node(
        taints=[
            {"key": wk.TAINT_SLURM, "value": "held", "effect": "NoSchedule"},
            {"key": "example.com/reserved", "value": "x", "effect": "NoSchedule"},
        ],
        annotations={wk.ANNOTATION_BMC_SECRET: "gpufleet-bmc/bmc-n1"},
        conditions=[
            {"type": "Ready", "status": "True"},
            {"type": "GpuProblem", "status": "False"},
        ],
    )
    plan = plan_of(n)
    assert plan.kept is None and plan.patch is not None
    meta = plan.patch["metadata"]
    assert meta["labels"] == {wk.LABEL_STATE: None}  # the pool stays
    assert set(meta["annotations"]) == {wk.ANNOTATION_RECORD, wk.ANNOTATION_LEMON_SCORE}
    assert meta["resourceVersion"] == "7"  # the taint list is replaced whole: guarded
    assert plan.patch["spec"]["taints"] == [
        {"key": "example.com/reserved", "value": "x", "effect": "NoSchedule"}
    ]
    assert "unschedulable" not in plan.patch["spec"]  # it was not cordoned
    assert plan.status_patch == {
        "status": {"conditions": [{"type": "GpuProblem", "$patch": "delete"}]}
    }
    assert "taint gpufleet.io/slurm" in plan.removed and "condition GpuProblem" in plan.removed


def test_our_cordon_is_lifted_and_anothers_is_not() -> None:
    ours = plan_of(node(cordoned_by_us=True))
    assert ours.patch is not None and ours.patch["spec"]["unschedulable"] is None
    assert "cordon" in ours.removed
    theirs = plan_of(node(cordoned=True))
    assert theirs.patch is not None and "spec" not in theirs.patch
    assert "cordon" not in theirs.removed


def test_a_node_held_out_of_service_is_kept_whole_with_why() -> None:
    for state in ("remediating", "draining", "burn-in", "verifying", "triage", "rma"):
        plan = plan_of(
            node(
                state,
                cordoned_by_us=True,
                annotations={wk.ANNOTATION_REASON: "xid-79 on gpu 3"},
                taints=[{"key": wk.TAINT_UNHEALTHY, "effect": "NoExecute"}],
            )
        )
        assert plan.patch is None and plan.status_patch is None
        assert plan.kept is not None and plan.kept.startswith(f"state {state}")
    held = plan_of(node(taints=[{"key": wk.TAINT_UNHEALTHY, "effect": "NoSchedule"}]))
    assert held.kept == f"taint {wk.TAINT_UNHEALTHY} is set"


def test_a_power_action_in_flight_or_an_unreadable_record_keeps_the_node() -> None:
    inflight = node(annotations={wk.ANNOTATION_BMC_ACTION: '{"step": "reboot"}'})
    assert plan_of(inflight).kept is not None
    broken = node(annotations={wk.ANNOTATION_RECORD: "{not json"})
    assert plan_of(broken).kept == "its gpufleet state cannot be read (failing closed)"
    unknown_state = node(None)
    unknown_state["metadata"]["labels"][wk.LABEL_STATE] = "sideways"
    assert plan_of(unknown_state).kept is not None


def test_a_node_gpufleet_never_touched_needs_nothing() -> None:
    plan = plan_of(node(None))
    assert plan.kept is None and plan.patch is None and plan.status_patch is None
    assert plan.removed == ()


def test_a_machine_that_only_registered_as_provisioning_is_released() -> None:
    """A Node joined by provisioning carries ``gpufleet.io/state=provisioning`` from its
    registration; no controller took it on (a system node): nothing holds it."""
    n = node(None)
    n["metadata"]["labels"][wk.LABEL_STATE] = "provisioning"
    plan = plan_of(n)
    assert plan.kept is None and plan.removed == (f"label {wk.LABEL_STATE}",)
    taken_on = node("provisioning", taints=[{"key": wk.TAINT_UNVERIFIED, "effect": "NoSchedule"}])
    assert plan_of(taken_on).kept == "state provisioning"
