"""``gpufleet syncer`` and ``gpufleet slurm``: the Slurm syncer, operator and config tools."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli import logs
from gpufleet.cli.errors import fail
from gpufleet.cli.options import KubeconfigOpt, VerboseOpt, kubeconfig_arg
from gpufleet.cli.output import Format, OutputOpt

# The models, the Slurm clients (httpx) and yaml are imported by the commands that use
# them: `gpufleet slurm --help` and each command's help need only the names (docs/cli.md).
if TYPE_CHECKING:
    from gpufleet.slurm.restapi import SlurmRest
    from gpufleet.slurm.scontrol import Scontrol
    from gpufleet.slurm.writes import SlurmWrites

app = typer.Typer(
    help="Slurm on Kubernetes: render configs, print the CRD, run the operator.",
    no_args_is_help=True,
)
syncer_app = typer.Typer(
    help="The Kubernetes <-> Slurm syncer (drains, resumes, requeues, lends nodes).",
    no_args_is_help=True,
)


def _logging(verbose: bool, log_format: logs.LogFormat) -> None:
    logs.configure(verbose, log_format)


def token_from(token_file: Path | None, jwt_key_file: Path | None, user: str) -> str:
    """A slurmrestd token: read from a file, minted with the JWT key, or $SLURM_JWT."""
    if token_file is not None:
        return token_file.read_text().strip().removeprefix("SLURM_JWT=")
    if jwt_key_file is not None:
        from gpufleet.domain import slurm_jwt

        key = jwt_key_file.read_bytes()
        return slurm_jwt.mint(key, issued_at=time.time(), user=user, lifespan_s=30 * 24 * 3600)
    env = os.environ.get("SLURM_JWT")
    if env:
        return env
    raise typer.BadParameter("give --token-file, --jwt-key-file or set SLURM_JWT")


def _clients(
    url: str, user: str, token: str, slurm_conf: Path | None
) -> tuple[SlurmRest, Scontrol, SlurmWrites]:
    """The REST client, scontrol (requeues, reservations) and the writes (by REST from
    v0.0.40, else scontrol)."""
    from gpufleet.slurm.restapi import RestConfig, SlurmRest
    from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig
    from gpufleet.slurm.writes import SlurmWrites

    env = {"SLURM_JWT": token}
    if slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm_conf)
    rest = SlurmRest(RestConfig(url, user, token))
    scontrol = Scontrol(ScontrolConfig(env=env))
    return rest, scontrol, SlurmWrites(rest, scontrol)


@syncer_app.command("run")
def run_syncer(
    slurmrestd_url: str = typer.Option(..., "--slurmrestd-url", help="e.g. http://slurm-rest:6820"),
    kubeconfig: KubeconfigOpt = None,
    slurm_conf: Path | None = typer.Option(None, help="slurm.conf for scontrol (SLURM_CONF)."),
    jwt_key_file: Path | None = typer.Option(None, help="Mint tokens with this HS256 key."),
    token_file: Path | None = typer.Option(None, help="A token from `scontrol token`."),
    slurm_user: str = typer.Option("root", help="X-SLURM-USER-NAME and token user."),
    poll_interval: float = typer.Option(1.0, help="Seconds between Slurm polls."),
    node_selector: str = typer.Option("", help="Manage only Nodes with these labels (k=v,...)."),
    preempt_priority: int | None = typer.Option(
        None, help="Lend Slurm nodes to Pods with at least this priority (off when unset)."
    ),
    hold_taint: bool = typer.Option(True, help="Taint managed nodes gpufleet.io/slurm=held."),
    dry_run: bool = typer.Option(False, help="Decide and log; write nothing."),
    reservation_interval: float = typer.Option(
        15.0,
        help="Seconds between passes over the Slurm maintenance reservations that "
        "MaintenancePlans with a start time want (0: off).",
    ),
    gpu_hold_interval: float = typer.Option(
        5.0,
        help="Seconds between passes over the holder jobs that keep quarantined GPUs out of "
        "Slurm's scheduling (0: off).",
    ),
    notice_grace: float = typer.Option(
        30.0,
        help="Seconds a job whose comment holds gpufleet.io/notice has, after SIGUSR1 on its "
        "steps, to leave a node gpufleet takes before it is requeued all the same (0: no "
        "notices, every job requeued at once).",
    ),
    policy_file: Path | None = typer.Option(
        None,
        "--policy",
        help="Policy YAML whose slurm.reasons judge drains set by others "
        "(default: the built-in policy; give the FleetPolicy's spec).",
    ),
    metrics_port: int = typer.Option(
        0, help="Port of the Prometheus /metrics endpoint; 0 (the default) turns it off."
    ),
    metrics_address: str = typer.Option(
        "127.0.0.1", help="Address /metrics listens on (0.0.0.0 for a Prometheus off the host)."
    ),
    verbose: VerboseOpt = False,
    log_format: logs.LogFormatOpt = logs.LogFormat.TEXT,
) -> None:
    """Run the syncer until interrupted.

    Example:

        gpufleet syncer run --slurmrestd-url http://127.0.0.1:6820 \\
            --jwt-key-file /etc/slurm/jwt/jwt_hs256.key --slurm-conf /etc/slurm/slurm.conf \\
            --preempt-priority 1000000 --metrics-port 29442 --notice-grace 30
    """
    import asyncio

    from gpufleet.cli.policy_cmd import load_or_exit
    from gpufleet.kubeapi import SERVICE_IN_FLIGHT, KubeApi
    from gpufleet.slurm.gpu_holds import CliConfig, SlurmCli
    from gpufleet.slurm.metrics import SyncerMetrics
    from gpufleet.slurm.syncer import Syncer, SyncSettings

    _logging(verbose, log_format)
    token = token_from(token_file, jwt_key_file, slurm_user)
    settings = SyncSettings(
        poll_interval_s=poll_interval,
        node_selector=node_selector,
        hold_taint=hold_taint,
        preempt_priority=preempt_priority,
        dry_run=dry_run,
        reservation_interval_s=reservation_interval,
        gpu_hold_interval_s=gpu_hold_interval,
        notice_grace_s=notice_grace,
        reasons=load_or_exit(policy_file).slurm,
    )

    metrics = SyncerMetrics()
    if metrics_port:
        port = metrics.endpoint.serve(metrics_port, metrics_address)
        logging.getLogger("gpufleet.slurm.syncer").info(
            "metrics on http://%s:%d/metrics", metrics_address, port
        )

    async def main() -> None:
        kube = await KubeApi.connect(kubeconfig_arg(kubeconfig), max_in_flight=SERVICE_IN_FLIGHT)
        rest, scontrol, writes = _clients(slurmrestd_url, slurm_user, token, slurm_conf)
        syncer = Syncer(
            kube=kube,
            rest=rest,
            scontrol=writes,
            settings=settings,
            metrics=metrics,
            reservations=scontrol,
            gpu_holds=SlurmCli(CliConfig(env=scontrol.config.env)),
        )
        await syncer.run()

    try:
        asyncio.run(main())
    finally:
        metrics.endpoint.stop()


@app.command("operator")
def run_operator(
    kubeconfig: KubeconfigOpt = None,
    slurmrestd_url: str | None = typer.Option(None, help="For nodes-by-state in status."),
    slurm_conf: Path | None = typer.Option(None, help="slurm.conf for scontrol reconfigure."),
    jwt_key_file: Path | None = typer.Option(None, help="Mint tokens with this HS256 key."),
    conf_dir: Path | None = typer.Option(None, help="Also write rendered files here."),
    reconfigure: bool = typer.Option(
        True,
        help="Run scontrol reconfigure after a change. --no-reconfigure where slurmctld "
        "reloads by itself once the new files reach it (the chart's reconfigure container).",
    ),
    interval: float = typer.Option(5.0, help="Seconds between reconcile passes."),
    slurmd_daemonset: str | None = typer.Option(
        None,
        help="NAMESPACE/NAME of the slurmd DaemonSet (updateStrategy OnDelete) whose outdated "
        "pods the operator replaces: drain, wait for the node's jobs, delete, resume "
        "(needs --slurmrestd-url; unset: no roll).",
    ),
    slurmd_max_unavailable: int = typer.Option(
        1, min=1, help="Nodes out of service for the slurmd roll at once."
    ),
    dry_run: bool = typer.Option(False, help="Log the slurmd roll's steps; do none of them."),
    verbose: VerboseOpt = False,
    log_format: logs.LogFormatOpt = logs.LogFormat.TEXT,
) -> None:
    """Run the SlurmCluster operator until interrupted.

    Example:

        gpufleet slurm operator --slurmrestd-url http://slurm-rest:6820 \\
            --jwt-key-file /etc/slurm/jwt/jwt_hs256.key --no-reconfigure \\
            --slurmd-daemonset slurm/gpufleet-slurmd --slurmd-max-unavailable 2
    """
    import asyncio

    from gpufleet.kubeapi import KubeApi
    from gpufleet.slurm.operator import ClusterOperator, OperatorSettings
    from gpufleet.slurm.slurmd_roll import RollSettings, SlurmdRoll

    _logging(verbose, log_format)
    roll_settings = None
    if slurmd_daemonset:
        namespace, sep, name = slurmd_daemonset.partition("/")
        if not sep or not namespace or not name or not slurmrestd_url:
            raise typer.BadParameter(
                "--slurmd-daemonset NAMESPACE/NAME, with --slurmrestd-url (the roll reads Slurm)"
            )
        roll_settings = RollSettings(
            namespace, name, max_unavailable=slurmd_max_unavailable, dry_run=dry_run
        )

    async def main() -> None:
        kube = await KubeApi.connect(kubeconfig_arg(kubeconfig))
        rest = writes = roll = None
        if slurmrestd_url:
            token = token_from(None, jwt_key_file, "root")
            rest, _, writes = _clients(slurmrestd_url, "root", token, slurm_conf)
            if roll_settings is not None:
                roll = SlurmdRoll(kube=kube, rest=rest, writes=writes, settings=roll_settings)
        op = ClusterOperator(
            kube=kube,
            scontrol=writes,
            rest=rest,
            settings=OperatorSettings(
                interval_s=interval, conf_dir=conf_dir, reconfigure=reconfigure
            ),
            roll=roll,
        )
        await op.run()

    asyncio.run(main())


@app.command("render")
def render_cmd(
    cluster: Path = typer.Argument(..., help="A SlurmCluster YAML (the whole object or its spec)."),
    nodes: Path = typer.Option(
        ..., help="Nodes as JSON/YAML: `kubectl get nodes -o json` output or a list of Nodes."
    ),
    out: Path | None = typer.Option(None, help="Write the files here instead of printing."),
) -> None:
    """Render slurm.conf, gres.conf and topology.conf without a cluster.

    Example:

        kubectl get nodes -o json > nodes.json
        gpufleet slurm render examples/slurmcluster.yaml --nodes nodes.json --out /tmp/conf
    """
    import yaml

    from gpufleet.api import slurmcluster
    from gpufleet.slurm import render

    doc = yaml.safe_load(cluster.read_text())
    spec = slurmcluster.SlurmClusterSpec.model_validate(doc.get("spec", doc))
    raw = yaml.safe_load(nodes.read_text())
    items = raw.get("items", []) if isinstance(raw, dict) else raw
    infos = [render.node_info(n) for n in items]
    pools = render.assign(spec, infos)
    data = render.render_all(spec, [n for m in pools.values() for n in m])
    if out is None:
        for name, text in data.items():
            typer.echo(f"# ---- {name}")
            typer.echo(text, nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, text in data.items():
        (out / name).write_text(text)
    typer.echo(f"wrote {', '.join(sorted(data))} to {out} (hash {render.config_hash(data)})")


@app.command("crd")
def crd_cmd(
    output: OutputOpt = Format.YAML,
) -> None:
    """Print the SlurmCluster CustomResourceDefinition (generated from the spec model).

    Example:

        gpufleet slurm crd | kubectl apply -f -

    Every CRD, this one included, is written to deploy/ by python -m gpufleet.api.crds.
    """
    from gpufleet.api import crds, slurmcluster

    manifest = slurmcluster.crd_manifest()
    if output is Format.JSON:
        typer.echo(json.dumps(manifest, indent=2))
    elif output is Format.YAML:
        typer.echo(crds.render(manifest), nl=False)
    else:
        fail(
            f"-o {output}: a manifest is printed as yaml or json", hint="gpufleet slurm crd -o json"
        )


@app.command("token")
def token_cmd(
    jwt_key_file: Path = typer.Option(..., help="The cluster's HS256 JWT key."),
    user: str = typer.Option("root"),
    lifespan: int = typer.Option(3600, help="Seconds."),
) -> None:
    """Mint a slurmrestd / scontrol token, like `scontrol token`.

    Example:

        export SLURM_JWT=$(gpufleet slurm token --jwt-key-file /etc/slurm/jwt/jwt_hs256.key)
    """
    from gpufleet.domain import slurm_jwt

    key = jwt_key_file.read_bytes()
    typer.echo(slurm_jwt.mint(key, issued_at=time.time(), user=user, lifespan_s=lifespan))
