"""Real Slurm on one machine: munged, slurmctld, one ``slurmd -N`` per node, slurmrestd.

The recipe (and every setting's reason) comes from measurements on a 2-core
Debian 12 machine with Debian's Slurm 22.05: all nodes at NodeAddr=127.0.0.1,
each slurmd on its own port, fake GPUs as character devices (plain files make
Slurm drop CUDA_VISIBLE_DEVICES), no cgroup.conf, short timeouts so failure
tests run in seconds. Everything lives under the run directory, with a private
munge key and socket, so two clusters can run side by side.

Daemons run in the foreground (``-D``/``-F``) as our children, so stopping a
process group stops them; job steps escape their group and are removed by the
run-directory sweep in :mod:`gpufleet.local.processes`.

Two releases: the host's own (Debian 12's 22.05, the default) or Slurm 24.11
from the Debian 13 root :mod:`gpufleet.local.slurm_root` builds
(``SlurmLayout.slurm_root``): the same configuration, every daemon and command
run through a wrapper in ``<run>/slurm/bin`` that enters the root, and
slurmrestd serving v0.0.40-v0.0.42.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from gpufleet.domain import hostlist, slurm_accounting, slurm_hooks
from gpufleet.local import slurm_root as slurm_root_fs
from gpufleet.local.binaries import Binaries
from gpufleet.local.processes import ComponentError, ManagedProcess

REST_API_VERSION = "v0.0.38"
"""The newest slurmrestd OpenAPI version Debian 12's Slurm 22.05 serves."""
REST_API_VERSION_24_11 = "v0.0.42"
"""The newest Slurm 24.11 serves (it also serves v0.0.40 and v0.0.41)."""
VERSIONS = ("22.05", slurm_root_fs.SLURM_VERSION)
"""Slurm releases the local cluster runs: the host's, and the root's."""


CONTROLLERS = (("gpufleet-ctld-0", "127.0.0.2"), ("gpufleet-ctld-1", "127.0.0.3"))
"""(SlurmctldHost name, address) of the primary and the backup of a cluster with
``backup_ctld``: addresses of their own on lo (all of 127/8 is loopback), so both
bind the same SlurmctldPort (``NoCtldInAddrAny``)."""

SLURMD_TIMEOUT_WITHOUT_SLURMD = 300
"""SlurmdTimeout of a cluster with nodes that have no slurmd (``defined_only``, a scale
bench): slurmctld pings every node each third of it, and those never answer."""


@dataclass(frozen=True)
class SlurmLayout:
    """Files and ports of one Slurm cluster under ``<run>/slurm``."""

    root: Path
    logs: Path
    nodes: tuple[str, ...]
    gpus_per_node: int
    cpus_per_node: int
    real_memory_mib: int
    ctld_port: int
    slurmd_ports: tuple[int, ...]
    restd_port: int
    hostname: str
    ctld_on_loopback: bool = True
    slurm_root: Path | None = None
    """The Slurm 24.11 tree to run in (:mod:`gpufleet.local.slurm_root`); None: the host's."""
    defined_only: tuple[str, ...] = ()
    """Nodes in slurm.conf without a slurmd (a sync benchmark's 12,500-node fleet: one
    slurmd per node does not fit one machine). They never register: Slurm shows them
    ``unknown*``; ``nodes`` are the ones with a slurmd."""
    defined_only_port: int = 0
    """The port the nodes without slurmd name: nothing listens there (pings are refused)."""
    accounting_port: int | None = None
    """slurmdbd's port on 127.0.0.1 (:mod:`gpufleet.local.accounting`); None: no accounting."""
    enforce_limits: bool = False
    """With accounting: ``AccountingStorageEnforce`` (associations, their limits, QOS),
    as a SlurmCluster with ``accounting.enforceLimits`` renders it."""
    backup_ctld: bool = False
    """Two slurmctlds, a primary and a backup (Slurm's ``SlurmctldHost`` failover, both
    on the one StateSaveLocation): each on its own loopback address
    (:data:`CONTROLLERS`), in a hostname namespace named after its ``SlurmctldHost``
    (slurmctld finds its place in the list by its hostname). Needs ``slurm_root``: the
    names resolve through the root's own ``/etc/hosts``."""
    ctld_timeout_s: int = 10
    """SlurmctldTimeout: how long the backup waits for an unanswered primary before it
    takes over."""

    @property
    def release(self) -> str:
        return VERSIONS[0] if self.slurm_root is None else slurm_root_fs.SLURM_VERSION

    @property
    def rest_api_version(self) -> str:
        return REST_API_VERSION if self.slurm_root is None else REST_API_VERSION_24_11

    @property
    def bin_dir(self) -> Path:
        """The wrappers that run the root's commands (only with ``slurm_root``)."""
        return self.root / "bin"

    @property
    def mount_point(self) -> Path:
        """Where the root is assembled, inside the holder's namespace only."""
        return self.root / "rootfs"

    @property
    def root_pid_file(self) -> Path:
        return self.run_dir / "slurm-root.pid"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def jwt_key(self) -> Path:
        return self.etc / "jwt_hs256.key"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def run_dir(self) -> Path:
        # munged refuses a socket in a 0700 directory; this one is 0755.
        return self.root / "run"

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge.socket"

    @property
    def dev_dir(self) -> Path:
        return self.root / "dev"

    @property
    def ctld_log(self) -> Path:
        return self.logs / "slurmctld.log"

    @property
    def controllers(self) -> tuple[tuple[str, str], ...]:
        """(SlurmctldHost name, address) of each slurmctld, the primary first."""
        if self.backup_ctld:
            return CONTROLLERS
        return ((self.hostname, "127.0.0.1"),)

    def controller_log(self, index: int) -> Path:
        return self.ctld_log if index == 0 else self.logs / f"slurmctld-{index}.log"

    @property
    def hosts_file(self) -> Path:
        """The root's /etc/hosts: with ``backup_ctld`` the host's plus the controllers'
        names, written by :func:`prepare`; else the host's own."""
        return self.etc / "hosts" if self.backup_ctld else Path("/etc/hosts")

    @property
    def ctld_pid_dir(self) -> Path:
        """The directory of SlurmctldPidFile. With ``backup_ctld`` each controller has
        its own (:meth:`controller_dir`) mounted here, in its own mount namespace: a
        slurmctld stops the process named in that file when it starts."""
        return self.root / "ctld" if self.backup_ctld else self.run_dir

    def controller_dir(self, index: int) -> Path:
        return self.root / f"ctld-{index}"

    def slurmd_log(self, node: str) -> Path:
        return self.logs / f"slurmd-{node}.log"

    @property
    def restd_url(self) -> str:
        return f"http://127.0.0.1:{self.restd_port}"

    def env(self) -> dict[str, str]:
        """Environment for Slurm commands (sinfo, sbatch, scontrol) against this cluster
        (with the root's commands first on PATH when it runs in one)."""
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if self.slurm_root is not None:
            env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '')}"
        return env


def render_slurm_conf(layout: SlurmLayout) -> str:
    """slurm.conf for the layout. Pure, so unit tests can check it."""
    r = layout.root
    lines = [
        "# Generated by gpufleet.local; edit the generator, not this file.",
        "ClusterName=gpufleet",
        *(f"SlurmctldHost={name}({addr})" for name, addr in layout.controllers),
        f"SlurmctldPort={layout.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # cred_expire=5: a requeued job is eligible again after ~6 s, not 121 s.
        f"AuthInfo=socket={layout.munge_socket},cred_expire=5",
        "CredType=cred/munge",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={layout.jwt_key}",
        # Bind to the nodes' address (127.0.0.1), not to every interface;
        # slurmctld too when this host's name resolves to loopback.
        "CommunicationParameters="
        + (
            "NoCtldInAddrAny,NoInAddrAny"
            if layout.ctld_on_loopback or layout.backup_ctld
            else "NoInAddrAny"
        ),
        f"StateSaveLocation={r}/state",
        f"SlurmdSpoolDir={r}/spool/%n",
        f"SlurmctldPidFile={layout.ctld_pid_dir}/slurmctld.pid",
        f"SlurmdPidFile={layout.run_dir}/slurmd-%n.pid",
        # With a backup, none: each slurmctld (-D) logs to its own stderr, its process's
        # log (:meth:`SlurmLayout.controller_log`); a backup that takes over reads this
        # file again and would log into the primary's.
        *([] if layout.backup_ctld else [f"SlurmctldLogFile={layout.ctld_log}"]),
        f"SlurmdLogFile={layout.logs}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        *slurm_accounting.slurm_conf_lines(
            None if layout.accounting_port is None else "127.0.0.1",
            layout.accounting_port or slurm_accounting.DEFAULT_DBD_PORT,
            munge_socket=str(layout.munge_socket),
            enforce_limits=layout.enforce_limits,
        ),
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "MailProg=/bin/true",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        # Without it a job with no --mem takes a whole node's memory.
        "DefMemPerCPU=500",
        "GresTypes=gpu",
        # Lets every fake node claim more CPUs than the machine has.
        "SlurmdParameters=config_overrides",
        # A restarted slurmd brings its node back by itself.
        "ReturnToService=2",
        # Node failure is detected in ~10 s instead of minutes. With nodes that have no
        # slurmd (a scale bench), slurmctld pings every node each third of this: at
        # 12,500 nodes 5 s kept it at 1.3 cores pinging nodes that never answer.
        f"SlurmdTimeout={SLURMD_TIMEOUT_WITHOUT_SLURMD if layout.defined_only else 5}",
        f"SlurmctldTimeout={layout.ctld_timeout_s}",
        "MessageTimeout=2",
        "KillWait=2",
        "MinJobAge=300",
        "InactiveLimit=0",
        "Waittime=0",
        "JobRequeue=1",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1",
    ]
    for node, port in zip(layout.nodes, layout.slurmd_ports, strict=True):
        lines.append(
            f"NodeName={node} NodeHostname={layout.hostname} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={layout.cpus_per_node} Boards=1 SocketsPerBoard=1 "
            f"CoresPerSocket={layout.cpus_per_node} ThreadsPerCore=1 "
            f"RealMemory={layout.real_memory_mib} Gres=gpu:{layout.gpus_per_node} State=UNKNOWN"
        )
    if layout.defined_only:
        # One line for all of them (a hostlist), not 12,500 lines every command parses.
        lines.append(
            f"NodeName={hostlist.compress(layout.defined_only)} NodeHostname={layout.hostname} "
            f"NodeAddr=127.0.0.1 Port={layout.defined_only_port} "
            f"CPUs={layout.cpus_per_node} Boards=1 SocketsPerBoard=1 "
            f"CoresPerSocket={layout.cpus_per_node} ThreadsPerCore=1 "
            f"RealMemory={layout.real_memory_mib} Gres=gpu:{layout.gpus_per_node} State=UNKNOWN"
        )
    nodes = hostlist.compress([*layout.nodes, *layout.defined_only])
    lines += [
        f"PartitionName=batch Nodes={nodes} Default=YES MaxTime=INFINITE State=UP "
        "PriorityTier=1 PreemptMode=REQUEUE",
        f"PartitionName=high Nodes={nodes} Default=NO MaxTime=INFINITE State=UP "
        "PriorityTier=10 PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


def gpu_device_paths(layout: SlurmLayout) -> list[Path]:
    return [layout.dev_dir / f"nvidia{i}" for i in range(layout.gpus_per_node)]


def render_gres_conf(layout: SlurmLayout) -> str:
    """gres.conf: every node's GPUs are the same fake devices (Slurm tracks indices per node)."""
    n = layout.gpus_per_node
    files = f"{layout.dev_dir}/nvidia[0-{n - 1}]" if n > 1 else f"{layout.dev_dir}/nvidia0"
    every = [*layout.nodes, *layout.defined_only]
    return f"AutoDetect=off\nNodeName={hostlist.compress(every)} Name=gpu File={files}\n"


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def resolves_to_loopback(hostname: str) -> bool:
    """Whether ``hostname`` resolves to 127.0.0.1 (slurmctld binds to what it resolves to)."""
    try:
        return socket.gethostbyname(hostname) == "127.0.0.1"
    except OSError:
        return False


def prepare(layout: SlurmLayout) -> None:
    """Write keys, configs, spool/state directories and the fake GPU devices."""
    for d in (layout.etc, layout.root / "state", layout.dev_dir, layout.logs):
        d.mkdir(parents=True, exist_ok=True)
    for node in layout.nodes:
        (layout.root / "spool" / node).mkdir(parents=True, exist_ok=True)
    layout.munge_dir.mkdir(mode=0o700, exist_ok=True)
    layout.run_dir.mkdir(exist_ok=True)
    os.chmod(layout.run_dir, 0o755)
    key = layout.munge_dir / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
    if not layout.jwt_key.exists():
        layout.jwt_key.write_bytes(secrets.token_bytes(32))
        os.chmod(layout.jwt_key, 0o600)
    if layout.backup_ctld:
        if layout.slurm_root is None:
            raise ComponentError(
                "slurmctld",
                None,
                "a backup slurmctld needs Slurm 24.11 (--slurm 24.11): its controllers' "
                "names resolve through the Slurm root's own /etc/hosts",
            )
        layout.ctld_pid_dir.mkdir(exist_ok=True)
        for i in range(len(layout.controllers)):
            layout.controller_dir(i).mkdir(exist_ok=True)
        own = "".join(f"{addr} {name}\n" for name, addr in layout.controllers)
        layout.hosts_file.write_text(Path("/etc/hosts").read_text() + own)
    if layout.slurm_root is not None:
        layout.mount_point.mkdir(exist_ok=True)
        layout.root_pid_file.unlink(missing_ok=True)
        slurm_root_fs.write_wrappers(layout.bin_dir, layout.mount_point, layout.root_pid_file)
    layout.conf.write_text(render_slurm_conf(layout))
    (layout.etc / "gres.conf").write_text(render_gres_conf(layout))
    for i, dev in enumerate(gpu_device_paths(layout)):
        if not dev.exists():
            # Character devices with NVIDIA's major number; never opened.
            try:
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(195, i))
            except PermissionError as exc:
                raise ComponentError(
                    "slurm",
                    None,
                    f"cannot create the fake GPU device {dev}: {exc}. Slurm only sets "
                    "CUDA_VISIBLE_DEVICES for character devices, and mknod needs root; "
                    "run as root or start without Slurm (--no-slurm).",
                ) from exc


def root_holder(layout: SlurmLayout) -> ManagedProcess:
    """The process whose private mount namespace holds the assembled Slurm root."""
    assert layout.slurm_root is not None
    return ManagedProcess(
        "slurm-root",
        slurm_root_fs.holder_script(
            layout.slurm_root,
            layout.mount_point,
            layout.root.parent,
            layout.root_pid_file,
            layout.hosts_file,
        ),
        layout.logs / "slurm-root.log",
        cwd=layout.root,
    )


def commands(layout: SlurmLayout, bins: Binaries) -> Binaries:
    """``bins`` with the Slurm and munge executables of the layout's release."""
    if layout.slurm_root is None:
        return bins
    w = layout.bin_dir
    return dataclasses.replace(
        bins,
        munged=w / "munged",
        munge=w / "munge",
        slurmctld=w / "slurmctld",
        slurmd=w / "slurmd",
        slurmrestd=w / "slurmrestd",
        scontrol=w / "scontrol",
        sinfo=w / "sinfo",
    )


def munged(layout: SlurmLayout, bins: Binaries) -> ManagedProcess:
    return ManagedProcess(
        "munged",
        [
            bins.munged,
            "--foreground",
            f"--key-file={layout.munge_dir / 'munge.key'}",
            f"--socket={layout.munge_socket}",
            f"--pid-file={layout.run_dir / 'munged.pid'}",
            f"--log-file={layout.logs / 'munged.log'}",
            f"--seed-file={layout.munge_dir / 'munged.seed'}",
        ],
        layout.logs / "munged.log",
    )


def slurmctld(layout: SlurmLayout, bins: Binaries, index: int = 0) -> ManagedProcess:
    """The slurmctld of ``layout.controllers[index]`` (0: the primary).

    With ``backup_ctld`` each runs under its SlurmctldHost name
    (:func:`gpufleet.local.slurm_root.controller_argv`) and logs to its own file
    (its stderr); the root's holder must be running (its pid names the namespace).
    """
    # -i: ignore state from a previous run of this run directory.
    if not layout.backup_ctld:
        return ManagedProcess(
            "slurmctld", [bins.slurmctld, "-D", "-i"], layout.ctld_log, env=layout.env()
        )
    name, _ = layout.controllers[index]
    log = layout.controller_log(index)
    argv = slurm_root_fs.controller_argv(
        ["slurmctld", "-D", "-i"],
        layout.mount_point,
        layout.root_pid_file,
        name,
        layout.controller_dir(index),
        layout.ctld_pid_dir,
    )
    return ManagedProcess(f"slurmctld {name}", argv, log, env=layout.env())


def slurmd(layout: SlurmLayout, bins: Binaries, node: str) -> ManagedProcess:
    return ManagedProcess(
        f"slurmd {node}", [bins.slurmd, "-D", "-N", node], layout.slurmd_log(node), env=layout.env()
    )


def slurmrestd(layout: SlurmLayout, bins: Binaries) -> ManagedProcess:
    # slurmrestd refuses to run as root; -u drops to nobody after binding.
    # Only the non-accounting OpenAPI plugins load without slurmdbd (22.05 names
    # one plugin per version; 24.11 one for slurmctld, serving v0.0.40-v0.0.42).
    env = {**layout.env(), "SLURM_JWT": "daemon"}
    plugins = (
        "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36"
        if layout.slurm_root is None
        else "openapi/slurmctld"
    )
    return ManagedProcess(
        "slurmrestd",
        [
            bins.slurmrestd,
            "-u",
            "nobody",
            "-a",
            "rest_auth/jwt",
            "-s",
            plugins,
            f"127.0.0.1:{layout.restd_port}",
        ],
        layout.logs / "slurmrestd.log",
        env=env,
    )


def munge_ok(layout: SlurmLayout, bins: Binaries) -> bool:
    if not layout.munge_socket.exists():
        return False
    result = subprocess.run(
        [bins.munge, "-n", "-S", str(layout.munge_socket)],
        capture_output=True,
        timeout=5,
        check=False,
    )
    return result.returncode == 0


def ctld_ok(layout: SlurmLayout, bins: Binaries) -> bool:
    """A controller answers ``scontrol ping``."""
    return bool(controllers_up(layout, bins))


def controllers_up(layout: SlurmLayout, bins: Binaries) -> tuple[str, ...]:
    """Names of the controllers ``scontrol ping`` finds UP (none when it does not answer
    within 10 s). Each line reads ``Slurmctld(primary) at <name> is UP`` (or DOWN)."""
    try:
        result = subprocess.run(
            [bins.scontrol, "ping"],
            env=layout.env(),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ()
    return parse_ping(result.stdout)


def parse_ping(text: str) -> tuple[str, ...]:
    """The controllers ``scontrol ping``'s text says are UP, in its order."""
    up = []
    for line in text.splitlines():
        head, sep, state = line.rpartition(" is ")
        if sep and state.strip() == "UP" and " at " in head:
            up.append(head.rsplit(" at ", 1)[1].strip())
    return tuple(up)


def node_states(layout: SlurmLayout, bins: Binaries) -> dict[str, str]:
    """Node name -> compact state (``idle``, ``down*``...) of the nodes that run a slurmd,
    as sinfo reports it; empty when sinfo does not answer within 30 s (the caller asks
    again until its own deadline). Only those nodes are asked for: a scale bench defines
    12,500 and sinfo over all of them took longer than 5 s on a loaded machine."""
    try:
        result = subprocess.run(
            [bins.sinfo, "-h", "-N", "-p", "batch", "-n", hostlist.compress(layout.nodes),
             "-o", "%N %t"],
            env=layout.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {}
    states: dict[str, str] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def wait_nodes_idle(
    layout: SlurmLayout, bins: Binaries, daemons: Sequence[ManagedProcess], timeout: float
) -> None:
    """Wait until sinfo shows every node idle; name the slurmds that are not."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for proc in daemons:
            code = proc.poll()
            if code is not None:
                raise ComponentError(
                    proc.name, proc.log, f"exited with code {code} before its node was idle"
                )
        states = node_states(layout, bins)
        if all(states.get(n) == "idle" for n in layout.nodes):
            return
        time.sleep(0.1)
    laggards = [n for n in layout.nodes if states.get(n) != "idle"]
    first = laggards[0] if laggards else layout.nodes[0]
    raise ComponentError(
        f"slurmd {first}",
        layout.slurmd_log(first),
        f"nodes not idle after {timeout:.0f} s: "
        + ", ".join(f"{n}={states.get(n, 'missing')}" for n in laggards),
    )


def restd_ok(layout: SlurmLayout, token: str) -> bool:
    resp = httpx.get(
        f"{layout.restd_url}/slurm/{layout.rest_api_version}/ping",
        headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token},
        timeout=2,
    )
    return resp.status_code == 200


def enable_health_hooks(conf: Path, hook_dir: Path, cfg: slurm_hooks.HookConfig) -> str:
    """Run ``gpufleet health check`` as this cluster's HealthCheckProgram, Prolog and Epilog.

    Writes the scripts into ``hook_dir`` and their directives into ``conf``
    (``SchedulerParameters`` gains ``nohold_on_prolog_fail``); the caller runs
    ``scontrol reconfigure``. Returns the previous text of ``conf``, to put back
    with :func:`restore_conf`: the local cluster's slurm.conf is shared by every
    test, so only the tests (and the bench) that measure the hooks turn them on.
    """
    hook_dir.mkdir(parents=True, exist_ok=True)
    if cfg.slurm_conf is None:
        cfg = dataclasses.replace(cfg, slurm_conf=str(conf))
    paths: dict[str, str] = {}
    for mode in slurm_hooks.MODES:
        path = hook_dir / f"gpufleet-{mode}"
        path.write_text(slurm_hooks.script(cfg, mode))
        path.chmod(0o755)
        paths[mode] = str(path)
    before = conf.read_text()
    lines = []
    for line in before.splitlines():
        key, _, value = line.partition("=")
        if key == "SchedulerParameters":
            line = f"{key}={','.join(slurm_hooks.scheduler_parameters(value.split(',')))}"
        lines.append(line)
    lines += slurm_hooks.conf_lines(cfg, paths)
    conf.write_text("\n".join(lines) + "\n")
    return before


def restore_conf(conf: Path, text: str) -> None:
    """Put back the slurm.conf :func:`enable_health_hooks` returned (then reconfigure)."""
    conf.write_text(text)
