"""``gpufleet status``: the fleet on one screen, of any cluster or of a local one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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
    from gpufleet.demo.tenant_status import TenantStatus


def status(
    ctx: typer.Context,
    kubeconfig: KubeconfigOpt = None,
    name: LocalNameOpt = LOCAL_NAME,
    run_dir: RunDirOpt = None,
    output: OutputOpt = Format.TABLE,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            help="One tenant's share instead: its GPUs and quota, its nodes, the incidents "
            "that touched its work and their goodput (docs/tenants.md).",
        ),
    ] = None,
) -> None:
    """Nodes by state, nodes out and why, active remediations, Slurm and the circuit
    breaker (-o wide: nothing cut).

    With --tenant NAME, one tenant's share instead: its GPUs and quota, its nodes, and the
    incidents that touched its work with what the goodput ledger charged to them.

    The cluster of the kubeconfig (--kubeconfig, --context, as kubectl) unless --name
    or --run-dir names a local cluster (then Slurm is read with sinfo; on any other
    cluster, from the SlurmCluster objects' status). The demo's cluster is named demo.

    Example:

        gpufleet status --context prod-east -o wide
        gpufleet status --name demo -o yaml
        gpufleet status --tenant vision
    """
    import asyncio

    from gpufleet.demo import status as fleet_status

    local = any(
        ctx.get_parameter_source(p) is not ParameterSource.DEFAULT for p in ("name", "run_dir")
    )
    if local and kubeconfig is not None:
        from gpufleet.cli.errors import fail

        fail("--kubeconfig reads any cluster, --name/--run-dir a local one: give one of them")
    if tenant is not None:
        from gpufleet.demo import tenant_status

        config = (
            str(local_cluster(name, run_dir).kubeconfig) if local else kubeconfig_arg(kubeconfig)
        )
        one = asyncio.run(_read_tenant(config, tenant))
        emit(output, tenant_status.to_data(one), lambda wide: tenant_status.render(one, wide=wide))
        return
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


async def _read_tenant(kubeconfig: str | None, name: str) -> TenantStatus:
    """The Tenant, its namespaces' pods and Events, the Nodes and NodeRemediations."""
    from gpufleet.cli.errors import fail
    from gpufleet.demo import tenant_status
    from gpufleet.domain import tenancy
    from gpufleet.kubeapi import EVENTS, NODES, PODS, ApiError, KubeApi, NotFound, custom

    client = await KubeApi.connect(kubeconfig)
    try:
        tenant = await client.get(custom("tenants"), name)
    except NotFound:
        fail(f"no Tenant {name} (kubectl get tenants)")
    namespaces = [str(n) for n in (tenant.get("spec") or {}).get("namespaces") or []]
    pods: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for ns in namespaces:
        pods.extend((await client.list(PODS, namespace=ns)).items)
        events.extend(
            (
                await client.list(
                    EVENTS, namespace=ns, label_selector=f"{tenancy.LABEL_TENANT}={name}"
                )
            ).items
        )
    try:
        nodes = list((await client.list(NODES)).items)
    except ApiError as exc:
        if exc.status is None:
            raise
        nodes = []  # a tenant's user may not read Nodes: its pods' nodes are still shown
    return tenant_status.summarize(
        tenant, nodes, pods, events, await _optional(client, "noderemediations")
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
