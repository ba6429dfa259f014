"""``gpufleet status --tenant NAME``: one tenant's share of the fleet on one screen.

Its quota and the split applied now (the Tenant's status, written by the tenant controller),
its conditions, the nodes its pods run on or that it owns (with their gpufleet state), the
incidents that touched its work (the ``TenantNodeRemediation`` Events the controller wrote in
its namespaces, joined with their NodeRemediations), and what the goodput ledger charged to
them (``status.goodput`` on those NodeRemediations, where ``gpufleet goodput --write-status``
runs). It reads only; everything shown a tenant's own users may read in their namespaces,
except the Nodes and NodeRemediations (shown when the caller may read them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpufleet.api import tenant as tenant_api
from gpufleet.domain import tenancy, tenant_events, well_known
from gpufleet.kubeapi.resources import Json


@dataclass
class NodeRow:
    node: str
    state: str
    gpus: int
    """GPUs the tenant's pods request there."""
    pods: int
    owned: bool


@dataclass
class IncidentRow:
    incident: str
    node: str
    when: str
    phase: str
    """The NodeRemediation's phase and outcome now; "gone" when it no longer exists."""
    told: str
    """What the tenant was told (the Event's message)."""
    lost_gpu_seconds: dict[str, float] = field(default_factory=dict)
    trainings: list[str] = field(default_factory=list)


@dataclass
class TenantStatus:
    name: str
    display_name: str
    namespaces: list[str]
    quota: int | None
    usage: dict[str, int]
    limits: dict[str, int]
    conditions: list[tuple[str, str, str]]
    """(type, status, message)."""
    nodes: list[NodeRow]
    incidents: list[IncidentRow]
    problems: list[str]
    """Why the Tenant's spec is refused (empty: valid)."""


def summarize(
    tenant: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    remediations: Iterable[Mapping[str, Any]] | None,
) -> TenantStatus:
    """The tenant's screen from what was read: its Tenant object, the Nodes (may be empty
    when not readable), the pods and Events of its namespaces, the NodeRemediations."""
    meta = tenant.get("metadata") or {}
    spec = tenant.get("spec") or {}
    status = tenant.get("status") or {}
    name = str(meta.get("name") or "")
    problems = tenant_api.problems(tenant)
    namespaces = [str(n) for n in spec.get("namespaces") or []]
    selector = (spec.get("nodes") or {}).get("selector") or {}
    scope = tenancy.Tenant(
        name=name, created="", namespaces=tuple(namespaces), node_selector=dict(selector)
    )
    held: dict[str, list[int]] = {}
    for pod in pods:
        if (pod.get("metadata") or {}).get("namespace") not in namespaces:
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        gpus = tenancy.pod_gpus(pod)
        if node and ((pod.get("status") or {}).get("phase")) not in ("Succeeded", "Failed"):
            held.setdefault(str(node), []).append(gpus)
    rows: list[NodeRow] = []
    for n in nodes:
        nname = str(n["metadata"]["name"])
        labels = n["metadata"].get("labels") or {}
        # What the controller applied (status.nodes) where it wrote it, else the selector.
        owned = (
            nname in status["nodes"]
            if isinstance(status.get("nodes"), list)
            else tenant_events.owns(scope, labels)
        )
        if nname in held or owned:
            state = str(labels.get(well_known.LABEL_STATE) or "-")
            if (n.get("spec") or {}).get("unschedulable"):
                state += " (cordoned)"
            mine = held.pop(nname, [])
            rows.append(NodeRow(nname, state, sum(mine), len(mine), owned))
    for nname, mine in held.items():  # Nodes not readable by the caller
        rows.append(NodeRow(nname, "-", sum(mine), len(mine), False))
    return TenantStatus(
        name=name,
        display_name=str(spec.get("displayName") or ""),
        namespaces=namespaces,
        quota=spec.get("gpuQuota"),
        usage={k: int(v) for k, v in (status.get("usage") or {}).items()},
        limits={k: int(v) for k, v in (status.get("limits") or {}).items()},
        conditions=[
            (str(c.get("type")), str(c.get("status")), str(c.get("message") or ""))
            for c in status.get("conditions") or []
        ],
        nodes=sorted(rows, key=lambda r: r.node),
        incidents=_incidents(name, events, remediations),
        problems=problems,
    )


def _incidents(
    tenant: str,
    events: Iterable[Mapping[str, Any]],
    remediations: Iterable[Mapping[str, Any]] | None,
) -> list[IncidentRow]:
    """One row per incident the tenant was told of (the Events of all its namespaces say
    the same: the first read is kept)."""
    by_name = {str(r["metadata"]["name"]): r for r in remediations or []}
    out: dict[str, IncidentRow] = {}
    for ev in events:
        labels = (ev.get("metadata") or {}).get("labels") or {}
        if ev.get("reason") != tenant_events.REASON or labels.get(tenancy.LABEL_TENANT) != tenant:
            continue
        incident = str(labels.get(tenant_events.LABEL_INCIDENT) or "")
        if not incident or incident in out:
            continue
        nrem = by_name.get(incident)
        row = IncidentRow(
            incident=incident,
            node=str((ev.get("involvedObject") or {}).get("name") or ""),
            when=str(ev.get("firstTimestamp") or ""),
            phase=_phase(nrem, known=remediations is not None),
            told=str(ev.get("message") or ""),
        )
        goodput = ((nrem or {}).get("status") or {}).get("goodput") or {}
        lost = goodput.get("lostGpuSeconds") or {}
        row.lost_gpu_seconds = {
            str(k): float(v) for k, v in lost.items() if isinstance(v, (int, float))
        }
        row.trainings = [str(t) for t in goodput.get("trainings") or []]
        out[incident] = row
    return sorted(out.values(), key=lambda r: r.when, reverse=True)


def _phase(nrem: Mapping[str, Any] | None, *, known: bool) -> str:
    if nrem is None:
        return "gone" if known else "-"
    st = nrem.get("status") or {}
    phase = str(st.get("phase") or "Draining")
    return f"{phase}: {st['outcome']}" if st.get("outcome") else phase


def to_data(st: TenantStatus) -> Json:
    """The tenant's status as data (``-o json``/``-o yaml``)."""
    return {
        "tenant": st.name,
        "displayName": st.display_name,
        "namespaces": st.namespaces,
        "gpuQuota": st.quota,
        "usage": st.usage,
        "limits": st.limits,
        "conditions": [{"type": t, "status": s, "message": m} for t, s, m in st.conditions],
        "problems": st.problems,
        "nodes": [
            {"node": r.node, "state": r.state, "gpus": r.gpus, "pods": r.pods, "owned": r.owned}
            for r in st.nodes
        ],
        "incidents": [
            {
                "noderemediation": r.incident,
                "node": r.node,
                "since": r.when,
                "phase": r.phase,
                "told": r.told,
                "lostGpuSeconds": r.lost_gpu_seconds,
                "trainings": r.trainings,
            }
            for r in st.incidents
        ],
    }


def render(st: TenantStatus, *, wide: bool = False) -> Group:
    """The tenant's screen; ``wide``: also what the tenant was told of each incident."""
    title = f"tenant {st.name}" + (f" ({st.display_name})" if st.display_name else "")
    k8s, slurm = st.usage.get("kubernetesGpus", 0), st.usage.get("slurmGpus", 0)
    quota = "no limit" if st.quota is None else str(st.quota)
    head = Table(box=None, show_header=False)
    head.add_row("namespaces", ", ".join(st.namespaces) or "-")
    head.add_row("GPUs held", f"{k8s + slurm} of {quota} ({k8s} in pods, {slurm} in Slurm jobs)")
    if st.limits:
        head.add_row(
            "may hold",
            f"{st.limits.get('kubernetesGpus', '-')} GPUs in pods, "
            f"{st.limits.get('slurmGpus', '-')} in Slurm jobs (the split applied now)",
        )
    for t, s, m in st.conditions:
        if s == "True" or t == "Ready":
            head.add_row(t, Text(f"{s}{': ' + m if m else ''}"))
    for p in st.problems:
        head.add_row("[red]refused[/red]", Text(p))
    nodes = Table("NODE", "STATE", "GPUS", "PODS", "OWNED", box=None)
    for r in st.nodes:
        nodes.add_row(r.node, Text(r.state), str(r.gpus), str(r.pods), "yes" if r.owned else "")
    cols = ["NODEREMEDIATION", "NODE", "SINCE", "NOW", "GPU-H LOST", "TRAININGS"]
    inc = Table(*cols, *(["TOLD"] if wide else []), box=None)
    for i in st.incidents:
        lost = sum(i.lost_gpu_seconds.values())
        inc.add_row(
            Text(i.incident),
            i.node,
            i.when,
            Text(i.phase),
            f"{lost / 3600:.2f}" if i.lost_gpu_seconds else "-",
            Text(", ".join(i.trainings) or "-"),
            *([Text(i.told)] if wide else []),
        )
    return Group(
        Panel(head, title=title, title_align="left"),
        Panel(nodes if st.nodes else "none", title="its nodes", title_align="left"),
        Panel(
            inc if st.incidents else "none",
            title="its work interrupted by node faults (goodput: gpufleet goodput)",
            title_align="left",
        ),
    )
