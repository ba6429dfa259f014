"""``gpufleet agent``: the node agent (a DaemonSet in production)."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from gpufleet.cli import logs
from gpufleet.cli.options import (
    Backend,
    BackendOpt,
    KubeconfigOpt,
    NodeNameOpt,
    PolicyFileOpt,
    kubeconfig_arg,
    node_name,
)
from gpufleet.cli.policy_cmd import load_or_exit

# The agent (numpy, prometheus_client, the policy models, the Kubernetes client) is
# imported when it runs; its --help needs only these two defaults, which a unit test
# keeps equal to health.metrics.DEFAULT_PORT and health.maintenance_commands.DEFAULT_DIR.
DEFAULT_METRICS_PORT = 29440
DEFAULT_MAINTENANCE_COMMANDS = Path("/etc/gpufleet/maintenance.d")

# No help= here: the callback's docstring (with its example) is the command's help.
app = typer.Typer(invoke_without_command=True)


@app.callback()
def run(
    node: NodeNameOpt = None,
    backend: BackendOpt = Backend.REAL,
    kubeconfig: KubeconfigOpt = None,
    no_kube: bool = typer.Option(False, "--no-kube", help="Do not report to Kubernetes."),
    metrics_port: int = typer.Option(
        DEFAULT_METRICS_PORT, help="Port of the Prometheus /metrics endpoint; 0 turns it off."
    ),
    metrics_address: str = typer.Option(
        "127.0.0.1", help="Address /metrics listens on (0.0.0.0 for a Prometheus off the host)."
    ),
    inject_port: int = typer.Option(
        0, help="Simulated backend: loopback fault-injection API port (0: off)."
    ),
    inject_address: str = typer.Option(
        "127.0.0.1",
        help="Bind address of the fault-injection API (0.0.0.0 in a local-cluster machine, "
        "whose only way in is its qemu port forward from the host's loopback).",
    ),
    policy_file: PolicyFileOpt = None,
    policy_name: str | None = typer.Option(
        None,
        help="The FleetPolicy to judge with, read from the API and followed: the one the "
        "lifecycle controller obeys (its --policy-name). Default: 'default' when the agent "
        "reports to Kubernetes and no --policy file is given. Until it is read, every fault "
        "raises its condition (fail closed).",
    ),
    sku: str = typer.Option("", help="SKU profile; default: from the GPU name."),
    interval: float = typer.Option(1.0, help="Seconds between passive polls."),
    active_every: float = typer.Option(
        0.0, help="Seconds between idle-time active checks (0: only on request)."
    ),
    kmsg_lookback: float = typer.Option(
        300.0, help="At start, kernel log records older than this many seconds are ignored."
    ),
    job_telemetry: Path | None = typer.Option(
        None,
        help="Directory of job telemetry (shared with the jobs, GPUFLEET_TELEMETRY_DIR): "
        "find out whether this node is a straggler in its jobs.",
    ),
    telemetry_every: float = typer.Option(10.0, help="Seconds between job telemetry reads."),
    sim_ib_leaf: str | None = typer.Option(
        None,
        help="Simulated backend: the InfiniBand leaf switch rail 0 is cabled to, "
        "GUID[:NAME] (e.g. 0xfc6a1c0300e7a900:leaf-00); the agent publishes it as "
        "gpufleet.io/ib-seen-leaf. Default: no switch answers (the leaf is unknown).",
    ),
    sim_publish: Path | None = typer.Option(
        None,
        help="Simulated backend: publish the GPUs' speed here for the node's jobs "
        "(GPUFLEET_SIM_GPUS of examples/slurm-ddp).",
    ),
    maintenance_commands: Path = typer.Option(
        DEFAULT_MAINTENANCE_COMMANDS,
        help="Directory of the maintenance commands a MaintenancePlan (action command) may "
        "name: executables, not writable by group or others; a name not found here fails.",
    ),
    dra_publish: bool = typer.Option(
        False,
        "--dra-publish",
        help="Publish this node's GPUs as a DRA ResourceSlice (driver gpu.gpufleet.io), for "
        "clusters where no vendor DRA driver does; the controller's --dra-device-taints "
        "then taints a quarantined GPU alone (docs/agent.md, 'GPUs as DRA devices').",
    ),
    log_format: logs.LogFormatOpt = logs.LogFormat.TEXT,
) -> None:
    """Watch GPUs, InfiniBand and the kernel; report Node conditions, Events and metrics.

    Example (one simulated node against the local cluster):

        gpufleet agent --node gpu-node-0000 --backend simulated --inject-port 9401 \\
            --kubeconfig ~/.local/share/gpufleet/kubeconfig

    A simulated node cabled to an InfiniBand leaf switch labels its Node with it
    (gpufleet.io/ib-seen-leaf, decision 0249):

        gpufleet agent --node gpu-node-0000 --backend simulated \\
            --sim-ib-leaf 0xfc6a1c0300e7a900:leaf-00

    With --job-telemetry, the agent also compares this node's compute per step
    with its peers' in the jobs that write telemetry there, and reports a
    straggler fault (policy: detection.stragglers and the straggler rule):

        gpufleet agent --job-telemetry /shared/gpufleet-telemetry

    A MaintenancePlan with action command runs a command installed on the node,
    by name, once the node is drained (docs/operations.md):

        gpufleet agent --maintenance-commands /etc/gpufleet/maintenance.d

    The agent judges faults with the FleetPolicy the controller obeys (the chart passes
    the controller's name); --policy FILE instead is for an agent without a controller:

        gpufleet agent --policy-name default

    Where no vendor DRA driver publishes the GPUs, the agent publishes them as one
    ResourceSlice of its node, kept current as GPUs change:

        gpufleet agent --dra-publish
    """
    import asyncio

    from gpufleet.health import agent as agent_mod
    from gpufleet.health import backends, skus
    from gpufleet.health.hardware import NoGpuFound
    from gpufleet.health.metrics import AgentMetrics
    from gpufleet.health.telemetry import JobTelemetry

    logs.configure(log_format=log_format)
    node = node_name(node)
    if policy_file is not None and policy_name is not None:
        raise typer.BadParameter(
            "give --policy FILE (a fixed policy) or --policy-name NAME (the FleetPolicy the "
            "controller obeys), not both"
        )
    if no_kube and dra_publish:
        raise typer.BadParameter("--dra-publish writes a ResourceSlice: not with --no-kube")
    if no_kube and policy_name is not None:
        raise typer.BadParameter(
            "--policy-name reads the FleetPolicy from the API: not with --no-kube"
        )
    policy = load_or_exit(policy_file)
    try:
        if sim_publish is not None and backend != "simulated":
            raise typer.BadParameter("--sim-publish needs --backend simulated")
        if sim_ib_leaf is not None:
            _check_sim_ib_leaf(sim_ib_leaf, backend)
        hw = backends.open_backend(
            backend,
            node=node,
            kmsg_lookback_s=kmsg_lookback,
            sim_publish_dir=sim_publish,
            sim_ib_leaf=sim_ib_leaf,
        )
    except NoGpuFound as exc:
        typer.echo(f"no GPU found: {exc}", err=True)
        raise typer.Exit(3) from None
    try:
        names = [str(g.get("name", "")) for g in hw.gpus()]
    except Exception:
        names = []
    profile = skus.choose(skus.bundled(), sku=sku or None, gpu_names=names)
    metrics = AgentMetrics(node)
    reporter = None
    follower = None
    if not no_kube:
        from gpufleet.health.fleet_policy import FleetPolicyFollower
        from gpufleet.health.kube_report import KubeReporter

        reporter = KubeReporter(node, kubeconfig=kubeconfig_arg(kubeconfig))
        if policy_file is None:
            follower = FleetPolicyFollower(reporter.connect, policy_name or "default")
    settings = agent_mod.AgentSettings(
        interval_s=interval,
        active_every_s=active_every,
        telemetry_every_s=telemetry_every,
        maintenance_commands=maintenance_commands,
    )
    telemetry = (
        JobTelemetry(job_telemetry, node, policy.detection.stragglers)
        if job_telemetry is not None
        else None
    )
    agent = agent_mod.Agent(
        hw,
        profile,
        policy,
        node=node,
        reporter=reporter,
        metrics=metrics,
        settings=settings,
        telemetry=telemetry,
        policy_source=follower,
    )
    injector = None
    if inject_port:
        if backend != "simulated":
            raise typer.BadParameter("the injection API needs --backend simulated")
        injector = agent_mod.InjectionServer(hw, inject_port, inject_address).start()
        typer.echo(f"fault injection API on http://{inject_address}:{injector.port}")
    if metrics_port:
        port = metrics.serve(metrics_port, metrics_address)
        typer.echo(f"metrics on http://{metrics_address}:{port}/metrics")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if reporter is None or not dra_publish:
            await agent.run(stop)
            return
        from gpufleet.health.resource_slices import SlicePublisher

        slices = SlicePublisher(hw, node, reporter.connect)
        await asyncio.gather(agent.run(stop), slices.run(stop))

    try:
        asyncio.run(main())
    finally:
        if injector is not None:
            injector.stop()
        metrics.stop()
        hw.close()


def _check_sim_ib_leaf(value: str, backend: str) -> None:
    """``--sim-ib-leaf GUID[:NAME]``: a switch GUID as smpquery prints it, an optional name."""
    import re

    if backend != "simulated":
        raise typer.BadParameter("--sim-ib-leaf needs --backend simulated")
    if not re.fullmatch(r"0x[0-9a-fA-F]{1,16}(:[A-Za-z0-9][A-Za-z0-9_.-]*)?", value):
        raise typer.BadParameter(
            f"--sim-ib-leaf {value!r}: give the switch GUID and an optional name, "
            "e.g. 0xfc6a1c0300e7a900:leaf-00"
        )
