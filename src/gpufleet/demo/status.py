"""``gpufleet status``: one screen about a fleet -- nodes by state, nodes out and why,
active remediations, Slurm partition usage, the circuit breaker.

It reads Kubernetes (Nodes, NodeRemediations, FleetPolicies) and, when the
cluster has Slurm, ``sinfo``; it changes nothing.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpufleet.demo.kube import GV, answered, connect, nodes
from gpufleet.domain import well_known
from gpufleet.kubeapi.resources import Json
from gpufleet.local.cluster import ClusterInfo


@dataclass
class FleetStatus:
    by_state: Counter[str] = field(default_factory=Counter)
    out: list[tuple[str, str, str, str]] = field(default_factory=list)
    remediations: list[tuple[str, str, str, str]] = field(default_factory=list)
    not_ours: list[tuple[str, str, str]] = field(default_factory=list)
    """NodeRemediations gpufleet did not create, or that their Node does not point to:
    (name, node, why). Shown apart, never counted as repairs."""
    partitions: list[tuple[str, str, str]] = field(default_factory=list)
    """(partition, avail, node counts: allocated/idle/other/total)."""
    breakers: list[tuple[str, bool, int, int]] = field(default_factory=list)
    """(FleetPolicy, open, faulting nodes, nodes whose fault the rails withheld)."""
    domains: list[tuple[str, bool, int, int, str]] = field(default_factory=list)
    """NVLink domains judged faulty or held (``status.domainFaults``, decision 0240):
    (domain, faulty now, trays held, trays, why)."""
    goodput_lost: dict[str, float] = field(default_factory=dict)
    """GPU-seconds lost per ledger category, summed over the NodeRemediations whose
    ``status.goodput`` the ledger wrote (docs/goodput.md); empty: no ledger runs."""
    goodput_charged: int = 0
    """NodeRemediations the ledger charged."""


def _ago(stamp: str | None, now: float) -> str:
    if not stamp:
        return "-"
    try:
        t = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    except ValueError:
        return stamp
    s = max(0, int(now - t))
    return f"{s}s" if s < 120 else f"{s // 60}m"


def not_ours(
    item: dict[str, object], pointers: dict[str, str], *, finished: bool = False
) -> str | None:
    """Why a NodeRemediation is not one of the controller's repairs, or None.

    The controller labels what it creates and points the Node at its current
    incident (``gpufleet.io/remediation``). An object without the label was made
    by someone else; an unfinished one the Node does not point to is not the
    node's repair (forged, or a copy). Neither is reported as a repair in
    progress. A finished incident of ours is history: the Node has moved on.
    """
    meta = item.get("metadata")
    spec = item.get("spec")
    labels = (meta.get("labels") if isinstance(meta, dict) else None) or {}
    name = meta.get("name") if isinstance(meta, dict) else None
    node = spec.get("node") if isinstance(spec, dict) else None
    if labels.get(well_known.LABEL_MANAGED_BY) != well_known.CONTROLLER:
        return f"not created by {well_known.CONTROLLER}"
    if not finished and (not isinstance(node, str) or pointers.get(node) != name):
        return f"Node {node} does not point to it"
    return None


def gather(info: ClusterInfo) -> FleetStatus:
    """A local cluster's status: its apiserver by the admin token, Slurm by ``sinfo``."""
    api = connect(info)
    try:
        st = summarize(
            nodes(api),
            _items(answered(api, f"{GV}/noderemediations")),
            _items(answered(api, f"{GV}/fleetpolicies")),
            now=time.time(),
        )
    finally:
        api.close()
    if info.slurm_conf is not None:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P %a %F"],
            env=info.slurm_env(),
            capture_output=True,
            text=True,
            timeout=10,
        )
        for line in out.stdout.splitlines():
            name, avail, counts = line.split()
            alloc, idle, other, total = counts.split("/")
            st.partitions.append((name, avail, f"{alloc}/{idle}/{other}/{total}"))
    return st


def _items(found: Json | None) -> list[Json] | None:
    return None if found is None else list(found.get("items") or [])


def summarize(
    node_list: list[Json],
    remediations: list[Json] | None,
    policies: list[Json] | None,
    *,
    now: float,
    slurm_clusters: list[Json] | None = None,
) -> FleetStatus:
    """The status from what was read (None: that kind could not be read, e.g. no CRD).

    ``slurm_clusters``: SlurmCluster objects, one Slurm row each from the operator's
    ``status.nodesByState`` (on a cluster where ``sinfo`` cannot be run from here).
    """
    st = FleetStatus()
    pointers: dict[str, str] = {}  # node -> the NodeRemediation its controller points to
    for n in node_list:
        meta = n["metadata"]
        pointer = (meta.get("annotations") or {}).get(well_known.ANNOTATION_REMEDIATION)
        if pointer:
            pointers[meta["name"]] = pointer
        state = (meta.get("labels") or {}).get(well_known.LABEL_STATE, "unmanaged")
        st.by_state[state] += 1
        ann = meta.get("annotations") or {}
        cordoned = bool((n.get("spec") or {}).get("unschedulable"))
        lent = ann.get(well_known.ANNOTATION_LENT_TO)
        if state != "production" or cordoned or lent:
            why = ann.get(well_known.ANNOTATION_REASON) or ""
            if lent:
                why = f"lent to Pod {lent}"
            problems = [
                f"{c['type']}: {c.get('reason', '')}"
                for c in (n.get("status") or {}).get("conditions") or []
                if c["type"] in well_known.CONDITIONS.values() and c["status"] == "True"
            ]
            st.out.append((meta["name"], state, why, ", ".join(problems) or "-"))
    for item in remediations or []:
        s = item.get("status") or {}
        finished = s.get("phase") in ("Succeeded", "Escalated") and s.get("completedAt")
        why = not_ours(item, pointers, finished=bool(finished))
        if why is not None:
            node = str((item.get("spec") or {}).get("node", "?"))
            st.not_ours.append((item["metadata"]["name"], node, why))
            continue
        _add_goodput(st, s.get("goodput"))
        if finished:
            continue
        st.remediations.append(
            (
                item["spec"].get("node", "?"),
                str(item["spec"].get("fault", "")),
                f"{s.get('phase', '-')} / {s.get('currentStep') or '-'}",
                _ago(s.get("startedAt"), now),
            )
        )
    for item in policies or []:
        status = item.get("status") or {}
        b = status.get("breaker") or {}
        waiting = sum(
            int(p.get("waiting") or 0)
            for p in (status.get("budget") or {}).values()
            if isinstance(p, dict)
        )
        st.breakers.append(
            (item["metadata"]["name"], bool(b.get("open")), int(b.get("faultingNodes", 0)), waiting)
        )
        for domain, d in sorted((status.get("domainFaults") or {}).items()):
            if isinstance(d, dict):
                row = (domain, bool(d.get("faulty")), int(d.get("held") or 0))
                st.domains.append((*row, int(d.get("size") or 0), str(d.get("reason") or "")))
    for item in slurm_clusters or []:
        st.partitions.append(_slurm_cluster_row(item))
    return st


def _add_goodput(st: FleetStatus, goodput: object) -> None:
    """Add one NodeRemediation's ``status.goodput`` to the fleet's sums."""
    if not isinstance(goodput, dict) or not isinstance(goodput.get("lostGpuSeconds"), dict):
        return
    st.goodput_charged += 1
    for category, seconds in goodput["lostGpuSeconds"].items():
        if isinstance(seconds, (int, float)):
            st.goodput_lost[str(category)] = st.goodput_lost.get(str(category), 0.0) + seconds


def goodput_line(st: FleetStatus) -> str:
    """One line: what the ledger charged to the incidents, in GPU-hours per category."""
    lost = sum(st.goodput_lost.values())
    parts = ", ".join(f"{k} {v / 3600:.2f}" for k, v in st.goodput_lost.items())
    return (
        f"{lost / 3600:.2f} GPU-h lost in {st.goodput_charged} incident(s) "
        f"({parts}; gpufleet goodput for the trainings' goodput)"
    )


def _slurm_cluster_row(item: Json) -> tuple[str, str, str]:
    """A SlurmCluster as a Slurm row: allocated (and mixed), idle, other, total."""
    counts = {k: int(v) for k, v in ((item.get("status") or {}).get("nodesByState") or {}).items()}
    alloc = counts.get("allocated", 0) + counts.get("mixed", 0)
    idle = counts.get("idle", 0)
    total = sum(counts.values())
    ready = [
        c.get("status")
        for c in (item.get("status") or {}).get("conditions") or []
        if c.get("type") == "Ready"
    ]
    avail = "up" if ready == ["True"] else "not ready"
    name = f"{item['metadata'].get('namespace', '')}/{item['metadata']['name']}"
    return name, avail, f"{alloc}/{idle}/{total - alloc - idle}/{total}"


def to_data(st: FleetStatus) -> dict[str, object]:
    """The fleet status as data: what ``gpufleet status -o json`` and ``-o yaml`` print."""

    def counts(text: str) -> dict[str, int]:
        alloc, idle, other, total = (int(n) for n in text.split("/"))
        return {"allocated": alloc, "idle": idle, "other": other, "total": total}

    return {
        "nodesByState": dict(sorted(st.by_state.items())),
        "nodesOut": [
            {"node": n, "state": state, "why": why, "problems": problems}
            for n, state, why, problems in st.out
        ],
        "remediations": [
            {"node": n, "fault": fault, "phaseStep": phase, "since": since}
            for n, fault, phase, since in st.remediations
        ],
        "notOurs": [{"name": n, "node": node, "why": why} for n, node, why in st.not_ours],
        "slurmPartitions": [
            {"name": n, "avail": avail, "nodes": counts(c)} for n, avail, c in st.partitions
        ],
        "breakers": [
            {"fleetPolicy": n, "open": is_open, "faultingNodes": f, "faultsWaiting": w}
            for n, is_open, f, w in st.breakers
        ],
        "nvlinkDomainsHeld": [
            {"domain": d, "faulty": faulty, "held": held, "size": size, "why": why}
            for d, faulty, held, size, why in st.domains
        ],
        "goodput": {"incidents": st.goodput_charged, "lostGpuSeconds": st.goodput_lost},
    }


def render(st: FleetStatus, *, wide: bool = False) -> Group:
    """The status screen; ``wide``: why a node is out and its problems are not cut."""
    cut = None if wide else 70
    states = Table("STATE", "NODES", box=None)
    for state, count in sorted(st.by_state.items()):
        states.add_row(state, str(count))
    out = Table("NODE", "STATE", "WHY", "PROBLEMS", box=None)
    for node, state, why, problems in st.out:
        out.add_row(Text(node), Text(state), Text(_cut(why, cut)), Text(_cut(problems, cut)))
    rem = Table("NODE", "FAULT", "PHASE / STEP", "SINCE", box=None)
    for row in st.remediations:
        rem.add_row(*(Text(c) for c in row))
    parts = Table("PARTITION", "AVAIL", "NODES", box=None)
    for name, avail, counts in st.partitions:
        alloc, idle, other, total = counts.split("/")
        parts.add_row(name, avail, f"{alloc} allocated, {idle} idle, {other} other of {total}")
    foreign = Table("NODEREMEDIATION", "NODE", "WHY IGNORED", box=None)
    for frow in st.not_ours:
        foreign.add_row(*(Text(c) for c in frow))
    brk = Table("FLEETPOLICY", "BREAKER", "FAULTING NODES", "FAULTS WAITING", box=None)
    for name, is_open, faulting, waiting in st.breakers:
        brk.add_row(
            name,
            "[red]OPEN[/red]" if is_open else "[green]closed[/green]",
            str(faulting),
            f"[yellow]{waiting}[/yellow]" if waiting else "0",
        )
    doms = Table("NVLINK DOMAIN", "FAULTY", "TRAYS HELD", "WHY", box=None)
    for domain, faulty, held, size, why in st.domains:
        flag = "[red]yes[/red]" if faulty else "no (repaired: verifying)"
        doms.add_row(Text(domain), flag, f"{held} of {size}", Text(_cut(why, cut)))
    return Group(
        Panel(states, title="fleet by state", title_align="left"),
        Panel(out if st.out else "none", title="nodes out", title_align="left"),
        Panel(
            rem if st.remediations else "none",
            title="active remediations",
            title_align="left",
        ),
        *(
            [Panel(foreign, title="NodeRemediations not ours (ignored)", title_align="left")]
            if st.not_ours
            else []
        ),
        *(
            [Panel(doms, title="NVLink domains held as one", title_align="left")]
            if st.domains
            else []
        ),
        *(
            [Panel(goodput_line(st), title="goodput ledger", title_align="left")]
            if st.goodput_charged
            else []
        ),
        Panel(parts if st.partitions else "no Slurm", title="Slurm", title_align="left"),
        Panel(
            brk if st.breakers else "no FleetPolicy",
            title="safety rails",
            title_align="left",
        ),
    )


def _cut(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."
