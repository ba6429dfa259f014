"""``gpufleet controller``: run the lifecycle and remediation controller."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from gpufleet.cli import logs
from gpufleet.cli.options import EVENT_NAMESPACE, KubeconfigOpt, VerboseOpt, kubeconfig_arg


def controller(
    kubeconfig: KubeconfigOpt = None,
    namespace: Annotated[
        str,
        typer.Option(
            "--event-namespace",
            "--namespace",
            help="Namespace of its Events about cluster-scoped objects (Nodes, FleetPolicies).",
        ),
    ] = EVENT_NAMESPACE,
    metrics_port: Annotated[
        int, typer.Option(help="Port of the Prometheus /metrics endpoint; 0 turns it off.")
    ] = 29441,
    metrics_address: Annotated[
        str,
        typer.Option(help="Address /metrics listens on (0.0.0.0 for a Prometheus off the host)."),
    ] = "127.0.0.1",
    policy_name: Annotated[str, typer.Option(help="The FleetPolicy object to obey.")] = "default",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and report (Events, logs), change nothing.")
    ] = False,
    peering: Annotated[
        str, typer.Option(help="ClusterKopfPeering shared by replicas; '' runs standalone.")
    ] = "gpufleet",
    priority: Annotated[
        int | None, typer.Option(help="Peering priority (highest acts); default: random.")
    ] = None,
    tick: Annotated[
        float, typer.Option(min=0.1, help="Seconds between retries of held decisions.")
    ] = 2.0,
    verbose: VerboseOpt = False,
) -> None:
    """Run the lifecycle controller: faults -> cordon, drain, remediation ladder, verification.

    Example:

        gpufleet controller --kubeconfig ~/.kube/config --policy-name default --metrics-port 29441
    """
    logs.configure(verbose)
    # Imported here: kopf and the controller take a second to import, which
    # every other gpufleet command would pay at start-up.
    from gpufleet.lifecycle.controller import ControllerSettings
    from gpufleet.lifecycle.operator import RunOptions, run

    settings = ControllerSettings(
        policy_name=policy_name, dry_run=dry_run, tick_s=tick, event_namespace=namespace
    )
    options = RunOptions(
        kubeconfig=kubeconfig_arg(kubeconfig),
        metrics_port=metrics_port,
        metrics_address=metrics_address,
        peering=peering or None,
        priority=priority,
    )
    asyncio.run(run(settings, options))
