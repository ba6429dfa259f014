"""``gpufleet maintenance``: create, watch, pause, resume and abort MaintenancePlans.

The CLI writes the plan's spec; the lifecycle controller picks the batches, takes the
nodes out through its ordinary decisions and writes the plan's status, which
``list`` and ``show`` read (docs/operations.md, docs/decisions/0110).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gpufleet.api.names import MAINTENANCE_PLAN
from gpufleet.cli.errors import EXIT_NO_ANSWER, fail
from gpufleet.cli.options import KubeconfigOpt, kubeconfig_arg
from gpufleet.cli.output import Column, Format, OutputOpt, emit, show, structured, table
from gpufleet.domain import well_known
from gpufleet.domain.modes import (
    DEFAULT_COMMAND_TIMEOUT_S,
    Action,
    DrainMode,
    RequeueMode,
    Scope,
)
from gpufleet.kubeapi import Conflict, NotFound, custom

# The client (kr8s) and the plan's model are imported by the commands that send or read
# a plan: the commands' --help needs only the choices (docs/cli.md, start-up).

PLANS = custom(MAINTENANCE_PLAN.plural)
DEFAULT_DOMAIN_LABEL = well_known.LABEL_IB_LEAF
"""The plan's default failure domain (the model's, api.maintenanceplan; a test checks)."""
FINAL = frozenset({"Completed", "Stopped", "Aborted"})

app = typer.Typer(
    no_args_is_help=True,
    help=(
        "Rolling maintenance (MaintenancePlan): reimage, reboot, run a node command or "
        "drain-verify-return nodes in batches bounded by the disruption budget and failure domains."
    ),
)

PLAN_COLUMNS = [
    Column("NAME"),
    Column("ACTION"),
    Column("IMAGE"),
    Column("PHASE"),
    Column("PROGRESS", justify="right"),
    Column("FAILED", justify="right"),
    Column("MESSAGE", cut=60),
    Column("SELECTOR", wide=True),
]
NODE_COLUMNS = [
    Column("NODE"),
    Column("PHASE"),
    Column("DOMAIN"),
    Column("IMAGE", wide=True),
    Column("MESSAGE", cut=70),
]


def _summary(body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    return {
        "name": body["metadata"]["name"],
        "action": spec.get("action"),
        "image": spec.get("image"),
        "command": spec.get("command"),
        "selector": spec.get("nodeSelector") or {},
        "maxUnavailable": spec.get("maxUnavailable", 1),
        "maxFailures": spec.get("maxFailures", 1),
        "paused": bool(spec.get("paused")),
        "startAt": spec.get("startAt"),
        "abort": bool(spec.get("abort")),
        "phase": status.get("phase") or "",
        "progress": status.get("progress") or "",
        "total": status.get("total", 0),
        "succeeded": status.get("succeeded", 0),
        "failed": status.get("failed", 0),
        "inProgress": status.get("inProgress", 0),
        "pending": status.get("pending", 0),
        "message": status.get("message") or "",
        "nodes": status.get("nodes") or [],
    }


def _selector(sel: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(sel.items())) or "(every node)"


def _row(s: dict[str, Any]) -> list[str]:
    phase = s["phase"] or "-"
    if s["paused"] and phase == "Progressing":
        phase = "Progressing (pause asked)"
    return [
        s["name"],
        s["action"] or "",
        s["image"] or "",
        phase,
        s["progress"] or "-",
        str(s["failed"]),
        s["message"],
        _selector(s["selector"]),
    ]


async def _list(kubeconfig: Path | None) -> list[dict[str, Any]]:
    from gpufleet.kubeapi import KubeApi

    client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
    return list((await client.list(PLANS)).items)


async def _get(kubeconfig: Path | None, name: str) -> dict[str, Any]:
    from gpufleet.kubeapi import KubeApi

    client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
    try:
        return await client.get(PLANS, name)
    except NotFound:
        fail(f"no MaintenancePlan named {name}", hint="list them with: gpufleet maintenance list")


@app.command("list")
def list_plans(kubeconfig: KubeconfigOpt = None, output: OutputOpt = Format.TABLE) -> None:
    """A table of MaintenancePlans: action, image, phase, nodes finished of all, failed.

    Example:

        gpufleet maintenance list -o wide
    """
    import asyncio

    plans = sorted((_summary(b) for b in asyncio.run(_list(kubeconfig))), key=lambda s: s["name"])
    for s in plans:
        s.pop("nodes")
    emit(
        output,
        {"plans": plans},
        lambda wide: table(PLAN_COLUMNS, [_row(s) for s in plans], wide=wide),
    )


def _bar(s: dict[str, Any]) -> Table:
    total = max(int(s["total"]), 1)
    done = int(s["succeeded"]) + int(s["failed"])
    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        ProgressBar(total=total, completed=done, width=40),
        Text(
            f"{done}/{s['total']} finished: {s['succeeded']} succeeded, {s['failed']} failed, "
            f"{s['inProgress']} in progress, {s['pending']} pending"
        ),
    )
    return grid


def _draw_plan(s: dict[str, Any], wide: bool) -> Group:
    head = Text.assemble(
        (s["name"], "bold"),
        f"  {s['action']}"
        + (f" to {s['image']}" if s["image"] else "")
        + (f" {s['command']}" if s.get("command") else ""),
        f"  on {_selector(s['selector'])}",
        f"  phase {s['phase'] or '-'}" + ("  (paused)" if s["paused"] else ""),
        f"  starts at {s['startAt']}" if s["startAt"] else "",
    )
    rows = [
        [
            n.get("name", ""),
            n.get("phase", ""),
            n.get("domain") or "-",
            n.get("imageVersion") or "",
            n.get("message", ""),
        ]
        for n in s["nodes"]
    ]
    return Group(
        head,
        _bar(s),
        Text(s["message"]),
        table(NODE_COLUMNS, rows, wide=wide),
    )


@app.command("show")
def show_plan(
    name: Annotated[str, typer.Argument(help="The MaintenancePlan.")],
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Redraw every 2 s until the plan is finished."),
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="With --watch: give up after this many seconds.")
    ] = 3600.0,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """One plan: a progress bar, why it waits, and every node's phase.

    With --watch the progress is redrawn until the plan is Completed, Stopped or
    Aborted (exit 3 if --timeout passes first).

    Example:

        gpufleet maintenance show driver-550 --watch
    """
    import asyncio

    s = _summary(asyncio.run(_get(kubeconfig, name)))
    if not watch or structured(output):
        emit(output, s, lambda wide: _draw_plan(s, wide))
        return
    from rich.live import Live

    deadline = time.monotonic() + timeout
    with Live(_draw_plan(s, output is Format.WIDE), refresh_per_second=2) as live:
        while s["phase"] not in FINAL:
            if time.monotonic() >= deadline:
                fail(f"{name} is still {s['phase']} after {timeout:g}s", code=EXIT_NO_ANSWER)
            time.sleep(2.0)
            s = _summary(asyncio.run(_get(kubeconfig, name)))
            live.update(_draw_plan(s, output is Format.WIDE))


def _labels(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(
                f"--selector wants KEY=VALUE, got {pair!r}",
                hint="e.g. --selector gpufleet.io/pool=a100",
            )
        out[key] = value
    return out


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Name of the new MaintenancePlan.")],
    action: Annotated[
        Action,
        typer.Option("--action", case_sensitive=False, help="reimage, reboot, command or noop."),
    ],
    image: Annotated[
        str | None, typer.Option("--image", help="The image version a reimage installs.")
    ] = None,
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help="For --action command: the name of a maintenance command installed on the "
            "nodes (the agent's --maintenance-commands directory).",
        ),
    ] = None,
    command_timeout: Annotated[
        int,
        typer.Option("--command-timeout", help="Seconds the command may run on a node."),
    ] = int(DEFAULT_COMMAND_TIMEOUT_S),
    selector: Annotated[
        list[str] | None,
        typer.Option(
            "--selector", "-l", help="KEY=VALUE node label (repeat for more); none: every node."
        ),
    ] = None,
    max_unavailable: Annotated[
        int, typer.Option("--max-unavailable", help="Nodes out at once (one batch).")
    ] = 1,
    failure_domain_label: Annotated[
        str,
        typer.Option("--failure-domain-label", help="Label naming the rack or leaf."),
    ] = DEFAULT_DOMAIN_LABEL,
    max_per_domain: Annotated[
        int, typer.Option("--max-per-domain", help="Nodes of one failure domain per batch.")
    ] = 1,
    scope: Annotated[
        Scope,
        typer.Option(
            "--scope",
            help="node (batches of nodes) or nvlinkDomain (whole NVLink domains: every tray "
            "drained, the command run once all are empty, all returned together).",
        ),
    ] = Scope.NODE,
    max_domains: Annotated[
        int,
        typer.Option("--max-domains", help="With --scope nvlinkDomain: whole domains at once."),
    ] = 1,
    max_failures: Annotated[
        int, typer.Option("--max-failures", help="Stop once this many nodes failed.")
    ] = 1,
    requeue: Annotated[
        RequeueMode,
        typer.Option("--requeue", help="Slurm jobs: let-finish (wait for them) or now."),
    ] = RequeueMode.LET_FINISH,
    drain_mode: Annotated[
        DrainMode, typer.Option("--drain-mode", help="How pods leave (evict respects PDBs).")
    ] = DrainMode.EVICT,
    paused: Annotated[
        bool, typer.Option("--paused", help="Create it paused (start with: resume).")
    ] = False,
    start_at: Annotated[
        str | None,
        typer.Option(
            "--start-at",
            help="No node starts before this time (RFC 3339 with a zone, e.g. "
            "2026-01-31T02:00:00Z): a maintenance window.",
        ),
    ] = None,
    slurm_reservation: Annotated[
        bool,
        typer.Option(
            "--slurm-reservation/--no-slurm-reservation",
            help="With --start-at: the Slurm syncer reserves the plan's nodes from that time "
            "(gpufleet-maint-NAME), so no job that would still run then starts there.",
        ),
    ] = True,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Create a MaintenancePlan; the lifecycle controller starts its first batch (at
    --start-at, if given).

    Example:

        gpufleet maintenance create image-2024-06 --action reimage --image 2024.06.1 \\
            -l gpufleet.io/pool=h100 --max-unavailable 2 --max-failures 1

    A firmware update that the nodes' agents run (an executable named
    flash-hca-fw in each node's /etc/gpufleet/maintenance.d), one leaf at a time:

        gpufleet maintenance create hca-fw-28.39 --action command --command flash-hca-fw \\
            --command-timeout 1800 --max-unavailable 4

    NVSwitch firmware, one whole NVLink domain at a time (every tray drained first):

        gpufleet maintenance create nvswitch-fw --action command --command nvswitch-fw \\
            --scope nvlinkDomain -l example.com/rack-kind=gb200-nvl72
    """
    import asyncio

    from pydantic import ValidationError

    from gpufleet.api import maintenanceplan as mplan
    from gpufleet.kubeapi import KubeApi

    try:
        spec = mplan.MaintenancePlanSpec(
            node_selector=_labels(selector or []),
            action=action,
            image=image,
            command=command,
            command_timeout_seconds=command_timeout,
            max_unavailable=max_unavailable,
            failure_domain_label=failure_domain_label,
            max_per_domain=max_per_domain,
            scope=scope,
            max_domains=max_domains,
            max_failures=max_failures,
            requeue=requeue,
            drain_mode=drain_mode,
            paused=paused,
            start_at=start_at,
            slurm_reservation=slurm_reservation,
        )
    except ValidationError as exc:
        fail(f"invalid plan: {'; '.join(e['msg'] for e in exc.errors()[:3])}")
    body = mplan.manifest(name, spec)

    async def send() -> dict[str, Any]:
        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
        try:
            return await client.create(PLANS, body)
        except Conflict:
            fail(
                f"a MaintenancePlan named {name} exists",
                hint=f"gpufleet maintenance show {name}, or choose another name",
            )

    created = asyncio.run(send())
    s = _summary(created)
    emit(
        output,
        s,
        lambda wide: Text(
            f"maintenanceplan {name} created: {_row(s)[1]} on {_selector(s['selector'])}"
        ),
    )


def _set(name: str, kubeconfig: Path | None, spec: dict[str, Any], said: str) -> None:
    import asyncio

    async def send() -> None:
        from gpufleet.kubeapi import KubeApi

        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
        try:
            await client.patch(PLANS, name, {"spec": spec})
        except NotFound:
            fail(
                f"no MaintenancePlan named {name}", hint="list them with: gpufleet maintenance list"
            )

    asyncio.run(send())
    show(Text(f"maintenanceplan {name} {said}"))


@app.command("pause")
def pause(
    name: Annotated[str, typer.Argument(help="The MaintenancePlan.")],
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Start no new node; nodes already out finish their cycle.

    Example:

        gpufleet maintenance pause image-2024-06
    """
    _set(name, kubeconfig, {"paused": True}, "paused: no new node starts")


@app.command("resume")
def resume(
    name: Annotated[str, typer.Argument(help="The MaintenancePlan.")],
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Start batches again after a pause (an aborted plan stays aborted).

    Example:

        gpufleet maintenance resume image-2024-06
    """
    _set(name, kubeconfig, {"paused": False}, "resumed")


@app.command("abort")
def abort(
    name: Annotated[str, typer.Argument(help="The MaintenancePlan.")],
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Stop the plan for good: nothing more starts; nodes already out finish.

    A node already out finishes its cycle (verified and returned, or handed to the
    ladder): none is left cordoned.

    Example:

        gpufleet maintenance abort image-2024-06
    """
    _set(name, kubeconfig, {"abort": True}, "aborted: nothing more starts")
