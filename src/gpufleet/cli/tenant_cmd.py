"""``gpufleet tenant-controller`` (the loop) and ``gpufleet tenant check FILE`` (offline)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli import logs
from gpufleet.cli.errors import EXIT_NO, fail
from gpufleet.cli.options import (
    KubeconfigOpt,
    LeaseNamespaceOpt,
    MetricsAddressOpt,
    MetricsPortOpt,
    VerboseOpt,
    kubeconfig_arg,
)

log = logging.getLogger("gpufleet.tenants")

app = typer.Typer(
    no_args_is_help=True,
    help="Tenants (Tenant objects): check a Tenant YAML offline before applying it.",
)


@app.command("check")
def check(
    files: Annotated[list[Path], typer.Argument(help="Tenant YAML files (several documents each)")],
) -> None:
    """Validate Tenant YAML offline: every problem with its field, then the conflicts
    among the tenants given (the older keeps a contested namespace, user, uid or account;
    without creationTimestamp the file order decides).

    Exit 0: valid; 1: problems found (printed one a line); 2: a file cannot be read.

    Example:

        gpufleet tenant check vision.yaml nlp.yaml
    """
    import yaml

    from gpufleet.api import tenant as tenant_api
    from gpufleet.domain import tenancy

    found: list[str] = []
    parsed: list[tenancy.Tenant] = []
    for path in files:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            fail(f"{path}: cannot read it: {e}")
        for i, doc in enumerate(docs):
            name = str(((doc or {}).get("metadata") or {}).get("name") or f"document {i + 1}")
            if not isinstance(doc, dict):
                found.append(f"{path}: {name}: not a YAML mapping")
                continue
            problems = tenant_api.problems(doc)
            found.extend(f"{path}: {name}: {p}" for p in problems)
            if not problems:
                t = tenant_api.from_object(doc)
                order = str(len(parsed)).zfill(6)
                parsed.append(
                    t if t.created else tenancy.Tenant(**{**t.__dict__, "created": order})
                )
    for name, why in tenancy.conflicts(parsed).items():
        found.extend(f"tenant {name}: conflict: {w}" for w in why)
    for line in found:
        typer.echo(line)
    if found:
        raise typer.Exit(EXIT_NO)
    typer.echo(f"{len(parsed)} tenant(s) valid")


def tenant_controller(
    kubeconfig: KubeconfigOpt = None,
    interval: Annotated[
        float,
        typer.Option(min=0.5, help="Seconds between passes when nothing changes (reads Slurm)."),
    ] = 10.0,
    role: Annotated[
        str, typer.Option(help="ClusterRole a tenant's users and groups get in its namespaces.")
    ] = "edit",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and log; write nothing but nothing else.")
    ] = False,
    leader_election: Annotated[
        bool,
        typer.Option(
            "--leader-election/--no-leader-election",
            help="Act only while holding the Lease gpufleet-tenant-controller.",
        ),
    ] = True,
    lease_namespace: LeaseNamespaceOpt = "default",
    lease_name: Annotated[
        str, typer.Option(help="The Lease the replicas share (one per release).")
    ] = "gpufleet-tenant-controller",
    slurm_conf: Annotated[
        Path | None,
        typer.Option(
            help="slurm.conf of the cluster (SLURM_CONF for sacctmgr and squeue): the tenants' "
            "Slurm accounts, users, QOS and GPU limits are kept too; absent: Kubernetes only."
        ),
    ] = None,
    slurm_bin_dir: Annotated[
        Path | None,
        typer.Option(help="Where sacctmgr and squeue are; default: on PATH."),
    ] = None,
    metrics_port: MetricsPortOpt = 0,
    metrics_address: MetricsAddressOpt = "127.0.0.1",
    verbose: VerboseOpt = False,
    log_format: logs.LogFormatOpt = logs.LogFormat.TEXT,
) -> None:
    """Run the tenant controller: each Tenant's quota, bindings, policies and Slurm account.

    Writes each Tenant's ResourceQuota, RoleBinding and NetworkPolicy in its namespaces,
    its GPU quota split between Kubernetes and Slurm,
    its status (Ready, Conflict, QuotaBelowUse, Deleting) and, on deletion, quota 0 until
    its work ends, then its objects removed. A limit below use blocks new work only.
    Runs until interrupted (docs/tenants.md).

    Example:

        gpufleet tenant-controller --kubeconfig ~/.kube/config --lease-namespace gpufleet-system \\
            --slurm-conf /etc/slurm/slurm.conf --metrics-port 29445
    """
    import asyncio

    logs.configure(verbose, log_format)
    asyncio.run(
        _run(
            kubeconfig_arg(kubeconfig),
            interval,
            role,
            dry_run,
            (lease_namespace, lease_name) if leader_election else None,
            (slurm_conf, slurm_bin_dir),
            (metrics_address, metrics_port),
        )
    )


async def _run(
    kubeconfig: str | None,
    interval: float,
    role: str,
    dry_run: bool,
    lease: tuple[str, str] | None,
    slurm_at: tuple[Path | None, Path | None],
    metrics_at: tuple[str, int],
) -> None:
    """The loop and (with a lease) the Lease holder, until SIGTERM or SIGINT."""
    from prometheus_client import CollectorRegistry

    from gpufleet.cli.service import run_until_signalled
    from gpufleet.kubeapi import SERVICE_IN_FLIGHT, KubeApi
    from gpufleet.kubeapi.leadership import Leadership, default_identity
    from gpufleet.slurm.associations import SacctmgrAssociations
    from gpufleet.slurm.metrics import Endpoint
    from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig
    from gpufleet.tenants.controller import TenantController, TenantSettings
    from gpufleet.tenants.metrics import TenantMetrics
    from gpufleet.tenants.node_events import NodeEventCopier

    kube = await KubeApi.connect(kubeconfig, max_in_flight=SERVICE_IN_FLIGHT)
    identity = default_identity()
    leadership = (
        Leadership(kube, namespace=lease[0], name=lease[1], identity=identity)
        if lease is not None
        else None
    )
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry)
    endpoint = Endpoint(registry)
    address, port = metrics_at
    if port:
        log.info("metrics on http://%s:%d/metrics", address, endpoint.serve(port, address))
    slurm_conf, slurm_bin_dir = slurm_at
    slurm = (
        SacctmgrAssociations(bin_dir=slurm_bin_dir, env={"SLURM_CONF": str(slurm_conf)})
        if slurm_conf is not None
        else None
    )
    scontrol = (
        ScontrolConfig(
            scontrol=str(slurm_bin_dir / "scontrol") if slurm_bin_dir else "scontrol",
            env={"SLURM_CONF": str(slurm_conf)},
        )
        if slurm_conf is not None
        else None
    )
    log.info(
        "tenant controller (%s; %s%s)",
        f"Slurm through {slurm_conf}" if slurm_conf is not None else "Kubernetes only",
        f"lease {lease[0]}/{lease[1]} as {identity}" if lease else "no leader election",
        ", dry run" if dry_run else "",
    )
    controller = TenantController(
        kube,
        slurm,
        TenantSettings(interval_s=interval, role=role, dry_run=dry_run),
        may_act=(lambda: leadership.leading) if leadership is not None else (lambda: True),
        metrics=metrics,
        node_events=NodeEventCopier(kube, instance=identity, metrics=metrics),
        reservations=Scontrol(scontrol) if scontrol is not None else None,
    )
    try:
        await run_until_signalled(controller.run(), leadership, controller.wake, log)
    finally:
        endpoint.stop()
    log.info("stopped")
