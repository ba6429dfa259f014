"""``gpufleet local``: start, inspect and stop the embedded local cluster."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console, RenderableType
from rich.text import Text

from gpufleet.cli.options import LOCAL_NAME, LocalNameOpt, RunDirOpt, local_run_dir
from gpufleet.cli.options import local_cluster as local_cluster_info
from gpufleet.cli.output import Column, Format, OutputOpt, emit, table

# The cluster (httpx, the Slurm and BMC helpers) is imported by the commands that start,
# read or stop one: `gpufleet local --help` needs only the names (docs/cli.md, start-up).
if TYPE_CHECKING:
    from gpufleet.local.cluster import ClusterInfo

app = typer.Typer(
    help="Run a whole GPU cluster on this machine: Kubernetes + KWOK GPU nodes, Slurm, BMCs.",
    no_args_is_help=True,
)
console = Console(stderr=True)


def _name_args(name: str, run_dir: Path | None) -> str:
    if run_dir is not None:
        return f" --run-dir {shlex.quote(str(run_dir))}"
    return "" if name == LOCAL_NAME else f" --name {shlex.quote(name)}"


def _exports(info: ClusterInfo) -> list[str]:
    """Shell lines that point kubectl and the Slurm commands at the cluster."""
    from gpufleet.local.binaries import go_bin_dir

    lines = [
        f"export PATH={shlex.quote(str(go_bin_dir()))}:$PATH",
        f"export KUBECONFIG={shlex.quote(str(info.kubeconfig))}",
    ]
    if info.slurm_conf is not None:
        lines.append(f"export SLURM_CONF={shlex.quote(str(info.slurm_conf))}")
    if info.slurm_bin_dir is not None:  # Slurm 24.11: its commands, not the host's
        lines.append(f"export PATH={shlex.quote(str(info.slurm_bin_dir))}:$PATH")
    return lines


def _print_usage(info: ClusterInfo, name_args: str) -> None:
    out = Console(soft_wrap=True)
    out.print(f"\n[bold]Local cluster ready[/bold] in {info.run_dir}", highlight=False)
    out.print(f"  kubeconfig:  {info.kubeconfig}", highlight=False)
    out.print(f"  apiserver:   {info.apiserver_url}", highlight=False)
    if info.slurm_conf is not None:
        out.print(f"  SLURM_CONF:  {info.slurm_conf}", highlight=False)
        accounted = " with accounting (slurmdbd, MariaDB: sacct)" if info.slurm_accounting else ""
        out.print(f"  Slurm:       {info.slurm_version}{accounted}", highlight=False)
        out.print(
            f"  slurmrestd:  {info.slurmrestd_url} (API {info.slurm_api_version}; "
            "JWT: slurm_jwt in cluster.json)",
            highlight=False,
        )
    if info.pod_scheduler_metrics_url is not None:
        out.print(
            "  pods:        schedulerName gpufleet-slurm -> one Slurm job per pod group "
            f"(gpufleet pod-scheduler; {info.logs_dir / 'pod-scheduler.log'})",
            highlight=False,
        )
    if info.tenant_controller_metrics_url is not None:
        out.print(
            "  tenants:     kubectl get tenants (gpufleet tenant-controller; "
            f"{info.logs_dir / 'tenant-controller.log'})",
            highlight=False,
        )
    if info.bmcs:
        first = next(iter(info.bmcs.values()))
        out.print(
            f"  Redfish:     {len(info.bmcs)} BMCs from {first.url} (user {first.user}, "
            "password in cluster.json)",
            highlight=False,
        )
    out.print(f"  logs:        {info.logs_dir}", highlight=False)
    if info.machines:
        out.print(
            f"  machines:    {len(info.machines)} powered on; gpufleet provision serve on "
            f"{info.provision_url}",
            highlight=False,
        )
        for m in info.machines.values():
            out.print(
                f"    {m.name}  MAC {m.mac}  BMC {info.bmcs[m.name].url}  console {m.console_log}",
                highlight=False,
            )
    if info.host_node:
        out.print(
            f"  host node:   {info.host_node} (pool system, on this host); its log "
            f"{info.logs_dir / 'host-node.log'}, its kubelet's and containerd's in "
            f"{info.run_dir / 'host-node' / 'logs'}",
            highlight=False,
        )
    if info.images:
        out.print(f"  registry:    {info.registry_url} (machines pull from it)", highlight=False)
        for image in info.images.values():
            out.print(f"    {image}", highlight=False)
    db = info.accounting_db
    if db is not None and info.slurm_conf is None:  # MariaDB alone, for the chart's slurmdbd
        out.print(
            f"  accounting:  MariaDB at {db.machines_host}:{db.port} from the machines (user "
            f"{db.user}, password in {db.password_file}): the chart's slurm.accounting",
            highlight=False,
        )
    out.print(
        f'\nPoint kubectl and sinfo at it (or run: eval "$(gpufleet local env{name_args})"):',
        highlight=False,
    )
    for line in _exports(info):
        out.print(f"  {line}", soft_wrap=True, highlight=False)
    out.print("  kubectl get nodes", highlight=False)
    if info.slurm_conf is not None:
        out.print("  sinfo", highlight=False)
    out.print(f"\nStop it with: gpufleet local down{name_args}", highlight=False)


@app.command()
def up(
    nodes: int = typer.Option(4, "--nodes", "-n", min=1, help="Number of fake GPU nodes."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=64, help="GPUs per node."),
    name: LocalNameOpt = LOCAL_NAME,
    run_dir: RunDirOpt = None,
    no_slurm: bool = typer.Option(False, "--no-slurm", help="Do not start Slurm."),
    slurm_version: str = typer.Option(
        "22.05",
        "--slurm",
        help="Slurm release: 22.05 (this host's Debian 12 packages) or 24.11 (Debian 13's, "
        "in the root `gpufleet local slurm-image build` makes; slurmrestd v0.0.40-v0.0.42).",
    ),
    slurm_accounting: bool = typer.Option(
        False,
        "--slurm-accounting",
        help="Slurm accounting: a private MariaDB (the host's mariadb-server). With --slurm "
        "24.11 also slurmdbd, and `sacct` shows each job's GPUs (gres/gpu); with --images and "
        "--no-slurm, MariaDB alone at 10.0.2.100:PORT for the chart's slurm.accounting.",
    ),
    slurm_enforce_limits: bool = typer.Option(
        False,
        "--slurm-enforce-limits",
        help="With --slurm 24.11 --slurm-accounting: Slurm enforces associations and their "
        "limits (a tenant's GPU quota as its account's GrpTRES) and refuses a job over one at "
        "sbatch (docs/tenants.md).",
    ),
    slurm_backup: bool = typer.Option(
        False,
        "--slurm-backup",
        help="With --slurm 24.11: a backup slurmctld beside the primary (Slurm's own "
        "SlurmctldHost failover on one state directory; docs/slurm.md, Controller failover).",
    ),
    slurmctld_timeout: int = typer.Option(
        10,
        "--slurmctld-timeout",
        min=3,
        max=3600,
        help="With --slurm-backup: SlurmctldTimeout, the seconds the backup waits for an "
        "unanswered primary before it takes over.",
    ),
    nvl72_domains: int = typer.Option(
        0,
        "--nvl72-domains",
        min=0,
        max=64,
        help="Simulated GB200 NVL72 NVLink domains: the first KWOK nodes are their trays, "
        "labelled with the NVLink clique the agent publishes and Topograph's domain label "
        "(more nodes are started if --nodes is short; docs/local-cluster.md).",
    ),
    trays_per_domain: int = typer.Option(
        4,
        "--trays-per-domain",
        min=1,
        max=18,
        help="With --nvl72-domains: the trays of each domain (a real NVL72 has 18).",
    ),
    pod_scheduler: bool = typer.Option(
        True,
        "--pod-scheduler/--no-pod-scheduler",
        help="With Slurm: run `gpufleet pod-scheduler`, so a Pod with schedulerName "
        "gpufleet-slurm is scheduled by Slurm (docs/pod-scheduler.md). --no-pod-scheduler for "
        "a test that runs its own (GPUFLEET_TEST_CLUSTER).",
    ),
    tenant_controller: bool = typer.Option(
        True,
        "--tenant-controller/--no-tenant-controller",
        help="Run `gpufleet tenant-controller` (the gpufleet CRDs installed first), so a "
        "Tenant gets its quota and access (docs/tenants.md).",
    ),
    no_bmcs: bool = typer.Option(False, "--no-bmcs", help="Do not start the Redfish BMCs."),
    machines: int = typer.Option(
        0,
        "--machines",
        min=0,
        max=8,
        help="Real machines beside the KWOK nodes: qemu VMs that network-boot the node image "
        "through gpufleet provision and join with kubeadm (needs `gpufleet local image build`).",
    ),
    machine_memory: int = typer.Option(
        1536, "--machine-memory", min=512, max=4096, help="MiB of memory per machine."
    ),
    machine_cpus: str = typer.Option(
        "",
        "--machine-cpus",
        help="Comma-separated vCPUs of each machine in order, 1-4 (the rest: 1), e.g. 2: the "
        "first (a system node starting many pods) gets two. Each is a host thread under "
        "emulation (decision 0136).",
    ),
    images: bool = typer.Option(
        False,
        "--images",
        help="Build this checkout's gpufleet and Slurm images (`gpufleet local images build`) "
        "and serve them to the machines from a local registry: the chart's pods pull them.",
    ),
    machine_pools: str = typer.Option(
        "",
        "--machine-pools",
        help="Comma-separated pool of each machine in order (the rest: machines), e.g. "
        "system,machines: the first is a system node for the chart's controller.",
    ),
    no_image_seed: bool = typer.Option(
        False,
        "--no-image-seed",
        help="With --images: boot the machines without the image seed disk, so they pull "
        "every layer from the registry (minutes per machine under emulation; decision 0137).",
    ),
    host_node: bool = typer.Option(
        False,
        "--host-node",
        help="With --images: a system node (host-node-0000, pool system) run natively on this "
        "host: the node image's kubelet, containerd and kube-proxy in namespaces of their own, "
        "on the machines' fabric. The chart's controllers and Slurm control plane run there at "
        "native speed (decision 0138).",
    ),
    no_machine_agent: bool = typer.Option(
        False,
        "--no-machine-agent",
        help="Run no agent on the machines as a host service (the chart's DaemonSet runs it).",
    ),
    node_image: Path | None = typer.Option(
        None,
        "--node-image",
        help="Boot directory of the machines (vmlinuz, initrd.img, rootfs.squashfs); "
        "default: the node image cache.",
    ),
    foreground: bool = typer.Option(
        False,
        "--foreground",
        help="Stay attached and stop the cluster on Ctrl-C instead of returning.",
    ),
) -> None:
    """Start a local cluster and leave it running in the background.

    Example: gpufleet local up --nodes 4 --gpus-per-node 8

    With Slurm 24.11 instead of the host's 22.05 (`gpufleet local slurm-image build` first):

        gpufleet local up --nodes 2 --slurm 24.11

    Slurm schedules a Pod that asks for it (the pod scheduler runs unless --no-pod-scheduler;
    docs/pod-scheduler.md), then `squeue` shows its job under the Pod's name:

        kubectl run train --image=busybox --restart=Never \
            --overrides='{"spec": {"schedulerName": "gpufleet-slurm"}}' -- sleep 600

    With Slurm accounting (MariaDB and slurmdbd; then `sacct -o JobID,State,AllocTRES`):

        gpufleet local up --nodes 2 --slurm 24.11 --slurm-accounting

    With a backup slurmctld (kill the primary, `scontrol ping` shows the backup take over):

        gpufleet local up --nodes 2 --slurm 24.11 --slurm-backup --slurmctld-timeout 5

    With two simulated NVL72 NVLink domains of four trays each (eight KWOK nodes):

        gpufleet local up --nvl72-domains 2 --trays-per-domain 4

    With one real machine (a qemu VM, powered on through its BMC; it joins within
    a few minutes, its console is logs/machine-vm-node-0000.console.log):

        gpufleet local up --nodes 2 --machines 1

    Ready for the Helm chart (docs/install.md, "On the local cluster"): images served to the
    nodes, a system node on the host for the controllers and Slurm, a GPU machine, the agent
    left to the chart:

        gpufleet local up --nodes 1 --no-slurm --machines 1 --host-node \\
            --machine-memory 3072 --images --no-machine-agent
    """
    from gpufleet.local import cluster as local_cluster
    from gpufleet.local.binaries import MissingBinaryError
    from gpufleet.local.processes import ComponentError, terminate_on_signals

    spec = local_cluster.ClusterSpec(
        nodes=max(nodes, nvl72_domains * trays_per_domain),
        gpus_per_node=gpus_per_node,
        run_dir=local_run_dir(name, run_dir),
        slurm=not no_slurm,
        slurm_version=slurm_version,
        slurm_accounting=slurm_accounting,
        slurm_enforce_limits=slurm_enforce_limits,
        slurm_backup=slurm_backup,
        slurmctld_timeout_s=slurmctld_timeout,
        nvl72_domains=nvl72_domains,
        trays_per_domain=trays_per_domain,
        redfish=not no_bmcs,
        machines=machines,
        machine_memory_mib=machine_memory,
        machine_cpus=_machine_cpus(machine_cpus),
        node_image=node_image,
        images=images,
        image_seed=not no_image_seed,
        machine_pools=_machine_pools(machine_pools),
        machine_agent=not no_machine_agent,
        host_node=host_node,
        pod_scheduler=pod_scheduler and not no_slurm,
        tenant_controller=tenant_controller,
    )
    cluster = local_cluster.LocalCluster(spec, progress=lambda msg: console.print(f"  {msg}"))
    console.print(f"Starting a local cluster with {nodes} nodes x {gpus_per_node} GPUs ...")
    try:
        with terminate_on_signals():
            info = cluster.start()
    except (ComponentError, MissingBinaryError) as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(1) from err
    _print_usage(info, _name_args(name, run_dir))
    if not foreground:
        # Leave the processes running; `gpufleet local down` stops them.
        cluster.detach()
        return
    Console().print("\nRunning; press Ctrl-C to stop.")
    try:
        with terminate_on_signals():
            while True:
                time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        started = time.monotonic()
        cluster.stop()
        console.print(f"stopped in {time.monotonic() - started:.1f} s")


@app.command()
def status(
    name: LocalNameOpt = LOCAL_NAME,
    run_dir: RunDirOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Show each component of a local cluster and whether it is running (exit 3 if none
    is); -o wide adds each component's log file.

    Example: gpufleet local status --name default -o wide
    """
    from gpufleet.local import cluster as local_cluster

    info = local_cluster_info(name, run_dir)
    rows = local_cluster.component_status(info)
    data = {
        "runDir": str(info.run_dir),
        "components": [
            {"name": r.name, "pid": r.pid, "running": alive, "log": str(r.log)} for r, alive in rows
        ],
        "env": _exports(info),
    }

    def draw(wide: bool) -> list[RenderableType]:
        cells = [
            (
                r.name,
                str(r.pid),
                Text("running", "green") if alive else Text("stopped", "red"),
                str(r.log),
            )
            for r, alive in rows
        ]
        columns = ("COMPONENT", Column("PID", justify="right"), "STATE", Column("LOG", wide=True))
        drawn: list[RenderableType] = [
            table(columns, cells, wide=wide, title=f"local cluster in {info.run_dir}")
        ]
        return drawn + [Text(line) for line in _exports(info)]

    emit(output, data, draw)
    if not any(alive for _, alive in rows):
        raise typer.Exit(3)


@app.command()
def env(
    name: LocalNameOpt = LOCAL_NAME,
    run_dir: RunDirOpt = None,
) -> None:
    """Print shell exports (PATH for kubectl, KUBECONFIG, SLURM_CONF) for a local cluster.

    Example: eval "$(gpufleet local env)"; kubectl get nodes; sinfo
    """
    info = local_cluster_info(name, run_dir)
    print("\n".join(_exports(info)))


@app.command()
def down(
    name: LocalNameOpt = LOCAL_NAME,
    run_dir: RunDirOpt = None,
) -> None:
    """Stop every process of a local cluster (its run directory is kept for the logs).

    Example: gpufleet local down --name default
    """
    from gpufleet.local import cluster as local_cluster

    path = local_cluster_info(name, run_dir).run_dir
    started = time.monotonic()
    stragglers = local_cluster.stop_run_dir(path)
    extra = f" (and {len(stragglers)} stray job processes)" if stragglers else ""
    console.print(
        f"stopped the local cluster in {path} in {time.monotonic() - started:.1f} s{extra}"
    )


def _machine_pools(text: str) -> tuple[str, ...]:
    """``--machine-pools system,machines`` -> ("system", "machines"); a name that is not a
    label value is a usage error naming it."""
    import re

    pools = tuple(part.strip() for part in text.split(",") if part.strip())
    for pool in pools:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", pool):
            raise typer.BadParameter(
                f"{pool!r} is not a pool name (lower-case letters, digits, '-')",
                param_hint="--machine-pools",
            )
    return pools


def _machine_cpus(text: str) -> tuple[int, ...]:
    """``--machine-cpus 2,1`` -> (2, 1); a bad value is a usage error naming it."""
    try:
        cpus = tuple(int(part) for part in filter(None, (p.strip() for p in text.split(","))))
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected numbers, e.g. 2,1") from None
    if any(not 1 <= n <= 4 for n in cpus):
        raise typer.BadParameter(f"{text!r}: each machine gets 1 to 4 vCPUs")
    return cpus


# The image builders are groups under ``gpufleet local``; imported here, at the end,
# so that they load with ``local`` and not with every other command.
from gpufleet.cli import image_cmd, images_cmd, slurm_image_cmd  # noqa: E402

app.add_typer(image_cmd.app, name="image")  # gpufleet local image ...
app.add_typer(slurm_image_cmd.app, name="slurm-image")
app.add_typer(images_cmd.app, name="images")  # gpufleet local images ...
