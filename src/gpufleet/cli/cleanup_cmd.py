"""``gpufleet cleanup``: take gpufleet off the cluster's Nodes before an uninstall."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufleet.cli import slurm_cmd
from gpufleet.cli.errors import EXIT_NO, fail
from gpufleet.cli.options import KubeconfigOpt, kubeconfig_arg
from gpufleet.cli.output import Format, OutputOpt, print_data, structured
from gpufleet.slurm.errors import SlurmError

# The client (kr8s), the node data model and the Slurm REST client (httpx) are imported
# when the command runs: its --help needs none of them (docs/cli.md, start-up).
if TYPE_CHECKING:
    from gpufleet.lifecycle import uninstall
    from gpufleet.slurm.restapi import SlurmRest


def cleanup(
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace of the workloads to stop.")
    ] = "gpufleet-system",
    stop: Annotated[
        list[str] | None,
        typer.Option(
            "--stop",
            help="A workload to stop first, and wait for (repeatable): deployment/NAME "
            "(scaled to 0) or daemonset/NAME (its pods sent nowhere); every writer of "
            "gpufleet's marks (controller, Slurm syncer and operator, agent).",
        ),
    ] = None,
    stop_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the stopped workloads' pods to go.")
    ] = 120.0,
    selector: Annotated[
        str,
        typer.Option(
            "--selector", "-l", help="Only Nodes with these labels (k=v,...); default: all."
        ),
    ] = "",
    slurmrestd_url: Annotated[
        str,
        typer.Option(
            "--slurmrestd-url",
            help="Also lift gpufleet's Slurm drains (reason 'gpufleet: ...') on the Nodes "
            "released, through this slurmrestd (v0.0.40+, Slurm 23.11 and later).",
        ),
    ] = "",
    jwt_key_file: Annotated[
        Path | None, typer.Option(help="Mint slurmrestd tokens with this HS256 key.")
    ] = None,
    token_file: Annotated[Path | None, typer.Option(help="A token from `scontrol token`.")] = None,
    dra: Annotated[
        bool,
        typer.Option(
            "--dra",
            help="Also delete gpufleet's DRA objects: the agents' ResourceSlices and the "
            "controller's DeviceTaintRules (the chart passes it with dra.enabled).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; change nothing.")
    ] = False,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Before removing gpufleet: stop its controllers and agents, then take its labels,
    annotations, taints, conditions and cordons off every Node it may release.

    With --slurmrestd-url, gpufleet's own Slurm drains on the released Nodes are
    lifted too (a drain on a kept Node, or anyone else's, stays).

    A Node gpufleet holds out of service (faulted, in repair, burn-in, triage or
    RMA, a power action in flight) is kept exactly as it is and named with why:
    handing it back would give work to a broken or unverified machine. Labels
    that identify a machine (pool, Machine, BMC Secret, InfiniBand position) stay.
    The chart runs this as a pre-delete hook; exits 0 with kept Nodes (they are
    reported), 1 when the API refused or the controllers did not stop.

    Example:

        gpufleet cleanup -n gpufleet --dry-run --stop deployment/gpufleet-controller

        gpufleet cleanup -n gpufleet --dra --stop daemonset/gpufleet-agent
    """
    import asyncio

    from gpufleet.slurm.restapi import RestConfig, SlurmRest

    progress: uninstall.Progress = (lambda line: None) if structured(output) else print
    rest = None
    if slurmrestd_url:
        token = slurm_cmd.token_from(token_file, jwt_key_file, "root")
        rest = SlurmRest(RestConfig(slurmrestd_url, "root", token, timeout_s=10.0))
    try:
        report = asyncio.run(
            _run(
                namespace,
                stop or [],
                stop_timeout,
                selector,
                dry_run,
                kubeconfig,
                progress,
                rest,
                dra=dra,
            )
        )
    except TimeoutError as exc:
        fail(
            f"the controllers did not stop: {exc}; no Node was changed",
            hint="look at why their pods stay (kubectl get pods -n NAMESPACE), then run again",
            code=EXIT_NO,
        )
    except SlurmError as exc:
        fail(
            f"the Nodes were cleaned, but gpufleet's Slurm drains were not lifted: {exc}",
            hint="lift them with scontrol update nodename=... state=undrain, or run again",
            code=EXIT_NO,
        )
    if structured(output):
        print_data(output, report.as_json())
        return
    verb = "would release" if dry_run else "released"
    print(
        f"{verb} {len(report.released)} node(s), kept {len(report.kept)}, "
        f"{len(report.untouched)} without gpufleet marks"
        + (f"; Slurm: {len(report.slurm_undrained)} undrained" if rest is not None else "")
    )
    for name, why in sorted(report.kept.items()):
        print(f"kept {name}: {why}", file=sys.stderr)
    for name, why in sorted(report.slurm_kept.items()):
        print(f"kept the Slurm drain of {name}: {why}", file=sys.stderr)


async def _run(
    namespace: str,
    stop: list[str],
    stop_timeout: float,
    selector: str,
    dry_run: bool,
    kubeconfig: Path | None,
    progress: uninstall.Progress,
    rest: SlurmRest | None,
    *,
    dra: bool = False,
) -> uninstall.Report:
    from gpufleet.kubeapi import KubeApi
    from gpufleet.lifecycle import uninstall
    from gpufleet.slurm import uninstall as slurm_uninstall

    client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
    report = uninstall.Report(dry_run=dry_run)
    if stop and not dry_run:
        report.stopped = await uninstall.stop_writers(
            client, namespace, stop, timeout_s=stop_timeout, progress=progress
        )
    await uninstall.release_nodes(
        client, dry_run=dry_run, progress=progress, report=report, selector=selector
    )
    if dra:
        await uninstall.remove_dra(client, dry_run=dry_run, progress=progress, report=report)
    if rest is not None:
        try:
            await rest.connect()
            report.slurm_undrained, report.slurm_kept = await slurm_uninstall.release_drains(
                rest,
                clean={*report.released, *report.untouched},
                kept=report.kept,
                dry_run=dry_run,
                progress=progress,
            )
        finally:
            await rest.aclose()
    return report
