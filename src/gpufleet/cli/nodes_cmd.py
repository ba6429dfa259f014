"""``gpufleet nodes`` and ``gpufleet node NAME``: which nodes are out, why, since when;
``gpufleet node VERB NAME --reason ...``: a person's request to the lifecycle controller."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import RenderableType
from rich.text import Text
from typer.core import TyperGroup

from gpufleet.cli import operator_cmd
from gpufleet.cli.errors import fail
from gpufleet.cli.options import KubeconfigOpt, kubeconfig_arg
from gpufleet.cli.output import Column, Format, OutputOpt, emit, table
from gpufleet.domain import conditions, well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.kubeapi import NODES, NotFound, custom

# The client (kr8s), the node records (the policy models) and the CRDs are imported by
# the functions that read nodes: the commands' --help needs none of them (docs/cli.md).
if TYPE_CHECKING:
    from gpufleet.domain import lemon
    from gpufleet.domain.records import Incident


def _ago(t: float, now: float) -> str:
    s = max(0, int(now - t))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _when(t: float | None) -> str | None:
    return None if t is None else rfc3339(t)


async def _list(kubeconfig: Path | None) -> list[dict[str, Any]]:
    from gpufleet.kubeapi import KubeApi

    client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
    return (await client.list(NODES)).items


def _cordon(body: dict[str, Any]) -> str:
    """``no``, ``gpufleet`` or ``other`` (a cordon gpufleet did not set: left alone)."""
    if not (body.get("spec") or {}).get("unschedulable"):
        return "no"
    ann = body["metadata"].get("annotations") or {}
    return (
        "gpufleet" if ann.get(well_known.ANNOTATION_CORDONED) == well_known.CONTROLLER else "other"
    )


def _incident(inc: Incident | None) -> dict[str, Any] | None:
    if inc is None:
        return None
    return {
        "key": inc.key,
        "description": inc.description,
        "openedAt": _when(inc.opened_at),
        "plan": None if inc.plan is None else str(inc.plan),
        "currentStep": None if inc.current is None else str(inc.current),
        "steps": [
            {
                "step": str(a.step),
                "attempt": a.attempt,
                "startedAt": _when(a.started_at),
                "endedAt": _when(a.ended_at),
                "outcome": None if a.outcome is None else str(a.outcome),
                "detail": a.detail,
            }
            for a in inc.tried
        ],
    }


def lemon_summary(score: lemon.LemonScore | None, now: float) -> dict[str, Any] | None:
    """The lemon score decayed to ``now``: the node's and its GPUs' (highest first)."""
    if score is None:
        return None
    s = score.now(now)
    gpus = sorted(s.gpus.items(), key=lambda kv: (-kv[1], kv[0]))
    return {"score": round(s.node, 2), "gpus": {k: round(v, 2) for k, v in gpus}}


def _lemon_cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    worst = next(iter(summary["gpus"].items()), None)
    cell = f"{summary['score']:.2f}"
    return cell if worst is None else f"{cell} ({worst[0]} {worst[1]:.2f})"


def node_summary(body: dict[str, Any], now: float) -> dict[str, Any]:
    """One row of ``gpufleet nodes`` as data (what -o json and -o yaml print)."""
    from gpufleet.lifecycle import nodes

    record, new = nodes.record_of(body, now)
    inc = record.incident
    step = None
    if inc is not None and inc.current is not None and inc.tried:
        step = {"step": str(inc.current), "attempt": inc.tried[-1].attempt}
    return {
        "name": record.name,
        "state": record.state.value,
        "managed": not new,
        "since": _when(record.since),
        "reason": record.reason,
        "step": step,
        "incident": None if inc is None else inc.key,
        "cordoned": _cordon(body),
        "pool": record.pool,
        "lemon": lemon_summary(record.lemon, now),
        "spare": record.is_spare,
    }


NODE_COLUMNS = (
    Column("NODE"),
    Column("STATE"),
    Column("SINCE"),
    Column("REASON", cut=80),
    Column("STEP"),
    Column("LEMON"),
    Column("INCIDENT", wide=True),
    Column("CORDONED", wide=True),
    Column("POOL", wide=True),
    Column("CHANGED", wide=True),
)


def _node_cells(row: dict[str, Any], since: float) -> list[str]:
    step = row["step"]
    return [
        row["name"],
        row["state"]
        + (" (spare)" if row["spare"] else "")
        + ("" if row["managed"] else " (unmanaged)"),
        _ago(since, time.time()),
        row["reason"],
        "-" if step is None else f"{step['step']} (attempt {step['attempt']})",
        _lemon_cell(row["lemon"]),
        row["incident"] or "-",
        row["cordoned"],
        row["pool"],
        row["since"] or "-",
    ]


def nodes_table(
    kubeconfig: KubeconfigOpt = None,
    out: Annotated[bool, typer.Option("--out", help="Only nodes not in production.")] = False,
    output: OutputOpt = Format.TABLE,
) -> None:
    """A table of nodes: state (``production (spare)`` for a hot spare), since when, why,
    the current remediation step and the lemon score (decayed to now, with the worst
    GPU's; -o wide adds the incident, the cordon, the pool and the time of the change).

    Example:

        gpufleet nodes --kubeconfig ~/.kube/config --out -o wide
    """
    import asyncio

    from gpufleet.lifecycle import nodes

    now = time.time()
    rows: list[tuple[dict[str, Any], float]] = []
    for body in sorted(asyncio.run(_list(kubeconfig)), key=nodes.name_of):
        record, _ = nodes.record_of(body, now)
        if out and record.state.value == "production":
            continue
        rows.append((node_summary(body, now), record.since))
    emit(
        output,
        {"nodes": [row for row, _ in rows]},
        lambda wide: table(NODE_COLUMNS, [_node_cells(r, t) for r, t in rows], wide=wide),
    )


async def _detail(kubeconfig: Path | None, name: str) -> tuple[dict[str, Any], list[Any]]:
    from gpufleet.kubeapi import KubeApi
    from gpufleet.lifecycle import crds

    client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
    try:
        body = await client.get(NODES, name)
    except NotFound:
        fail(f"no Node named {name}", hint="list them with: gpufleet nodes")
    listing = await client.list(
        custom(crds.NODE_REMEDIATION_PLURAL), label_selector=f"gpufleet.io/node={name}"
    )
    return body, listing.items


def node_detail_data(body: dict[str, Any], rems: list[Any], now: float) -> dict[str, Any]:
    """``gpufleet node NAME`` as data (what -o json and -o yaml print)."""
    from gpufleet.lifecycle import nodes

    record, new = nodes.record_of(body, now)
    evidence = []
    for cond in nodes.node_conditions(body):
        ctype = str(cond.get("type"))
        if conditions.subsystem_of(ctype) is None and ctype != well_known.CONDITION_REQUEST:
            continue
        evidence.append(
            {
                "type": ctype,
                "status": str(cond.get("status")),
                "reason": str(cond.get("reason", "")),
                "message": str(cond.get("message", "")).split(" | evidence: ")[0],
            }
        )
    return {
        "name": record.name,
        "state": record.state.value,
        "managed": not new,
        "since": _when(record.since),
        "reason": record.reason,
        "cordoned": _cordon(body),
        "taints": [
            {"key": t.get("key"), "effect": t.get("effect")}
            for t in (body.get("spec") or {}).get("taints") or []
        ],
        "history": [
            {
                "at": _when(t.at),
                "from": str(t.source),
                "to": str(t.target),
                "trigger": str(t.trigger),
                "reason": t.reason,
            }
            for t in record.history
        ],
        "incident": _incident(record.incident),
        "lemon": lemon_summary(record.lemon, now),
        "conditions": evidence,
        "ticket": _ticket(body),
        "remediations": [
            {
                "name": r["metadata"]["name"],
                "fault": r["spec"].get("fault", ""),
                "phase": str((r.get("status") or {}).get("phase", "")),
                "outcome": (r.get("status") or {}).get("outcome"),
            }
            for r in rems
        ],
    }


def _ticket(body: dict[str, Any]) -> dict[str, Any] | None:
    """The node's RMA ticket as the controller records it (docs/operations.md, RMA tickets)."""
    from gpufleet.domain import rma

    ann = (body.get("metadata") or {}).get("annotations") or {}
    t = rma.decode_ticket(ann.get(well_known.ANNOTATION_RMA_TICKET))
    if t is None:
        return None
    return {
        "key": t.key,
        "state": t.state.value,
        "ticketId": t.ticket_id,
        "attempts": t.attempts,
        "nextAttempt": _when(t.next_at) if t.next_at else None,
        "lastError": t.last_error or None,
        "evidence": t.evidence,
        "closeRequested": well_known.ANNOTATION_RMA_CLOSE in ann,
    }


def _ticket_text(t: dict[str, Any]) -> str:
    text = f"RMA ticket: {t['key']} {t['state']}"
    if t["ticketId"]:
        text += f" (ticket {t['ticketId']})"
    if t["state"] in ("opening", "updating", "closing") and t["attempts"]:
        text += f", {t['attempts']} attempts, next {t['nextAttempt'] or 'now'}"
    if t["lastError"]:
        text += f", last error: {t['lastError']}"
    if t["evidence"]:
        text += f", evidence: configmap {t['evidence']}"
    return text


_CORDON_TEXT = {"no": "no", "gpufleet": "yes (gpufleet)", "other": "yes (not gpufleet: left alone)"}


def _draw_detail(d: dict[str, Any], wide: bool) -> list[RenderableType]:
    out: list[RenderableType] = [
        Text.assemble((d["name"], "bold"), f"  state {d['state']}  since {d['since'] or '-'}"),
        Text(f"reason: {d['reason']}"),
    ]
    if not d["managed"]:
        out.append(Text("(gpufleet has not written a record for this node yet)"))
    taints = ", ".join(f"{t['key']}:{t['effect']}" for t in d["taints"]) or "none"
    out.append(Text(f"cordoned: {_CORDON_TEXT[d['cordoned']]}   taints: {taints}"))
    lem = d["lemon"]
    if lem is not None:
        gpus = ", ".join(f"{k} {v:.2f}" for k, v in lem["gpus"].items()) or "none"
        out.append(Text(f"lemon score: {lem['score']:.2f}   GPUs: {gpus}"))
    out.append(
        table(
            ("WHEN", "FROM", "TO", "TRIGGER", Column("REASON", cut=70)),
            [(h["at"] or "-", h["from"], h["to"], h["trigger"], h["reason"]) for h in d["history"]],
            wide=wide,
            title="History",
        )
    )
    inc = d["incident"]
    if inc is not None:
        out.append(Text(f"incident: {inc['key']} ({inc['description']}), plan {inc['plan']}"))
        out.append(
            table(
                ("STEP", "ATTEMPT", "STARTED", "ENDED", "OUTCOME", Column("DETAIL", cut=60)),
                [
                    (
                        a["step"],
                        str(a["attempt"]),
                        a["startedAt"] or "-",
                        a["endedAt"] or "-",
                        a["outcome"] or "running",
                        a["detail"],
                    )
                    for a in inc["steps"]
                ],
                wide=wide,
            )
        )
    out.append(
        table(
            ("CONDITION", "STATUS", "REASON", Column("EVIDENCE", cut=90)),
            [(c["type"], c["status"], c["reason"], c["message"]) for c in d["conditions"]],
            wide=wide,
            title="Conditions",
        )
    )
    if d["ticket"] is not None:
        out.append(Text(_ticket_text(d["ticket"])))
    if d["remediations"]:
        out.append(
            table(
                ("NODEREMEDIATION", "FAULT", "PHASE", "OUTCOME"),
                [
                    (r["name"], r["fault"], r["phase"], str(r["outcome"] or "-"))
                    for r in d["remediations"]
                ],
                wide=wide,
                title="Incidents",
            )
        )
    return out


def node_detail(
    name: Annotated[str, typer.Argument(help="Node name.")],
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """One node's history and evidence: transitions, the incident and its steps, conditions,
    and its RMA ticket (state, the receiver's id, attempts, the evidence ConfigMap).

    Example:

        gpufleet node gpu-node-0003 -o yaml
    """
    import asyncio

    body, rems = asyncio.run(_detail(kubeconfig, name))
    data = node_detail_data(body, rems, time.time())
    emit(output, data, lambda wide: _draw_detail(data, wide))


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
