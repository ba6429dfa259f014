"""Entry point of the ``gpufleet`` command.

Each command group lives in its own module and is registered here with one
``add_typer`` line, so that groups stay independent of each other.
"""

from __future__ import annotations

import warnings

import typer

from gpufleet.cli import (
    agent_cmd,
    breaker_cmd,
    cleanup_cmd,
    controller_cmd,
    demo_cmd,
    health_cmd,
    image_cmd,
    images_cmd,
    local_cmd,
    maintenance_cmd,
    nodes_cmd,
    policy_cmd,
    provision_cmd,
    sim_cmd,
    slurm_cmd,
    slurm_image_cmd,
    status_cmd,
    version_cmd,
)
from gpufleet.cli.errors import Group

app = typer.Typer(
    name="gpufleet",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=version_cmd.print_version,
        help="Print the version and exit.",
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        help="On an error, print the traceback too (also GPUFLEET_DEBUG=1; accepted anywhere "
        "on the command line).",
    ),
) -> None:
    """Run GPU training clusters on Kubernetes: health checks, remediation, Slurm sync, simulation.

    Listing commands take -o table|wide|json|yaml. Errors: one line and a hint.

    Exit codes: 1 the answer is no, 2 wrong input or refused, 3 no answer (docs/cli.md).

    Example:

        gpufleet nodes --out -o wide
    """


app.add_typer(policy_cmd.app, name="policy")
app.add_typer(slurm_cmd.app, name="slurm")
app.add_typer(slurm_cmd.syncer_app, name="syncer")
app.command("sim")(sim_cmd.sim)
app.add_typer(health_cmd.app, name="health")
app.add_typer(agent_cmd.app, name="agent")
app.add_typer(local_cmd.app, name="local")
local_cmd.app.add_typer(image_cmd.app, name="image")  # gpufleet local image ...
local_cmd.app.add_typer(slurm_image_cmd.app, name="slurm-image")
local_cmd.app.add_typer(images_cmd.app, name="images")  # gpufleet local images ...
app.command("demo")(demo_cmd.demo)
app.command("status")(status_cmd.status)
app.command("controller")(controller_cmd.controller)
app.command("nodes")(nodes_cmd.nodes_table)
app.add_typer(nodes_cmd.node_app, name="node")
app.add_typer(breaker_cmd.app, name="breaker")
app.add_typer(maintenance_cmd.app, name="maintenance")
app.add_typer(provision_cmd.app, name="provision")
app.add_typer(provision_cmd.machines_app, name="machines")
app.command("cleanup")(cleanup_cmd.cleanup)
app.command("version")(version_cmd.version)


def main() -> None:
    """Console-script entry point."""
    # kr8s 0.20 lists Kubernetes 1.28-1.35 and warns on newer servers; the calls we
    # make (core/v1, CRDs, watch, eviction) are stable across them.
    warnings.filterwarnings(
        "ignore", message="Kubernetes version .* is not supported", category=UserWarning
    )
    app()


if __name__ == "__main__":
    main()
