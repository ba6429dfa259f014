"""``gpufleet status``: the fleet on one screen, of any cluster or of a local one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer._click.core import ParameterSource

from gpufleet.cli.options import (
    LOCAL_NAME,
    KubeconfigOpt,
    LocalNameOpt,
    RunDirOpt,
    kubeconfig_arg,
    local_cluster,
)
from gpufleet.cli.output import Format, OutputOpt, emit

if TYPE_CHECKING:
    from gpufleet.demo.status import FleetStatus


def status(
    ctx: typer.Context,
    kubeconfig: KubeconfigOpt = None,
    name: LocalNameOpt = LOCAL_NAME,
    run_dir: RunDirOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Nodes by state, nodes out and why, active remediations, Slurm and the circuit
    breaker (-o wide: nothing cut).

    The cluster of the kubeconfig (--kubeconfig, --context, as kubectl) unless --name
    or --run-dir names a local cluster (then Slurm is read with sinfo; on any other
    cluster, from the SlurmCluster objects' status). The demo's cluster is named demo.

    Example:

        gpufleet status --context prod-east -o wide
        gpufleet status --name demo -o yaml
    """
    import asyncio

    from gpufleet.demo import status as fleet_status

    local = any(
        ctx.get_parameter_source(p) is not ParameterSource.DEFAULT for p in ("name", "run_dir")
    )
    if local and kubeconfig is not None:
        from gpufleet.cli.errors import fail

        fail("--kubeconfig reads any cluster, --name/--run-dir a local one: give one of them")
    if local:
        st = fleet_status.gather(local_cluster(name, run_dir))
    else:
        st = asyncio.run(_read(kubeconfig))
    emit(output, fleet_status.to_data(st), lambda wide: fleet_status.render(st, wide=wide))


async def _read(kubeconfig: Path | None) -> FleetStatus:
    """Nodes, NodeRemediations, FleetPolicies and SlurmClusters through the kubeconfig."""
    import time

    from gpufleet.demo import status as fleet_status
    from gpufleet.kubeapi import NODES, KubeApi

    client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
    nodes = (await client.list(NODES)).items
    return fleet_status.summarize(
        nodes,
        await _optional(client, "noderemediations"),
        await _optional(client, "fleetpolicies"),
        now=time.time(),
        slurm_clusters=await _optional(client, "slurmclusters"),
    )


async def _optional(client: Any, plural: str) -> list[dict[str, Any]] | None:
    """The objects of one of gpufleet's kinds; None when it cannot be read (no CRD, or
    RBAC does not allow it): shown as nothing, as the local cluster's screen does."""
    from gpufleet.kubeapi import ApiError, custom

    try:
        return list((await client.list(custom(plural))).items)
    except ApiError as exc:
        if exc.status is None:
            raise
        return None
