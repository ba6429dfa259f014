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
    controller_cmd,
    demo_cmd,
    health_cmd,
    local_cmd,
    nodes_cmd,
    policy_cmd,
    provision_cmd,
    sim_cmd,
    slurm_cmd,
    status_cmd,
)

app = typer.Typer(
    name="gpufleet",
    help=(
        "Run GPU training clusters on Kubernetes: health checks, remediation, "
        "Slurm sync, simulation."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(policy_cmd.app, name="policy")
app.add_typer(slurm_cmd.app, name="slurm")
app.add_typer(slurm_cmd.syncer_app, name="syncer")
app.command("sim")(sim_cmd.sim)
app.add_typer(health_cmd.app, name="health")
app.add_typer(agent_cmd.app, name="agent")
app.add_typer(local_cmd.app, name="local")
app.command("demo")(demo_cmd.demo)
app.command("status")(status_cmd.status)
app.command("controller")(controller_cmd.controller)
app.command("nodes")(nodes_cmd.nodes_table)
app.add_typer(nodes_cmd.node_app, name="node")
app.add_typer(breaker_cmd.app, name="breaker")
app.add_typer(provision_cmd.app, name="provision")
app.add_typer(provision_cmd.machines_app, name="machines")


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
