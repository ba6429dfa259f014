"""``gpufleet nodes`` and ``gpufleet node NAME``: which nodes are out, why, since when."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.domain import conditions, well_known
from gpufleet.kube import crds, nodes
from gpufleet.kube.client import KubeClient, NotFound

KubeconfigOpt = Annotated[
    Path | None, typer.Option(help="kubeconfig file; default: in-cluster or $KUBECONFIG.")
]


def _ago(t: float, now: float) -> str:
    s = max(0, int(now - t))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


async def _list(kubeconfig: Path | None) -> list[dict[str, Any]]:
    client = await KubeClient.connect(str(kubeconfig) if kubeconfig else None)
    data = await client._call("list nodes", "GET", url="nodes")
    return list(data.get("items") or [])


def nodes_table(
    kubeconfig: KubeconfigOpt = None,
    out: Annotated[bool, typer.Option("--out", help="Only nodes not in production.")] = False,
) -> None:
    """A table of nodes: state, since when, why, and the current remediation step.

    Example:

        gpufleet nodes --kubeconfig ~/.kube/config --out
    """
    now = time.time()
    table = Table("NODE", "STATE", "SINCE", "REASON", "STEP", box=None)
    for body in sorted(asyncio.run(_list(kubeconfig)), key=nodes.name_of):
        record, new = nodes.record_of(body, now)
        if out and record.state.value == "production":
            continue
        inc = record.incident
        step = "-"
        if inc is not None and inc.current is not None and inc.tried:
            step = f"{inc.current} (attempt {inc.tried[-1].attempt})"
        table.add_row(
            record.name,
            record.state.value + (" (unmanaged)" if new else ""),
            _ago(record.since, now),
            record.reason[:80],
            step,
        )
    Console().print(table)


async def _detail(kubeconfig: Path | None, name: str) -> tuple[dict[str, Any], list[Any]]:
    client = await KubeClient.connect(str(kubeconfig) if kubeconfig else None)
    body = await client.get_node(name)
    data = await client._call(
        "list noderemediations",
        "GET",
        version=f"{well_known.GROUP}/{well_known.VERSION}",
        url=crds.NODE_REMEDIATION_PLURAL,
        params={"labelSelector": f"gpufleet.io/node={name}"},
    )
    return body, list(data.get("items") or [])


def node_detail(
    name: Annotated[str, typer.Argument(help="Node name.")],
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """One node's history and evidence: transitions, the incident and its steps, conditions.

    Example:

        gpufleet node gpu-node-0003
    """
    console = Console()
    try:
        body, rems = asyncio.run(_detail(kubeconfig, name))
    except NotFound:
        console.print(f"no Node named {name}")
        raise typer.Exit(1) from None
    now = time.time()
    record, new = nodes.record_of(body, now)
    console.print(f"[bold]{name}[/]  state {record.state}  since {_when(record.since)}")
    console.print(f"reason: {record.reason}")
    if new:
        console.print("(gpufleet has not written a record for this node yet)")
    spec = body.get("spec", {})
    ann = body["metadata"].get("annotations") or {}
    cordon = "no"
    if spec.get("unschedulable"):
        ours = ann.get(well_known.ANNOTATION_CORDONED) == well_known.CONTROLLER
        cordon = "yes (gpufleet)" if ours else "yes (not gpufleet: left alone)"
    taints = ", ".join(f"{t['key']}:{t['effect']}" for t in spec.get("taints") or []) or "none"
    console.print(f"cordoned: {cordon}   taints: {taints}")
    history = Table("WHEN", "FROM", "TO", "TRIGGER", "REASON", title="History", box=None)
    for t in record.history:
        history.add_row(_when(t.at), str(t.source), str(t.target), str(t.trigger), t.reason[:70])
    console.print(history)
    inc = record.incident
    if inc is not None:
        console.print(f"incident: {inc.key} ({inc.description}), plan {inc.plan}")
        tried = Table("STEP", "ATTEMPT", "STARTED", "ENDED", "OUTCOME", "DETAIL", box=None)
        for a in inc.tried:
            tried.add_row(
                str(a.step),
                str(a.attempt),
                _when(a.started_at),
                _when(a.ended_at),
                str(a.outcome or "running"),
                a.detail[:60],
            )
        console.print(tried)
    evidence = Table("CONDITION", "STATUS", "REASON", "EVIDENCE", title="Conditions", box=None)
    for cond in nodes.node_conditions(body):
        ctype = str(cond.get("type"))
        if conditions.subsystem_of(ctype) is None and ctype != well_known.CONDITION_REQUEST:
            continue
        message = str(cond.get("message", "")).split(" | evidence: ")[0]
        evidence.add_row(ctype, str(cond.get("status")), str(cond.get("reason")), message[:90])
    console.print(evidence)
    if rems:
        table = Table("NODEREMEDIATION", "FAULT", "PHASE", "OUTCOME", title="Incidents", box=None)
        for r in rems:
            st = r.get("status") or {}
            table.add_row(
                r["metadata"]["name"],
                r["spec"].get("fault", ""),
                str(st.get("phase", "")),
                str(st.get("outcome") or "-"),
            )
        console.print(table)
