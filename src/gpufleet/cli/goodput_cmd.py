"""``gpufleet goodput``: the ledger of GPU-seconds the trainings lost, per incident and category."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.errors import fail
from gpufleet.cli.options import KubeconfigOpt, kubeconfig_arg
from gpufleet.cli.output import Column, Format, JsonOpt, OutputOpt, chosen, emit, table

if TYPE_CHECKING:
    from rich.console import RenderableType

    from gpufleet.domain.goodput import Ledger

_CATEGORY_COLUMNS = ("DETECTION", "ISOLATION", "RECOVERY", "REDONE", "DEGRADED")


def goodput(
    telemetry: Annotated[
        Path,
        typer.Option(
            envvar="GPUFLEET_TELEMETRY_DIR",
            help="The job telemetry directory (<job>.<run>/rank-<rank>.<node>.jsonl).",
        ),
    ],
    remediations: Annotated[
        Path | None,
        typer.Option(
            help="NodeRemediations from a file (kubectl get nrem -o json) instead of the "
            "cluster of the kubeconfig."
        ),
    ] = None,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Format.TABLE,
    as_json: JsonOpt = False,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG: trainings' GPU-hours, incidents' cost.")
    ] = None,
    write_status: Annotated[
        bool,
        typer.Option("--write-status", help="Write status.goodput on each closed NodeRemediation."),
    ] = False,
    serve: Annotated[
        int | None,
        typer.Option(
            help="Keep running: serve the gpufleet_goodput_* metrics on this port (0: any) "
            "and recompute every --every seconds.",
            min=0,
        ),
    ] = None,
    every: Annotated[
        float, typer.Option(min=1.0, help="Seconds between passes with --serve.")
    ] = 60.0,
    metrics_address: Annotated[
        str, typer.Option(help="The address --serve listens on.")
    ] = "0.0.0.0",
) -> None:
    """The goodput ledger: every GPU-second a training lost, per incident and category.

    Reads the job telemetry and the NodeRemediations, and charges each lost
    GPU-second once: detection, isolation, recovery, redone or degraded
    (docs/goodput.md). -o json prints every figure; --plot draws it.

    Example:

        gpufleet goodput --telemetry /shared/telemetry --remediations nrem.json --plot g.png

        gpufleet goodput --telemetry /shared/telemetry --write-status --serve 29444
    """
    import asyncio

    from gpufleet.lifecycle import goodput as live

    fmt = chosen(output, as_json)
    if remediations is not None and (write_status or serve is not None):
        fail("--write-status and --serve work on the cluster: drop --remediations")
    if not telemetry.is_dir():
        fail(f"{telemetry}: no such directory", hint="give the job telemetry directory")
    if remediations is not None:
        try:
            docs = live.documents_from_file(remediations)
        except (OSError, ValueError) as exc:
            fail(f"{remediations}: {exc}")
        led = live.compute(telemetry, docs)
    else:
        led = asyncio.run(
            _from_cluster(kubeconfig, telemetry, write_status, (serve, metrics_address), every)
        )
    if plot is not None:
        from gpufleet.lifecycle.goodput_plot import write_plot

        write_plot(plot, led)
    emit(fmt, live.to_data(led), lambda wide: _render(led, wide))


async def _from_cluster(
    kubeconfig: Path | None,
    telemetry: Path,
    write: bool,
    listen: tuple[int | None, str],
    every: float,
) -> Ledger:
    from gpufleet.kubeapi import KubeApi
    from gpufleet.lifecycle import goodput as live

    client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
    serve, address = listen
    if serve is None:
        return await live.run(client, telemetry, every=every, metrics=None, write=write, passes=1)
    metrics = live.Metrics()
    port = metrics.serve(serve, address)
    typer.echo(f"gpufleet goodput: /metrics on port {port}", err=True)
    return await live.run(client, telemetry, every=every, metrics=metrics, write=write)


def _gpu_h(seconds: float) -> str:
    return f"{seconds / 3600:.3f}"


def _render(led: Ledger, wide: bool) -> list[RenderableType]:
    from gpufleet.domain.goodput import CATEGORIES

    cats = [Column(c, justify="right") for c in _CATEGORY_COLUMNS]
    trainings = table(
        [
            "TRAINING",
            Column("RANKS", justify="right"),
            Column("GROUPS", justify="right"),
            Column("ALLOCATED GPU-H", justify="right"),
            Column("GOODPUT", justify="right"),
            *cats,
        ],
        [
            [
                t.training,
                str(t.ranks),
                str(t.groups),
                _gpu_h(t.allocated),
                f"{t.goodput * 100:.2f}%",
                *(_gpu_h(t.lost[c]) for c in CATEGORIES),
            ]
            for t in led.trainings
        ],
        wide=wide,
        title="Trainings (lost GPU-hours per category)",
    )
    rows: list[Any] = [r for r in led.incidents if wide or r.total > 0]
    incidents = table(
        [
            "NODEREMEDIATION",
            "NODE",
            "FAULT",
            Column("TRAININGS", wide=True),
            Column("LOST GPU-H", justify="right"),
            *cats,
        ],
        [
            [
                r.incident.name,
                r.incident.node,
                r.incident.fault,
                ",".join(r.trainings) or "-",
                _gpu_h(r.total),
                *(_gpu_h(r.lost[c]) for c in CATEGORIES),
            ]
            for r in rows
        ],
        wide=wide,
        title="Incidents that cost GPU-hours (-o wide: every incident)",
    )
    lost = sum(led.lost.values())
    summary = (
        f"fleet: {len(led.trainings)} training(s), {_gpu_h(led.allocated)} GPU-h allocated, "
        f"goodput {led.goodput * 100:.2f}%, {_gpu_h(lost)} GPU-h lost"
    )
    return [trainings, incidents, summary]
