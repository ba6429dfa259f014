"""``gpufleet pod-scheduler``: Slurm schedules the Kubernetes pods that ask for it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli import logs
from gpufleet.cli.options import (
    KubeconfigOpt,
    LeaseNamespaceOpt,
    MetricsAddressOpt,
    MetricsPortOpt,
    VerboseOpt,
    kubeconfig_arg,
)
from gpufleet.domain import well_known

log = logging.getLogger("gpufleet.slurm.pod_scheduler")


def pod_scheduler(
    kubeconfig: KubeconfigOpt = None,
    slurm_conf: Annotated[
        Path | None,
        typer.Option(help="slurm.conf of the cluster (SLURM_CONF for sbatch, squeue, scancel)."),
    ] = None,
    slurm_bin_dir: Annotated[
        Path | None,
        typer.Option(help="Where sbatch, squeue, scancel and scontrol are; default: on PATH."),
    ] = None,
    scheduler_name: Annotated[
        str,
        typer.Option(
            help="The spec.schedulerName of the pods this scheduler places. Another name "
            "keeps its own Slurm jobs (their comment says whose) and its own Lease."
        ),
    ] = well_known.POD_SCHEDULER_NAME,
    interval: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds between passes when no pod changes (Slurm starting a job is seen "
            "at the next pass).",
        ),
    ] = 2.0,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Decide and log each action; submit, bind, evict nothing."),
    ] = False,
    leader_election: Annotated[
        bool,
        typer.Option(
            "--leader-election/--no-leader-election",
            help="Act only while holding the Lease (--lease-name): run several replicas, one "
            "acts. --no-leader-election: this process acts alone (one replica only).",
        ),
    ] = True,
    lease_namespace: LeaseNamespaceOpt = "default",
    lease_name: Annotated[
        str, typer.Option(help="The Lease the replicas share; default: gpufleet-pod-scheduler.")
    ] = "",
    metrics_port: MetricsPortOpt = 0,
    metrics_address: MetricsAddressOpt = "127.0.0.1",
    verbose: VerboseOpt = False,
    log_format: logs.LogFormatOpt = logs.LogFormat.TEXT,
) -> None:
    """Let Slurm schedule the pods whose spec.schedulerName is gpufleet-slurm.

    Each pod group (a Job's pods, a JobSet's child Job, a LeaderWorkerSet group, an
    explicit gpufleet.io/pod-group, or a pod alone) becomes one Slurm job asking for one
    node per pod with the pods' GPUs, CPUs and memory; when Slurm runs it, every pod of
    the group is bound to the nodes Slurm allocated, all at once. The job ends when the
    pods end; when Slurm ends the job, the pods are evicted. A group Slurm refuses gets
    PodScheduled=False and an Event. Runs until interrupted (docs/pod-scheduler.md).

    Example:

        gpufleet pod-scheduler --kubeconfig ~/.kube/config \\
            --slurm-conf /etc/slurm/slurm.conf --lease-namespace gpufleet-system \\
            --metrics-port 29443
    """
    import asyncio

    logs.configure(verbose, log_format)
    env = {"SLURM_CONF": str(slurm_conf)} if slurm_conf is not None else {}
    name = lease_name or (
        "gpufleet-pod-scheduler"
        if scheduler_name == well_known.POD_SCHEDULER_NAME
        else f"gpufleet-pod-scheduler-{scheduler_name}"[:63].rstrip("-.")
    )
    asyncio.run(
        _run(
            kubeconfig_arg(kubeconfig),
            env,
            str(slurm_bin_dir or ""),
            scheduler_name,
            interval,
            dry_run,
            (lease_namespace, name) if leader_election else None,
            metrics_port,
            metrics_address,
        )
    )


async def _run(
    kubeconfig: str | None,
    env: dict[str, str],
    bin_dir: str,
    scheduler_name: str,
    interval: float,
    dry_run: bool,
    lease: tuple[str, str] | None,
    metrics_port: int,
    metrics_address: str,
) -> None:
    """The scheduler, its pod watch and (with a lease) the Lease holder, until SIGTERM or
    SIGINT; a held Lease is released on the way out so a standby takes over at once."""
    from gpufleet.cli.service import run_until_signalled
    from gpufleet.kubeapi import SERVICE_IN_FLIGHT, KubeApi
    from gpufleet.kubeapi.leadership import Leadership, default_identity
    from gpufleet.slurm.pod_jobs import PodJobsCli, PodJobsConfig
    from gpufleet.slurm.pod_scheduler import PodScheduler, SchedulerMetrics, SchedulerSettings

    kube = await KubeApi.connect(kubeconfig, max_in_flight=SERVICE_IN_FLIGHT)
    slurm = PodJobsCli(PodJobsConfig(scheduler_name=scheduler_name, bin_dir=bin_dir, env=env))
    identity = default_identity()
    leadership = (
        Leadership(kube, namespace=lease[0], name=lease[1], identity=identity)
        if lease is not None
        else None
    )
    metrics = SchedulerMetrics()
    if metrics_port:
        port = metrics.endpoint.serve(metrics_port, metrics_address)
        log.info("metrics on http://%s:%d/metrics", metrics_address, port)
    scheduler = PodScheduler(
        kube,
        slurm,
        SchedulerSettings(scheduler_name=scheduler_name, interval_s=interval, dry_run=dry_run),
        metrics=metrics,
        may_act=(lambda: leadership.leading) if leadership is not None else (lambda: True),
        identity=identity,
    )
    log.info(
        "scheduling pods with schedulerName %s through Slurm (%s%s)",
        scheduler_name,
        f"lease {lease[0]}/{lease[1]} as {identity}" if lease else "no leader election",
        ", dry run" if dry_run else "",
    )
    try:
        await run_until_signalled(scheduler.run(), leadership, scheduler.wake, log)
    finally:
        metrics.endpoint.stop()
    log.info("stopped")
