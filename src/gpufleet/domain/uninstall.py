"""What removing gpufleet from a cluster takes off each Node, and which Nodes keep it.

``helm uninstall`` runs ``gpufleet cleanup`` first (a pre-delete hook): the
controllers stop, then every Node gets back to what it was without gpufleet:
our labels, annotations, taints and conditions removed, our cordon lifted.

Except a Node gpufleet holds out of service (a fault, a repair, burn-in,
triage, RMA, a power action in flight): lifting its cordon and taint would hand
work to a machine that is broken or unverified. Such a Node is kept exactly as
it is and named in the report, so a person decides. What identifies a machine
(its pool, Machine name, BMC Secret, InfiniBand position, GPU product) was set
by provisioning or an admin, not by gpufleet's controllers, and stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain import topology
from gpufleet.domain import well_known as wk
from gpufleet.domain.states import NodeState

LABELS = (
    wk.LABEL_STATE,
    wk.LABEL_SPARE,
    wk.LABEL_NVLINK_CLUSTER,
    wk.LABEL_NVLINK_CLIQUE,
    wk.LABEL_IB_SEEN_LEAF,
    wk.LABEL_IB_SEEN_LEAF_NAME,
    wk.LABEL_SLURM_CLUSTER,
)
"""Labels gpufleet's controller, agent and Slurm operator write."""

ANNOTATIONS = (
    wk.ANNOTATION_RECORD,
    wk.ANNOTATION_RECORD_SIGNATURE,
    wk.ANNOTATION_SLURM_PROBE,
    wk.ANNOTATION_REASON,
    wk.ANNOTATION_CORDONED,
    wk.ANNOTATION_REMEDIATION,
    wk.ANNOTATION_LEMON_SCORE,
    wk.ANNOTATION_LEMON_GPUS,
    wk.ANNOTATION_FAULTS_SEEN,
    wk.ANNOTATION_SLURM_STATE,
    wk.ANNOTATION_SLURM_WORK,
    wk.ANNOTATION_LENT_TO,
    wk.ANNOTATION_SLURM_STUCK_JOBS,
    wk.ANNOTATION_AGENT_REQUEST,
    wk.ANNOTATION_AGENT_RESULT,
    wk.ANNOTATION_HARDWARE,
    wk.ANNOTATION_OPERATOR_REQUEST,
    wk.ANNOTATION_IMAGE_VERSION,
    wk.ANNOTATION_TOPOLOGY_LABELS,
)
"""Annotations gpufleet's controller, agent, syncer and CLI write on Nodes."""

TAINTS = (*wk.OWNED_TAINTS, wk.TAINT_SPARE, wk.TAINT_SLURM)

CONDITIONS = (
    *wk.CONDITIONS.values(),
    wk.CONDITION_BMC_MISMATCH,
    wk.CONDITION_REQUEST,
    wk.CONDITION_SLURM,
    wk.CONDITION_HARDWARE,
)
"""Node condition types gpufleet writes (the kubelet never removes another's)."""

HELD_ANNOTATIONS = (
    wk.ANNOTATION_BMC_ACTION,
    wk.ANNOTATION_BMC_ACTION_SIGNATURE,
    wk.ANNOTATION_RMA_TICKET,
)
"""A power action in flight, a ticket with people: the Node is held whatever its state."""

IN_SERVICE = frozenset({NodeState.PRODUCTION})


@dataclass(frozen=True, slots=True)
class Cleanup:
    """What to do with one Node: a metadata patch and a status patch (both None when
    there is nothing of ours), or ``kept`` with why the Node stays as it is."""

    node: str
    patch: dict[str, Any] | None = None
    status_patch: dict[str, Any] | None = None
    kept: str | None = None
    removed: tuple[str, ...] = field(default_factory=tuple)
    """What the patches take off, for the report (``label gpufleet.io/state``, ``cordon``)."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the Node's lifecycle record says, as ``api.nodedata`` read it (the one codec of
    gpufleet's data on a Node): its state, or that it cannot be read."""

    state: NodeState | None = None
    unreadable: bool = False


def state_of(node: dict[str, Any], recorded: Recorded) -> NodeState | None:
    """The Node's gpufleet state: its record's, else its label's; None when neither
    says (a Node gpufleet never took on). Raises ValueError when what is there
    cannot be read."""
    if recorded.unreadable:
        raise ValueError("the record cannot be read")
    if recorded.state is not None:
        return recorded.state
    label = ((node.get("metadata") or {}).get("labels") or {}).get(wk.LABEL_STATE)
    return None if label is None else NodeState(label)


def why_kept(node: dict[str, Any], recorded: Recorded) -> str | None:
    """Why ``node`` must keep gpufleet's marks (None: it may be released)."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    for key in HELD_ANNOTATIONS:
        if annotations.get(key):
            return f"{key} is set (a power action or an RMA ticket is in flight)"
    try:
        state = state_of(node, recorded)
    except ValueError:
        return "its gpufleet state cannot be read (failing closed)"
    if state is not None and state not in IN_SERVICE and _holds(node):
        reason = annotations.get(wk.ANNOTATION_REASON) or ""
        return f"state {state.value}" + (f": {reason}" if reason else "")
    taints = (node.get("spec") or {}).get("taints") or []
    if any(t.get("key") == wk.TAINT_UNHEALTHY for t in taints):
        return f"taint {wk.TAINT_UNHEALTHY} is set"
    return None


def _holds(node: dict[str, Any]) -> bool:
    """Whether gpufleet holds the Node: it keeps a record of it, or its taint or cordon is
    on it. A state label alone (``provisioning``, which a machine registers with) on a Node
    no controller took on holds nothing: work already reaches it."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    if annotations.get(wk.ANNOTATION_RECORD):
        return True
    if annotations.get(wk.ANNOTATION_CORDONED) == wk.CONTROLLER and spec.get("unschedulable"):
        return True
    return any(t.get("key") in wk.OWNED_TAINTS for t in spec.get("taints") or [])


def cleanup(node: dict[str, Any], recorded: Recorded) -> Cleanup:
    """The patches that remove gpufleet from ``node``, or why it is kept."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    kept = why_kept(node, recorded)
    if kept is not None:
        return Cleanup(name, kept=kept)
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    removed: list[str] = []
    patch_meta: dict[str, Any] = {}
    written = (*LABELS, *topology.owned_keys(annotations))  # the Slurm operator's, by name
    gone_labels = {k: None for k in written if k in labels}
    if gone_labels:
        patch_meta["labels"] = gone_labels
        removed += [f"label {k}" for k in gone_labels]
    gone_annotations = {k: None for k in ANNOTATIONS if k in annotations}
    if gone_annotations:
        patch_meta["annotations"] = gone_annotations
        removed += [f"annotation {k}" for k in gone_annotations]
    patch: dict[str, Any] = {}
    taints = spec.get("taints") or []
    kept_taints = [t for t in taints if t.get("key") not in TAINTS]
    spec_patch: dict[str, Any] = {}
    if len(kept_taints) != len(taints):
        spec_patch["taints"] = kept_taints
        removed += [f"taint {t['key']}" for t in taints if t.get("key") in TAINTS]
    if spec.get("unschedulable") and annotations.get(wk.ANNOTATION_CORDONED) == wk.CONTROLLER:
        spec_patch["unschedulable"] = None
        removed.append("cordon")
    if spec_patch:
        patch["spec"] = spec_patch
    if patch_meta or spec_patch:
        # The taint list is replaced whole: the write must fail if the Node changed since.
        patch_meta["resourceVersion"] = meta.get("resourceVersion")
        patch["metadata"] = patch_meta
    conditions = ((node.get("status") or {}).get("conditions")) or []
    ours = [c["type"] for c in conditions if c.get("type") in CONDITIONS]
    status_patch = None
    if ours:
        status_patch = {"status": {"conditions": [{"type": t, "$patch": "delete"} for t in ours]}}
        removed += [f"condition {t}" for t in ours]
    return Cleanup(name, patch or None, status_patch, None, tuple(removed))
