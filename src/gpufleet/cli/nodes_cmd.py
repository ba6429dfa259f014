"""``gpufleet nodes`` and ``gpufleet node NAME``: which nodes are out, why, since when;
``gpufleet node VERB NAME --reason ...``: a person's request to the lifecycle controller."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from gpufleet.cli import operator_cmd
from gpufleet.domain import conditions, well_known
from gpufleet.kubeapi import NODES, KubeApi, NotFound, custom
from gpufleet.lifecycle import crds, nodes

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
    client = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
    return (await client.list(NODES)).items


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
    client = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
    body = await client.get(NODES, name)
    listing = await client.list(
        custom(crds.NODE_REMEDIATION_PLURAL), label_selector=f"gpufleet.io/node={name}"
    )
    return body, listing.items


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


# ------------------------------------------------------------ operator verbs


class _ShowByDefault(TyperGroup):
    """``gpufleet node NAME`` shows the node; ``gpufleet node VERB NAME`` asks for a verb.

    A first argument that is not a subcommand is a node name: it is shown.
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # click.Context
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["show", *args]
        return super().parse_args(ctx, args)


node_app = typer.Typer(
    cls=_ShowByDefault,
    no_args_is_help=True,
    help=(
        "One node: show it (gpufleet node NAME), or ask the lifecycle controller to "
        "return, triage, rma, maintain it or dismiss its held fault. Every verb needs "
        "--reason; the controller decides, records who and why, and answers with an "
        "Event (docs/operations.md)."
    ),
)
node_app.command("show")(node_detail)

NodeArg = Annotated[str, typer.Argument(help="Node name.")]


def _verb(verb: str, summary: str, example: str) -> Any:
    def command(
        node: NodeArg,
        reason: operator_cmd.ReasonOpt,
        kubeconfig: KubeconfigOpt = None,
        no_wait: operator_cmd.NoWaitOpt = False,
        timeout: operator_cmd.TimeoutOpt = 10.0,
        event_namespace: operator_cmd.EventNsOpt = "default",
    ) -> None:
        operator_cmd.node_request(
            verb,
            node,
            reason,
            kubeconfig,
            no_wait=no_wait,
            timeout=timeout,
            event_namespace=event_namespace,
        )

    command.__doc__ = f"{summary}\n\nExample:\n\n    {example}"
    command.__name__ = f"node_{verb}"
    return command


@node_app.command("return")
def node_return(
    node: NodeArg,
    reason: operator_cmd.ReasonOpt,
    hardware_replaced: Annotated[
        bool,
        typer.Option(
            "--hardware-replaced",
            help="The node is in rma and the vendor replaced its hardware: it starts over "
            "from provisioning (burn-in) with a new history.",
        ),
    ] = False,
    kubeconfig: KubeconfigOpt = None,
    no_wait: operator_cmd.NoWaitOpt = False,
    timeout: operator_cmd.TimeoutOpt = 10.0,
    event_namespace: operator_cmd.EventNsOpt = "default",
) -> None:
    """Return a node from triage or maintenance: it is verified (active checks) and goes
    back to production only if they pass. A node in rma needs --hardware-replaced.

    Exits 1 if the controller refused (wrong state, paused, dry-run, budget), 3 if it
    did not answer in time.

    Example:

        gpufleet node return gpu-node-0003 --reason "GPU 6 reseated, cable replaced"
    """
    operator_cmd.node_request(
        "return",
        node,
        reason,
        kubeconfig,
        no_wait=no_wait,
        timeout=timeout,
        event_namespace=event_namespace,
        hardware_replaced=hardware_replaced,
    )


node_app.command("triage")(
    _verb(
        "triage",
        "Hold a node for a person. A production node is drained first (cordon, taint, "
        "drain, within the disruption budget), then held in triage; a node being "
        "repaired or verified goes to triage at once and no further ladder step starts.",
        'gpufleet node triage gpu-node-0003 --reason "NCCL hangs only on this node"',
    )
)
node_app.command("rma")(
    _verb(
        "rma",
        "Send a node in triage or maintenance to the vendor (state rma). It comes back "
        "only with: gpufleet node return NODE --hardware-replaced.",
        'gpufleet node rma gpu-node-0003 --reason "HBM errors on GPU 2, case 4711"',
    )
)
node_app.command("maintenance")(
    _verb(
        "maintenance",
        "Take a node out for planned work: a production node is drained first, then held "
        "in maintenance; return it with: gpufleet node return NODE.",
        'gpufleet node maintenance gpu-node-0003 --reason "firmware 550.90"',
    )
)
node_app.command("dismiss")(
    _verb(
        "dismiss",
        "Drop the fault a safety rail (budget, breaker, pause, dry-run) holds on a node: "
        "it is never acted on. Use when the fault was a monitoring error.",
        'gpufleet node dismiss gpu-node-0003 --reason "XID 79 was a test injection"',
    )
)
