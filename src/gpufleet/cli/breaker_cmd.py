"""``gpufleet breaker reset``: close an open circuit breaker by hand, with an audit trail."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli import operator_cmd
from gpufleet.cli.options import KubeconfigOpt

app = typer.Typer(
    no_args_is_help=True,
    help=(
        "The circuit breaker of the lifecycle controller (FleetPolicy status.breaker): it "
        "opens when too many nodes fault at once and stops automatic disruption."
    ),
)


@app.command("reset")
def reset(
    reason: operator_cmd.ReasonOpt,
    policy: Annotated[
        str,
        typer.Option(
            "--policy-name",
            "--policy",
            help="The FleetPolicy the controller obeys (its --policy-name).",
        ),
    ] = "default",
    kubeconfig: KubeconfigOpt = None,
    no_wait: operator_cmd.NoWaitOpt = False,
    timeout: operator_cmd.TimeoutOpt = 10.0,
    event_namespace: operator_cmd.EventNsOpt = "default",
) -> None:
    """Close the breaker (after you looked: e.g. the "storm" was a monitoring bug).

    The controller closes it, empties its window, saves the FleetPolicy status at once
    and posts an Event on the FleetPolicy naming you and your reason. Faults held while
    it was open stay pending and are retried (dismiss them with gpufleet node dismiss).
    A breaker that tripped again after your request stays open. Exits 1 if refused,
    3 if the controller did not answer in time.

    Example:

        gpufleet breaker reset --reason "XID storm was a broken exporter, fixed in v1.2"
    """
    operator_cmd.breaker_reset(
        policy,
        reason,
        kubeconfig,
        no_wait=no_wait,
        timeout=timeout,
        event_namespace=event_namespace,
    )
