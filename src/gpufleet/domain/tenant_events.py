"""Which tenants hear of a node fault, and what they are told (pure).

When the lifecycle controller takes a node out for repair (a NodeRemediation), the people whose
work ran there look in their own namespaces, where they may read Events, not at Nodes or
NodeRemediations (cluster-scoped, often not theirs to read). A tenant is touched by an incident
when the node is its own (``spec.nodes.selector``) or runs one of its pods; each of its
namespaces then gets one Event naming the node, the fault and the pods of the tenant on it
(decision 0288). The Slurm jobs of a tenant on a node it does not own are not known here: the
Slurm port reads GPUs per account, not nodes (docs/tenants.md says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.tenancy import Tenant

REASON = "TenantNodeRemediation"
"""The Events' reason (the tenant Events' prefix is ``Tenant``)."""

LABEL_INCIDENT = well_known.ANNOTATION_REMEDIATION
"""On each Event: the NodeRemediation it tells of (with the tenant's labels)."""

CLOSED_PHASES = frozenset({"Succeeded"})
"""A repaired node is back: no Event for an incident first seen closed."""


@dataclass(frozen=True)
class Incident:
    """One NodeRemediation as the tenants are told of it."""

    name: str
    node: str
    fault: str
    description: str
    phase: str
    started_at: str


@dataclass(frozen=True)
class TenantNodeEvent:
    """One Event to write: in ``namespace``, about ``node``, named ``name`` (one per
    incident and namespace: a second write is refused by the apiserver as a duplicate)."""

    tenant: str
    namespace: str
    name: str
    node: str
    incident: str
    message: str


def incident_of(doc: Mapping[str, Any]) -> Incident | None:
    """A NodeRemediation object as an :class:`Incident`; None for one without a node or
    already closed (repaired nodes are back in service)."""
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    status = doc.get("status") or {}
    node, name = spec.get("node"), meta.get("name")
    if not isinstance(node, str) or not node or not isinstance(name, str):
        return None
    phase = str(status.get("phase") or "Draining")
    if phase in CLOSED_PHASES or status.get("completedAt"):
        return None
    return Incident(
        name=name,
        node=node,
        fault=str(spec.get("fault") or "unknown fault"),
        description=str(spec.get("description") or ""),
        phase=phase,
        started_at=str(status.get("startedAt") or meta.get("creationTimestamp") or ""),
    )


def owns(tenant: Tenant, node_labels: Mapping[str, str]) -> bool:
    """Whether the node is the tenant's own (every label of its selector matches)."""
    sel = tenant.node_selector
    return bool(sel) and all(node_labels.get(k) == v for k, v in sel.items())


def event_name(incident: str, tenant: str) -> str:
    """The Event's name: one per incident and tenant (in each of its namespaces)."""
    return f"{incident}.{tenant}"[:253]


def node_events(
    tenants: Iterable[Tenant],
    incidents: Iterable[Incident],
    node_labels: Mapping[str, Mapping[str, str]],
    pods_on: Mapping[str, Sequence[tuple[str, str]]],
) -> list[TenantNodeEvent]:
    """The Events to write for the open incidents: for each tenant touched (the node is its
    own or runs one of its pods, ``pods_on[node]`` = (namespace, pod) of every pod there),
    one in each of its namespaces. A tenant being deleted still hears of its work."""
    out: list[TenantNodeEvent] = []
    for inc in sorted(incidents, key=lambda i: i.name):
        labels = node_labels.get(inc.node, {})
        here = pods_on.get(inc.node, ())
        for t in sorted(tenants, key=lambda t: t.name):
            mine = sorted(f"{ns}/{pod}" for ns, pod in here if ns in t.namespaces)
            owned = owns(t, labels)
            if not mine and not owned:
                continue
            message = _message(t, inc, mine, owned)
            for ns in t.namespaces:
                out.append(
                    TenantNodeEvent(
                        tenant=t.name,
                        namespace=ns,
                        name=event_name(inc.name, t.name),
                        node=inc.node,
                        incident=inc.name,
                        message=message,
                    )
                )
    return out


def _message(t: Tenant, inc: Incident, pods: Sequence[str], owned: bool) -> str:
    why = f"{inc.fault}: {inc.description}" if inc.description else inc.fault
    parts = [f"node {inc.node} is out for repair ({why}; NodeRemediation {inc.name}, {inc.phase})"]
    if pods:
        shown = ", ".join(pods[:10]) + (f" and {len(pods) - 10} more" if len(pods) > 10 else "")
        parts.append(f"tenant {t.name}'s pods on it: {shown}")
    if owned:
        parts.append(f"the node is one of tenant {t.name}'s own nodes")
    return "; ".join(parts)
