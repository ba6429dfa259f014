"""Kubernetes Node JSON <-> the syncer's view and patches (pure; no client here).

Reading: :func:`kube_view` builds the domain :class:`~gpufleet.domain.slurm_sync.KubeView`
from a raw Node. Writing: the ``*_patch`` functions return the strategic-merge
patches the syncer sends, so the same code is unit-tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api import nodedata
from gpufleet.domain import conditions as node_conditions
from gpufleet.domain import domain_faults, records, slurm_sync, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.states import NodeState

HELD = "held"
LENT = "lent"


def name_of(node: Mapping[str, Any]) -> str:
    return str(node["metadata"]["name"])


def labels_of(node: Mapping[str, Any]) -> Mapping[str, str]:
    return node.get("metadata", {}).get("labels") or {}


def addresses_of(node: Mapping[str, Any]) -> frozenset[str]:
    """The names a Slurm node of this Node may go by: its name, host name label, addresses."""
    meta = node.get("metadata") or {}
    found = {str(meta.get("name") or "")}
    found.add(str((meta.get("labels") or {}).get("kubernetes.io/hostname") or ""))
    for a in (node.get("status") or {}).get("addresses") or []:
        found.add(str(a.get("address") or ""))
    return frozenset(f for f in found if f)


def annotations_of(node: Mapping[str, Any]) -> Mapping[str, str]:
    return node.get("metadata", {}).get("annotations") or {}


def conditions(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((node.get("status") or {}).get("conditions") or [])


def taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def slurm_taint_value(node: Mapping[str, Any]) -> str | None:
    for t in taints(node):
        if t.get("key") == well_known.TAINT_SLURM:
            return str(t.get("value") or "")
    return None


def lent_to(node: Mapping[str, Any]) -> str | None:
    return annotations_of(node).get(well_known.ANNOTATION_LENT_TO) or None


def _state(node: Mapping[str, Any]) -> NodeState | None:
    value = labels_of(node).get(well_known.LABEL_STATE)
    try:
        return NodeState(value) if value else None
    except ValueError:
        return None


def _incident(node: Mapping[str, Any]) -> tuple[records.Incident | None, str]:
    """The lifecycle record's open incident, if the Node carries a readable record, and the
    NVLink domain it holds the node with ("" for none)."""
    record = nodedata.trusted_record(node)
    if record is None:
        return None, ""
    held = record.nvlink_domain if domain_faults.held(record.incident) else ""
    return record.incident, held


def kube_view(node: Mapping[str, Any] | None) -> slurm_sync.KubeView | None:
    """The syncer's view of a Node; None for a missing Node (unknown)."""
    if node is None:
        return None
    # The syncer's own report (SlurmHealthProblem) is for the lifecycle controller;
    # counted here it would hold the node out by itself, with no controller to verify it.
    problem_types = set(well_known.CONDITIONS.values()) - {HEALTH_CONDITION}
    problems = tuple(
        sorted(
            (str(c["type"]), str(c.get("reason") or ""))
            for c in conditions(node)
            if c.get("type") in problem_types and c.get("status") == "True"
        )
    )
    incident, domain_held = _incident(node)
    return slurm_sync.KubeView(
        state=_state(node),
        cordoned=bool((node.get("spec") or {}).get("unschedulable")),
        cordoned_by_us=well_known.ANNOTATION_CORDONED in annotations_of(node),
        problems=problems,
        lent=lent_to(node) is not None,
        requeue=incident.requeue if incident is not None else None,
        incident_opened_at=incident.opened_at if incident is not None else None,
        managed=bool(annotations_of(node).get(well_known.ANNOTATION_RECORD)),
        spare=((node.get("metadata") or {}).get("labels") or {}).get(well_known.LABEL_SPARE)
        == "true",
        domain_held=domain_held,
    )


# -- patches --------------------------------------------------------------------

HEALTH_CONDITION = well_known.CONDITIONS[Subsystem.SLURM]
"""``SlurmHealthProblem``: a foreign drain the policy calls hardware (fault ``slurm-drain``)."""


def health_reported(node: Mapping[str, Any]) -> str | None:
    """The human part of the Node's ``SlurmHealthProblem`` condition when it is True."""
    for c in conditions(node):
        if c.get("type") == HEALTH_CONDITION and c.get("status") == "True":
            return health_text(str(c.get("message") or ""))
    return None


def health_text(message: str) -> str:
    """The human part of a problem condition's message (before its evidence JSON)."""
    return message.partition(" | evidence: ")[0]


def health_report(node_name: str, reason: str | None, at: float) -> node_conditions.ConditionReport:
    """The ``SlurmHealthProblem`` condition for a hardware reason (None: no problem).

    It carries one ``slurm-drain`` occurrence at ``at`` in the agent's format, so
    the lifecycle controller reads it like any problem condition.
    """
    if reason is None:
        return node_conditions.healthy(Subsystem.SLURM)
    fault = FaultEvent(
        FaultKind.SLURM_DRAIN, node_name, at=at, evidence=Evidence(message=f"Slurm: {reason}")
    )
    return node_conditions.problem(Subsystem.SLURM, [fault])


def condition_patch(report: node_conditions.ConditionReport, now_iso: str) -> dict[str, Any]:
    """A status patch that sets one Node condition (merged by type)."""
    condition = {
        "type": report.type,
        "status": report.status,
        "reason": report.reason,
        "message": report.message,
        "lastTransitionTime": now_iso,
        "lastHeartbeatTime": now_iso,
    }
    return {"status": {"conditions": [condition]}}


def report_text(hold: slurm_sync.ForeignHold | None) -> str | None:
    return None if hold is None else f"{hold.state}: {hold.reason}"


def reported(node: Mapping[str, Any]) -> str | None:
    """What the Node currently says about foreign Slurm holds (our annotation)."""
    return annotations_of(node).get(well_known.ANNOTATION_SLURM_STATE) or None


def report_patches(
    hold: slurm_sync.ForeignHold | None, now_iso: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata patch, status patch) that make the Node report ``hold``."""
    text = report_text(hold)
    meta = {"metadata": {"annotations": {well_known.ANNOTATION_SLURM_STATE: text}}}
    condition = {
        "type": well_known.CONDITION_SLURM,
        "status": "True" if hold else "False",
        "reason": "SlurmDrainedOrDown" if hold else "SlurmAvailable",
        "message": text or "Slurm holds this node for no reason gpufleet does not own",
        "lastTransitionTime": now_iso,
        "lastHeartbeatTime": now_iso,
    }
    return meta, {"status": {"conditions": [condition]}}


def taint_patch(node: Mapping[str, Any], value: str | None) -> dict[str, Any] | None:
    """A patch that sets our taint to ``value`` (None removes it); None if nothing changes.

    The whole taint list is replaced (taints have no merge key), keeping everyone
    else's taints as ``node`` shows them; so the patch carries ``node``'s
    ``resourceVersion`` and the apiserver refuses it (409 Conflict) if the Node changed
    since: a taint someone added meanwhile is never written over. The caller reads
    the Node again and asks for a new patch.
    """
    if slurm_taint_value(node) == value:
        return None
    others = [dict(t) for t in taints(node) if t.get("key") != well_known.TAINT_SLURM]
    if value is not None:
        others.append({"key": well_known.TAINT_SLURM, "value": value, "effect": "NoSchedule"})
    patch: dict[str, Any] = {"spec": {"taints": others}}
    version = (node.get("metadata") or {}).get("resourceVersion")
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return patch


def lend_patch(node: Mapping[str, Any], pod: str) -> dict[str, Any]:
    """Lock ``node`` for ``pod``: the annotation and the ``lent`` taint, in one write
    guarded by the Node's ``resourceVersion`` (see :func:`taint_patch`)."""
    return _with_taint({well_known.ANNOTATION_LENT_TO: pod}, taint_patch(node, LENT), node)


def return_patch(node: Mapping[str, Any], hold: bool) -> dict[str, Any]:
    """Give ``node`` back to Slurm: annotation removed, taint ``held`` (or none), guarded."""
    taint = taint_patch(node, HELD if hold else None)
    return _with_taint({well_known.ANNOTATION_LENT_TO: None}, taint, node)


def _with_taint(
    annotations: dict[str, Any], taint: dict[str, Any] | None, node: Mapping[str, Any]
) -> dict[str, Any]:
    patch: dict[str, Any] = {"metadata": {"annotations": annotations}}
    if taint is not None:
        patch["spec"] = taint["spec"]
        version = (node.get("metadata") or {}).get("resourceVersion")
        if version:
            patch["metadata"]["resourceVersion"] = version
    return patch


def stuck_jobs_patch(job_ids: tuple[int, ...]) -> dict[str, Any]:
    value = ",".join(str(j) for j in job_ids) if job_ids else None
    return {"metadata": {"annotations": {well_known.ANNOTATION_SLURM_STUCK_JOBS: value}}}


# -- pods -------------------------------------------------------------------------

GPU = "nvidia.com/gpu"


def pod_key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"


def pod_gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU)
        if value:
            total += int(value)
    return total


def pod_unschedulable(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or (pod.get("spec") or {}).get("nodeName"):
        return False
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def pod_fits(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """The Pod's nodeSelector matches and the node has the GPUs (affinity is not evaluated)."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    node_labels = labels_of(node)
    if any(node_labels.get(k) != v for k, v in selector.items()):
        return False
    allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU, "0")
    return int(allocatable) >= pod_gpus(pod)
