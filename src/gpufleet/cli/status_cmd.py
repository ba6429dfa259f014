"""``gpufleet status``: the fleet on one screen."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpufleet.demo import status as fleet_status
from gpufleet.local.cluster import default_run_dir, load_info


def status(
    name: Annotated[str, typer.Option(help="Local cluster name.")] = "demo",
    run_dir: Annotated[Path | None, typer.Option(help="Local cluster run directory.")] = None,
) -> None:
    """Nodes by state, nodes out and why, active remediations, Slurm partitions and the
    circuit breaker, for a local cluster (the one `gpufleet demo --keep` left running).

    Example:

        gpufleet status --name demo
    """
    path = run_dir or default_run_dir(name)
    try:
        info = load_info(path)
    except FileNotFoundError as err:
        Console(stderr=True).print(f"[yellow]{err}[/yellow]")
        raise typer.Exit(1) from err
    fleet_status.render(fleet_status.gather(info), Console(highlight=False))
