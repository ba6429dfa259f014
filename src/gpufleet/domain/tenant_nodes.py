"""A tenant's own nodes: which nodes each tenant owns, and the Node writes that mark them.

A Tenant with ``spec.nodes.selector`` owns the Nodes whose labels match it. gpufleet
marks an owned node with the label ``gpufleet.io/tenant=<tenant>`` and the taint
``gpufleet.io/tenant=<tenant>:NoSchedule``: new pods of anyone else stay off it, while
pods already running there are never evicted (NoSchedule, not NoExecute: the point
is new work; docs/decisions/0290). The annotation ``gpufleet.io/tenant-set`` records
what gpufleet set, so that only its own label and taint are ever changed or removed: a
label or taint of that key set by someone else is left alone and reported.

A node two tenants select belongs to the older one (``creationTimestamp``, then name:
:func:`gpufleet.domain.tenancy.conflicts`' rule); the newer gets a conflict. A tenant
being deleted, invalid or in conflict owns nothing, so its nodes are released.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain.maintenance import Reservation
from gpufleet.domain.tenancy import LABEL_TENANT, Tenant
from gpufleet.domain.tenant_events import owns as selects

TAINT_KEY = LABEL_TENANT
"""The taint's key: the same as the label's (``gpufleet.io/tenant``), effect NoSchedule."""
ANNOTATION_SET = "gpufleet.io/tenant-set"
"""On a Node: the tenant whose label and taint gpufleet set there (absent: none of ours)."""
EFFECT = "NoSchedule"


@dataclass(frozen=True)
class Ownership:
    """Which tenant owns each node, and what newer tenants claim of an older one's."""

    owner: Mapping[str, str]
    """Node name -> owning tenant."""
    conflicts: Mapping[str, list[str]]
    """Tenant -> the nodes an older tenant holds, one sentence each (empty: none)."""

    def nodes_of(self, tenant: str) -> list[str]:
        return sorted(n for n, t in self.owner.items() if t == tenant)


def ownership(tenants: Iterable[Tenant], nodes: Mapping[str, Mapping[str, str]]) -> Ownership:
    """From the tenants that may own nodes and every Node's labels, who owns what.

    ``tenants``: only those to apply (valid, not deleting, not otherwise in conflict);
    the oldest that selects a node owns it, the others get a conflict naming it. A
    tenant in conflict owns no node at all (nothing of it is applied, as for any other
    conflict), so the older never loses a node and the newer lets go of all of them.
    """
    owner: dict[str, str] = {}
    found: dict[str, list[str]] = {}
    for t in sorted(tenants, key=lambda x: x.order):
        found[t.name] = []
        for name in sorted(nodes):
            if not selects(t, nodes[name]):
                continue
            held = owner.get(name)
            if held is None:
                owner[name] = t.name
            elif held != t.name:
                found[t.name].append(f"node {name} belongs to tenant {held}")
    return Ownership({n: t for n, t in owner.items() if not found[t]}, found)


def _taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


@dataclass(frozen=True)
class NodeWrite:
    """One Node's change: a merge patch (guarded by the Node's resourceVersion) and why."""

    node: str
    patch: Mapping[str, Any]
    tenant: str | None
    """The tenant it now belongs to (None: released)."""


@dataclass(frozen=True)
class NodePlan:
    writes: tuple[NodeWrite, ...] = ()
    foreign: Mapping[str, str] = field(default_factory=dict)
    """Node -> why it was left alone (a label or taint of the key gpufleet did not set)."""


def plan_nodes(ownership_: Ownership, nodes: Mapping[str, Mapping[str, Any]]) -> NodePlan:
    """The Node writes that make the label and taint match the ownership.

    ``nodes``: every Node by name (as read). A node is changed only where gpufleet set
    what is there (its annotation) or where nothing of the key is there; a label or
    taint of ``gpufleet.io/tenant`` it did not set is never touched (reported in
    ``foreign`` when a tenant wants the node). Only the taint of that key is changed;
    everyone else's taints are kept, and the patch carries the Node's resourceVersion
    so that a taint added meanwhile is never written over (the write is refused: the
    next pass reads again).
    """
    writes: list[NodeWrite] = []
    foreign: dict[str, str] = {}
    for name in sorted(nodes):
        node = nodes[name]
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        ours = (meta.get("annotations") or {}).get(ANNOTATION_SET)
        taints = _taints(node)
        key_taints = [t for t in taints if t.get("key") == TAINT_KEY]
        want = ownership_.owner.get(name)
        if ours is None:
            if want is None:
                continue
            if LABEL_TENANT in labels or key_taints:
                foreign[name] = (
                    f"node {name} has a {LABEL_TENANT} label or taint gpufleet did not set: "
                    "left alone"
                )
                continue
        if want is not None and want == ours and _marked(labels, key_taints, want):
            continue
        others = [dict(t) for t in taints if t.get("key") != TAINT_KEY]
        if want is not None:
            others.append({"key": TAINT_KEY, "value": want, "effect": EFFECT})
        patch: dict[str, Any] = {
            "metadata": {
                "labels": {LABEL_TENANT: want},
                "annotations": {ANNOTATION_SET: want},
            },
            "spec": {"taints": others},
        }
        version = meta.get("resourceVersion")
        if version:
            patch["metadata"]["resourceVersion"] = version
        writes.append(NodeWrite(name, patch, want))
    return NodePlan(tuple(writes), foreign)


def _marked(labels: Mapping[str, str], key_taints: list[Mapping[str, Any]], want: str) -> bool:
    return labels.get(LABEL_TENANT) == want and key_taints == [
        {"key": TAINT_KEY, "value": want, "effect": EFFECT}
    ]


# --- Slurm: a reservation per tenant on its own nodes (docs/decisions/0291) -------------

RESERVATION_PREFIX = "gpufleet-tenant-"
"""Slurm reservations of this name are the tenant controller's; no other is ever touched."""


def reservation_name(tenant: str) -> str:
    return RESERVATION_PREFIX + tenant


def slurm_names(aliases: Mapping[str, frozenset[str]], known: frozenset[str]) -> dict[str, str]:
    """Each Node's Slurm node, as the syncer finds it: by its name, else by one of the names
    it goes by (host name label, addresses); a Node Slurm does not know is left out.

    ``aliases``: per Node name, every name it may go by (its own included)."""
    out: dict[str, str] = {}
    for name, names in aliases.items():
        if name in known:
            out[name] = name
        else:
            found = sorted(names & known)
            if found:
                out[name] = found[0]
    return out


def wanted_reservations(
    own: Ownership, accounts: Mapping[str, str], names: Mapping[str, str]
) -> list[Reservation]:
    """One reservation per tenant with a Slurm account (``accounts``: tenant -> account) and
    at least one owned node Slurm knows (``names``: Node -> Slurm node), for its account."""
    nodes: dict[str, set[str]] = {}
    for node, tenant in own.owner.items():
        if tenant in accounts and node in names:
            nodes.setdefault(tenant, set()).add(names[node])
    return [
        Reservation(reservation_name(t), 0.0, frozenset(ns), frozenset({accounts[t]}))
        for t, ns in sorted(nodes.items())
    ]


@dataclass(frozen=True)
class ReservationWrite:
    """``create``, ``update`` (its nodes or account) or ``delete`` one tenant reservation."""

    op: str
    reservation: Reservation


def plan_reservations(
    wanted: Iterable[Reservation], current: Iterable[Reservation]
) -> list[ReservationWrite]:
    """What makes Slurm's ``gpufleet-tenant-*`` reservations the wanted ones; a reservation
    of any other name is never in the plan."""
    have = {r.name: r for r in current if r.name.startswith(RESERVATION_PREFIX)}
    want = {r.name: r for r in wanted}
    out: list[ReservationWrite] = []
    for name in sorted(want):
        cur = have.get(name)
        w = want[name]
        if cur is None:
            out.append(ReservationWrite("create", w))
        elif (cur.nodes, cur.accounts) != (w.nodes, w.accounts):
            out.append(ReservationWrite("update", w))
    out.extend(ReservationWrite("delete", have[n]) for n in sorted(set(have) - set(want)))
    return out
