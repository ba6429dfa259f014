"""The whole local cluster: start every component, describe it, stop it.

:class:`LocalCluster` composes :mod:`~gpufleet.local.kube`,
:mod:`~gpufleet.local.slurm` and :mod:`~gpufleet.local.redfish`. Start-up runs
three lanes at once -- the Kubernetes chain (etcd -> apiserver -> scheduler,
controller-manager, KWOK and the nodes), the Slurm chain (munged -> slurmctld,
slurmds, slurmrestd) and the BMCs -- because on a 2-core machine the
apiserver's start dominates and everything else fits in its shadow.

A running cluster is described by :class:`ClusterInfo`, which is also written
to ``<run_dir>/cluster.json`` together with the pid and start time of every
process, so ``gpufleet local status`` / ``down`` work from another process and
never signal a recycled pid.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from gpufleet.domain import slurm_jwt
from gpufleet.local import (
    accounting,
    dns,
    joining,
    kube,
    machines,
    processes,
    slurm,
    slurm_root,
    storage,
    vm,
)
from gpufleet.local.binaries import Binaries
from gpufleet.local.machines import MachineInfo
from gpufleet.local.processes import ComponentError, ManagedProcess, ProcessRecord

if TYPE_CHECKING:
    from gpufleet.local.images import ImageSet

STATE_FILE = "cluster.json"
TEMP_PREFIX = "gpufleet-local-"
DEFAULT_BMC_USER = "admin"


@dataclass(frozen=True)
class ClusterSpec:
    """What to start. Defaults give the 4-node cluster the tests and demo use."""

    nodes: int = 4
    gpus_per_node: int = 8
    node_prefix: str = "gpu-node-"
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    cpus_per_node: int = 64
    memory_gib: int = 512
    run_dir: Path | None = None
    """Private directory for logs, keys, configs and state; a fresh temp dir if None.
    Every ancestor must be world-searchable (munged insists), so not under /root."""
    slurm: bool = True
    slurmd_nodes: int | None = None
    """How many nodes (the first ones) get a slurmd; None: every node. The others are in
    slurm.conf only (Slurm shows them ``unknown*``, never registered): enough for a Slurm
    sync benchmark at 12,500 nodes, which one slurmd per node would not fit on one machine."""
    slurm_version: str = "22.05"
    """The Slurm release: the host's ``22.05``, or ``24.11`` from the root
    :mod:`gpufleet.local.slurm_root` builds (``gpufleet local slurm-image build``)."""
    slurm_backup: bool = False
    """A backup slurmctld beside the primary (Slurm 24.11 only): Slurm's own
    ``SlurmctldHost`` failover on one StateSaveLocation, each controller under its own
    name and loopback address (:data:`gpufleet.local.slurm.CONTROLLERS`)."""
    slurmctld_timeout_s: int = 10
    """SlurmctldTimeout: how long a backup waits for an unanswered primary."""
    nvl72_domains: int = 0
    """Simulated GB200 NVL72 NVLink domains: the first ``nvl72_domains * trays_per_domain``
    KWOK nodes are their trays, labelled as the agent labels a tray from its GPUs' fabric
    registration and as Topograph does (:func:`gpufleet.local.kube.nvl72_labels`)."""
    trays_per_domain: int = 4
    """Trays of each simulated NVLink domain."""
    slurm_accounting: bool = False
    """Slurm accounting: a private MariaDB (:mod:`gpufleet.local.accounting`). With Slurm
    (24.11 only) also slurmdbd, slurmctld sending it every job; ``sacct`` reads them back.
    With ``images`` and no Slurm, MariaDB alone, reachable from the machines, for the
    chart's slurmdbd."""
    slurm_enforce_limits: bool = False
    """With ``slurm_accounting``: Slurm enforces associations and their limits (a
    tenant's GPU quota as its account's ``GrpTRES``; every submitting user needs an
    association, root has one), and its ``normal`` QOS refuses at submission a job
    over a limit (``DenyOnLimit``) instead of leaving it pending."""
    redfish: bool = True
    ready_timeout_s: float = 120.0
    bmc_boot_hooks: Mapping[str, str] = field(default_factory=dict)
    """Per node, a URL the node's BMC POSTs to when the system boots (e.g. the
    simulated hardware's ``/recover``: a reboot clears what a real one clears)."""
    bmc_boot_seconds: float = 0.0
    """How long an emulated server takes to boot after a reset (PowerState Off meanwhile)."""
    bmc_os_shutdown_seconds: float = 3.0
    """How long an emulated server's OS takes to shut down after a graceful reset before
    the machine resets and ``LastResetTime`` moves (PowerState On meanwhile; real servers:
    seconds to minutes; :data:`gpufleet.local.redfish.DEFAULT_OS_SHUTDOWN_S`)."""
    machines: int = 0
    """Real machines (qemu VMs that network-boot and join with kubeadm) beside the KWOK
    nodes: :mod:`gpufleet.local.machines`. 0 leaves the cluster as it always was."""
    machine_memory_mib: int = 1536
    machine_cpus: tuple[int, ...] = ()
    """vCPUs of each machine in order (1 to 4 each; machines past the end get 1). Under
    emulation each vCPU is a host thread: ``(2,)`` lets a system machine that starts many
    pods use the host core a GPU machine leaves idle (decision 0136)."""
    node_image: Path | None = None
    """The boot directory (``vmlinuz``, ``initrd.img``, ``rootfs.squashfs``) the
    machines boot; default: the node image cache entry of this checkout."""
    joinable: bool = False
    """Make the control plane ready for ``kubeadm join`` even without machines (its own
    CA, CSR signing, kubeadm's objects); always on when ``machines`` > 0."""
    machine_power_on: bool = True
    """Press every machine's power button at the end of start-up."""
    token_ttl_s: float = 900.0
    """Lifetime of the machines' join tokens (the provisioning service's ``--token-ttl``)."""
    images: bool = False
    """Ready the machines for the Helm chart: build this checkout's gpufleet and Slurm
    images (:mod:`gpufleet.local.images`) and serve them from a registry on 127.0.0.1
    (component ``registry``) whose ``gpufleet.local/...`` their containerd pulls; every
    machine may reach the BMCs (at ``10.0.2.100:<port>``: the chart's controller runs in a
    pod on a machine, with ``--bmc-address-map 127.0.0.1=10.0.2.100``)."""
    machine_pools: tuple[str, ...] = ()
    """The pool (Machine ``spec.pool``, Node label ``gpufleet.io/pool``) of each machine,
    in order; machines past the end are in ``machines``. E.g. ``("system",)``: the first
    machine is a system node (where the chart's controller runs) and the rest GPU nodes."""
    machine_agent: bool = True
    """Run the agent on each machine as a host service installed from the wheel; False
    when the chart's agent DaemonSet runs it instead."""
    image_seed: bool = True
    """With ``images``: every machine boots with the image seed disk
    (:mod:`gpufleet.local.image_seed`: the Slurm and CoreDNS images and all but the top
    layer of the gpufleet image already unpacked), so a pull fetches only the project's
    layer. False: the machines pull every layer from the registry."""
    host_node: bool = False
    """With ``images``: a system node run natively on the host (:mod:`gpufleet.local.host_node`,
    ``host-node-0000``, pool ``system``): the node image's kubelet, containerd and kube-proxy
    in namespaces of their own, on the machines' fabric. The chart's controllers and Slurm
    control plane then run at native speed while the GPU machines stay emulated
    (decision 0138)."""
    pod_scheduler: bool = False
    """With Slurm: ``gpufleet pod-scheduler`` runs beside it (component ``pod-scheduler``),
    so a Pod with ``schedulerName: gpufleet-slurm`` is scheduled by Slurm
    (docs/pod-scheduler.md). ``gpufleet local up`` turns it on; the tests and the demo
    start their own when they need one."""
    tenant_controller: bool = False
    """``gpufleet tenant-controller`` runs beside it (component ``tenant-controller``, the
    gpufleet CRDs installed first): Tenants get their quota, RoleBindings and NetworkPolicies
    (docs/tenants.md). ``gpufleet local up`` turns it on; the tests start their own."""

    def node_names(self) -> tuple[str, ...]:
        return tuple(f"{self.node_prefix}{i:04d}" for i in range(self.nodes))


@dataclass(frozen=True)
class BmcEndpoint:
    """One node's Redfish BMC: service root URL plus basic-auth credentials."""

    node: str
    url: str
    user: str
    password: str

    @property
    def system_url(self) -> str:
        """The node's ComputerSystem resource (power state, boot override, reset action)."""
        return f"{self.url}/redfish/v1/Systems/1"


@dataclass
class ClusterInfo:
    """Everything a client needs to use a running local cluster.

    Kubernetes: ``kubeconfig`` (token auth, CA file), or ``apiserver_url`` with
    ``token`` as a bearer token and ``ca_file`` to verify TLS.
    Slurm: run commands with ``env=info.slurm_env()`` (it sets ``SLURM_CONF``);
    slurmrestd at ``slurmrestd_url`` with headers ``X-SLURM-USER-NAME: root``
    and ``X-SLURM-USER-TOKEN: <slurm_jwt>``, API version ``slurm_api_version``.
    Redfish: ``bmcs[node]``. Node names are the same in Kubernetes and Slurm.
    """

    run_dir: Path
    node_names: list[str]
    gpus_per_node: int
    kubeconfig: Path
    apiserver_url: str
    token: str
    ca_file: Path
    etcd_url: str
    bin_dir: Path | None = None
    """Directory of the Go binaries (etcd, kube-*, kubectl, kwok) this cluster runs."""
    slurm_conf: Path | None = None
    slurmrestd_url: str | None = None
    slurm_jwt: str | None = None
    slurm_api_version: str = slurm.REST_API_VERSION
    slurm_version: str = slurm.VERSIONS[0]
    slurm_bin_dir: Path | None = None
    """The Slurm commands of this cluster's release when they are not the host's
    (24.11): :meth:`slurm_env` puts them first on PATH."""
    slurm_accounting: bool = False
    """MariaDB runs, and slurmdbd beside the host's Slurm: ``sacct`` answers."""
    accounting_db: accounting.DatabaseEndpoint | None = None
    """The accounting database, as the machines reach it (for the chart's
    ``slurm.accounting``) and for slurmdbd on this host."""
    bmcs: dict[str, BmcEndpoint] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    owner: ProcessRecord | None = None
    """The process whose exit stops this cluster; None once detached (``gpufleet local up``)."""
    ready_s: dict[str, float] = field(default_factory=dict)
    """Seconds from the start of ``up`` until each component was ready."""
    machines: dict[str, MachineInfo] = field(default_factory=dict)
    """The real machines (``ClusterSpec.machines``); their BMCs are in ``bmcs``."""
    provision_url: str | None = None
    """``gpufleet provision serve`` of the machines, from the host."""
    images: dict[str, str] = field(default_factory=dict)
    """``gpufleet`` and ``slurm`` -> the image reference the machines pull
    (``ClusterSpec.images``)."""
    registry_url: str | None = None
    """The machines' registry, from the host (``GET /v2/...``)."""
    host_node: str | None = None
    """The Node name of the system node run on the host (``ClusterSpec.host_node``)."""
    pod_scheduler_metrics_url: str | None = None
    """``/metrics`` of the pod scheduler (``ClusterSpec.pod_scheduler``); None: none runs."""
    tenant_controller_metrics_url: str | None = None
    """``/metrics`` of the tenant controller (``ClusterSpec.tenant_controller``); None: none
    runs."""

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def kubectl(self) -> Path:
        """kubectl of the same Kubernetes release as the apiserver."""
        return (self.bin_dir or Path("/usr/local/bin")) / "kubectl"

    def slurm_env(self) -> dict[str, str]:
        """``os.environ`` plus ``SLURM_CONF``: pass as ``env=`` to sinfo/sbatch/scontrol."""
        if self.slurm_conf is None:
            raise RuntimeError("this cluster was started without Slurm")
        env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
        if self.slurm_bin_dir is not None:
            env["PATH"] = f"{self.slurm_bin_dir}:{env.get('PATH', '')}"
        return env

    def kube_env(self) -> dict[str, str]:
        """``os.environ`` plus ``KUBECONFIG``: pass as ``env=`` to kubectl."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=2, default=str)

    @classmethod
    def from_json(cls, text: str) -> ClusterInfo:
        d: dict[str, Any] = json.loads(text)
        for key in ("run_dir", "kubeconfig", "ca_file"):
            d[key] = Path(d[key])
        for key in ("slurm_conf", "bin_dir", "slurm_bin_dir"):
            if d.get(key):
                d[key] = Path(d[key])
        d["bmcs"] = {k: BmcEndpoint(**v) for k, v in d.get("bmcs", {}).items()}
        d["machines"] = {k: MachineInfo(**v) for k, v in d.get("machines", {}).items()}
        d["processes"] = [ProcessRecord(**p) for p in d.get("processes", [])]
        if d.get("owner"):
            d["owner"] = ProcessRecord(**d["owner"])
        if d.get("accounting_db"):
            d["accounting_db"] = accounting.DatabaseEndpoint(**d["accounting_db"])
        return cls(**d)


def default_run_dir(name: str = "default") -> Path:
    """Where ``gpufleet local up`` keeps a named cluster."""
    return Path(os.environ.get("GPUFLEET_LOCAL_DIR", "/tmp/gpufleet")) / name


def _check_searchable(path: Path) -> None:
    for parent in [path, *path.parents]:
        if parent.exists() and not os.stat(parent).st_mode & 0o001:
            raise ComponentError(
                "run directory",
                None,
                f"{parent} is not searchable by other users "
                f"(mode {oct(os.stat(parent).st_mode & 0o777)}); munged and slurmrestd need "
                "every ancestor of the run directory to be world-searchable. "
                "Choose a run directory under /tmp.",
            )


class LocalCluster:
    """Start and stop one local cluster; use as a context manager.

    >>> with LocalCluster(ClusterSpec(nodes=2)) as info:   # doctest: +SKIP
    ...     subprocess.run(["sinfo"], env=info.slurm_env())

    Stopping is idempotent and also registered with :mod:`atexit`, so an
    interpreter that exits without leaving the ``with`` block still cleans up.
    """

    def __init__(self, spec: ClusterSpec, *, progress: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self._progress = progress or (lambda _msg: None)
        self._procs: list[ManagedProcess] = []
        self._lock = threading.Lock()
        self._t0 = 0.0
        self.info: ClusterInfo | None = None
        self._owns_run_dir = spec.run_dir is None
        self._boot_dir = Path()
        self._images_layout = Path()
        self._seed_disk: Path | None = None
        self._host_node_ports: list[int] = []
        self._slurm: tuple[slurm.SlurmLayout, Binaries] | None = None

    # -- helpers -------------------------------------------------------------

    def _launch(self, proc: ManagedProcess) -> ManagedProcess:
        proc.start()
        with self._lock:
            self._procs.append(proc)
            if self.info is not None and proc.record is not None:
                self.info.processes.append(proc.record)
                self._save()
        return proc

    def _ready(self, name: str) -> None:
        assert self.info is not None
        elapsed = time.monotonic() - self._t0
        with self._lock:
            self.info.ready_s[name] = round(elapsed, 2)
        self._progress(f"{name} ready ({elapsed:.1f} s)")

    def _save(self) -> None:
        assert self.info is not None
        path = self.info.run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.info.to_json())
        tmp.replace(path)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> ClusterInfo:
        """Start every component and wait until each is ready.

        Raises :class:`ComponentError` naming the component and its log file;
        whatever had started is stopped again before it propagates.
        """
        spec = self.spec
        bins = Binaries.locate()
        if spec.run_dir is None:
            reap_orphans(Path(tempfile.gettempdir()))
            run_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        else:
            run_dir = spec.run_dir.resolve()
            if (run_dir / STATE_FILE).exists():
                previous = ClusterInfo.from_json((run_dir / STATE_FILE).read_text())
                if any(p.alive() for p in previous.processes):
                    raise ComponentError(
                        "run directory",
                        None,
                        f"a cluster is already running in {run_dir}; stop it first",
                    )
                # A stopped cluster's directory: start afresh (stale etcd data
                # would bring back old nodes), but only in a directory we made.
                _remove_tree(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
        run_dir.chmod(0o755)
        _check_searchable(run_dir)
        self._t0 = time.monotonic()
        atexit.register(self.stop)
        try:
            self._start(bins, run_dir)
        except BaseException:
            self.stop()
            raise
        assert self.info is not None
        self._progress(f"cluster ready in {time.monotonic() - self._t0:.1f} s")
        return self.info

    def _start(self, bins: Binaries, run_dir: Path) -> None:
        spec = self.spec
        names = spec.node_names()
        logs = run_dir / "logs"
        # Per node a slurmd and a BMC port, reserved only for what runs (a socket held
        # per port while choosing them: 12,500 nodes without Slurm or BMCs need none);
        # nodes defined in Slurm without a slurmd share one port nothing listens on.
        n_with = len(names) if spec.slurmd_nodes is None else min(spec.slurmd_nodes, len(names))
        need_slurmd = n_with if spec.slurm else 0
        need_quiet = 1 if spec.slurm and n_with < len(names) else 0
        need_bmc = len(names) if spec.redfish else 0
        per_node = need_slurmd + need_quiet + need_bmc
        got = processes.free_ports(9 + per_node + 2 + spec.machines * 2)
        chosen = iter(got[9 : 9 + per_node])
        slurmd = [next(chosen) if i < need_slurmd else 0 for i in range(len(names))]
        quiet_port = next(chosen) if need_quiet else 0
        bmc = [next(chosen) if spec.redfish else 0 for _ in names]
        ports = [*got[:9], *slurmd, *bmc, *got[9 + per_node :]]
        machine_ports = ports[9 + spec.nodes * 2 :]
        kl = kube.KubeLayout(
            root=run_dir / "kube",
            logs=logs,
            etcd_client_port=ports[0],
            etcd_peer_port=ports[1],
            apiserver_port=ports[2],
            scheduler_port=ports[3],
            controller_manager_port=ports[4],
            token=secrets.token_hex(16),
            joinable=spec.joinable or spec.machines > 0,
            fake_nodes=spec.nodes,
        )
        hostname = slurm.short_hostname()
        sl = slurm.SlurmLayout(
            root=run_dir / "slurm",
            logs=logs,
            nodes=names[:n_with],
            gpus_per_node=spec.gpus_per_node,
            cpus_per_node=spec.cpus_per_node,
            real_memory_mib=spec.memory_gib * 1024,
            ctld_port=ports[5],
            slurmd_ports=tuple(ports[9 : 9 + n_with]),
            defined_only=names[n_with:],
            defined_only_port=quiet_port,
            restd_port=ports[6],
            hostname=hostname,
            ctld_on_loopback=slurm.resolves_to_loopback(hostname),
            slurm_root=self._slurm_root() if spec.slurm else None,
            backup_ctld=spec.slurm_backup,
            ctld_timeout_s=spec.slurmctld_timeout_s,
        )
        acct = self._plan_accounting(sl)
        if acct is not None and acct.dbd is not None:
            sl = dataclasses.replace(
                sl, accounting_port=acct.dbd.port, enforce_limits=spec.slurm_enforce_limits
            )
        bmc_ports = ports[9 + spec.nodes : 9 + spec.nodes * 2]
        bmc_password = secrets.token_hex(8)
        self.info = ClusterInfo(
            run_dir=run_dir,
            node_names=list(names),
            gpus_per_node=spec.gpus_per_node,
            kubeconfig=kl.kubeconfig,
            apiserver_url=kl.apiserver_url,
            token=kl.token,
            ca_file=kl.ca_file,
            etcd_url=kl.etcd_url,
            bin_dir=bins.kubectl.parent,
            owner=processes.ProcessRecord(
                "owner", os.getpid(), processes.start_time_of(os.getpid()) or 0, ""
            ),
        )
        if spec.redfish:
            self.info.bmcs = {
                n: BmcEndpoint(n, f"http://127.0.0.1:{p}", DEFAULT_BMC_USER, bmc_password)
                for n, p in zip(names, bmc_ports, strict=True)
            }
        vms = self._plan_machines(run_dir, kl, machine_ports, bmc_password, acct)
        kube.prepare(kl)
        if spec.slurm:
            slurm.prepare(sl)
            self.info.slurm_conf = sl.conf
            self.info.slurmrestd_url = sl.restd_url
            self.info.slurm_jwt = slurm_jwt.mint(sl.jwt_key.read_bytes(), issued_at=time.time())
            self.info.slurm_api_version = sl.rest_api_version
            self.info.slurm_version = sl.release
            if sl.slurm_root is not None:
                self.info.slurm_bin_dir = sl.bin_dir
        if acct is not None:
            accounting.prepare(acct)
            self.info.slurm_accounting = True
            self.info.accounting_db = acct.endpoint()
        self._save()
        self._progress(f"run directory {run_dir}")

        etcd = self._launch(kube.etcd(kl, bins))
        # The apiserver retries its etcd connection, so it need not wait.
        apiserver = self._launch(kube.apiserver(kl, bins))
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="gpufleet-local") as pool:
            lanes = [pool.submit(self._kube_lane, kl, bins, etcd, apiserver, names)]
            if spec.slurm:
                lanes.append(pool.submit(self._slurm_lane, sl, bins, acct))
            elif acct is not None:
                lanes.append(pool.submit(self._database_lane, acct))
            if spec.redfish or vms:
                lanes.append(
                    pool.submit(self._redfish_lane, run_dir, bmc_password, sys.executable, vms)
                )
            errors: list[BaseException] = []
            for lane in lanes:
                exc = lane.exception()
                if exc is not None:
                    errors.append(exc)
            if errors:
                raise errors[0]
        if spec.pod_scheduler and spec.slurm:
            self._pod_scheduler_lane()
        if spec.tenant_controller:
            self._tenant_controller_lane(kl)
        if kl.joinable:
            self._join_lane(kl)
        if vms:
            self._machines_lane(kl, run_dir, machine_ports[0])
        self._save()

    def _plan_machines(
        self,
        run_dir: Path,
        kl: kube.KubeLayout,
        ports: list[int],
        password: str,
        acct: accounting.AccountingLayout | None = None,
    ) -> dict[str, Any]:
        """The machines' BMC entries for the Redfish emulator (``vm`` objects), and
        their :class:`MachineInfo` in ``self.info``."""
        spec = self.spec
        assert self.info is not None
        if spec.host_node and not (spec.images and spec.machines > 0):
            raise ComponentError(
                "host-node",
                None,
                "the host node joins the machines' fabric: it needs "
                "--images and at least one machine",
            )
        if spec.machines <= 0:
            return {}
        if spec.machine_memory_mib > 4096 or spec.machine_memory_mib < 512:
            raise ComponentError(
                "machines", None, f"machine memory {spec.machine_memory_mib} MiB: 512 to 4096"
            )
        if any(not 1 <= cpus <= 4 for cpus in spec.machine_cpus):
            raise ComponentError("machines", None, f"machine vCPUs {spec.machine_cpus}: 1 to 4")
        if vm.qemu_binary() is None:
            raise ComponentError(
                "machines",
                None,
                "qemu-system-x86_64 is missing: run scripts/bootstrap-system.sh "
                "(apt-get install qemu-system-x86 ipxe-qemu socat)",
            )
        self._boot_dir = machines.boot_dir(spec.node_image)  # before anything starts
        provision_port, registry_port, rest = ports[0], ports[-1], ports[1:]
        if spec.images:
            self._build_images(registry_port)
        entries: dict[str, Any] = {}
        # With the chart, the controller runs in a pod on a machine: it reaches the BMCs
        # (on the host's 127.0.0.1) as machines reach the host, through qemu's forwards.
        bmc_ports = rest[0 : 2 * spec.machines : 2] if spec.images else []
        # And the chart's slurmdbd reaches the accounting database the same way.
        host_ports = [acct.db_port] if acct is not None and spec.images else []
        for i, name in enumerate(machines.names(spec.machines)):
            bmc_port, inject_port = rest[2 * i], rest[2 * i + 1]
            mac = machines.mac_of(i)
            self.info.bmcs[name] = BmcEndpoint(
                name, f"http://127.0.0.1:{bmc_port}", DEFAULT_BMC_USER, password
            )
            entries[name] = machines.vm_entry(
                name=name,
                mac=mac,
                run_dir=run_dir,
                provision_port=provision_port,
                apiserver_port=kl.apiserver_port,
                inject_port=inject_port,
                memory_mib=spec.machine_memory_mib,
                cpus=machines.cpus_of(spec.machine_cpus, i),
                registry_port=registry_port if spec.images else None,
                bmc_ports=bmc_ports,
                host_ports=host_ports,
                fabric=run_dir / "fabric" if spec.images else None,
                fabric_mac=machines.fabric_mac_of(i),
                seed_disk=self._seed_disk,
            )
            self.info.machines[name] = MachineInfo(
                name=name,
                mac=mac,
                serial=f"SN-{name}",
                console_log=str(machines.console_log(run_dir / "logs", name)),
                inject_url=f"http://127.0.0.1:{inject_port}",
                memory_mib=spec.machine_memory_mib,
                cpus=machines.cpus_of(spec.machine_cpus, i),
            )
        self.info.provision_url = f"http://127.0.0.1:{provision_port}"
        # The host node reaches the host's ports the machines reach.
        self._host_node_ports = list(next(iter(entries.values()))["guest_ports"])
        return entries

    def _join_lane(self, kl: kube.KubeLayout) -> None:
        """What ``kubeadm join`` reads (:mod:`gpufleet.local.joining`), naming the
        apiserver as the machines reach it."""
        api = kube.client(kl)
        try:
            joining.install(
                api,
                server=f"https://{vm.CLUSTER_ADDRESS}:{kl.apiserver_port}",
                ca_pem=kl.ca_file.read_bytes(),
                version=kube.server_version(api),
            )
        finally:
            api.close()
        self._ready("kubeadm join objects")

    def _machines_lane(self, kl: kube.KubeLayout, run_dir: Path, provision_port: int) -> None:
        """The Machines, the provisioning service, then each machine's power button."""
        assert self.info is not None
        timeout = self.spec.ready_timeout_s
        api = kube.client(kl)
        try:
            machines.install_crds(api)
            deadline = time.monotonic() + timeout
            while not machines.machines_established(api):
                if time.monotonic() > deadline:
                    raise ComponentError("machines", None, "the Machine CRD was not established")
                time.sleep(0.1)
            for index, (name, m) in enumerate(self.info.machines.items()):
                bmc = self.info.bmcs[name]
                pool = machines.pool_of(self.spec.machine_pools, index)
                machines.register(api, name, m.mac, bmc.url, bmc.user, bmc.password, pool)
        finally:
            api.close()
        boot = machines.prepare_boot_files(run_dir, self._boot_dir)
        self._ready(f"boot files (node image {self._boot_dir.name}, {boot.wheel})")
        mirrors: tuple[tuple[str, str], ...] = ()
        if self.info.registry_url is not None:
            mirrors = self._start_registry(run_dir)
            fabric = self._launch(machines.fabric_switch(run_dir))
            fabric.wait_ready(
                lambda: (run_dir / "fabric" / "ctl").exists(), timeout=self.spec.ready_timeout_s
            )
            self._ready("fabric (vde_switch)")
            api = kube.client(kl)
            try:
                has_system = self.spec.host_node or "system" in self.spec.machine_pools
                system = "system" if has_system else None
                dns.install(api, self.info.images["coredns"], system)
                storage.install(api, system)
            finally:
                api.close()
            self._ready("cluster DNS (CoreDNS, scheduled once a machine joins), storage")
            if self.spec.host_node:
                self._start_host_node(kl, run_dir, mirrors)
        service = self._launch(
            machines.provision_service(
                run_dir=run_dir,
                kubeconfig=kl.kubeconfig,
                port=provision_port,
                apiserver_port=kl.apiserver_port,
                boot=boot,
                token_ttl_s=self.spec.token_ttl_s,
                agent=self.spec.machine_agent,
                registry_mirrors=mirrors,
            )
        )
        with httpx.Client(timeout=2) as http:
            service.wait_ready(
                lambda: http.get(f"{self.info.provision_url}/healthz").status_code == 200,  # type: ignore[union-attr]
                timeout=timeout,
            )
        self._ready("provision")
        if self.spec.machine_power_on:
            try:
                machines.power_on(kl.kubeconfig, list(self.info.machines))
            except machines.PowerOnFailed as exc:
                log_file = run_dir / "logs" / "redfish.log"
                raise ComponentError("machines", log_file, str(exc)) from exc
            self._ready(f"machines ({len(self.info.machines)} powered on)")

    def _start_host_node(
        self, kl: kube.KubeLayout, run_dir: Path, mirrors: tuple[tuple[str, str], ...]
    ) -> None:
        """The system node on the host (:mod:`gpufleet.local.host_node`): its bootstrap
        token, its files, its runner. Its kubelet registers within seconds; the cluster
        does not wait for that (the machines' joins are not waited for either)."""
        from gpufleet.local import host_node, node_image

        try:
            host_node.check_host()
            files = host_node.extract(self._boot_dir, node_image.cache_root().parent / "host-node")
        except host_node.HostNodeError as exc:
            raise ComponentError("host-node", None, str(exc)) from exc
        token, secret = host_node.bootstrap_token_secret(time.time())
        api = kube.client(kl)
        try:
            api.create("/api/v1/namespaces/kube-system/secrets", secret)
        finally:
            api.close()
        config = host_node.prepare(
            run_dir=run_dir,
            files=files,
            fabric_socket=run_dir / "fabric",
            apiserver_port=kl.apiserver_port,
            ca_pem=kl.ca_file.read_bytes(),
            token=token,
            forward_ports=self._host_node_ports,
            registry_mirrors=mirrors,
        )
        self._launch(host_node.process(config, run_dir / "logs" / "host-node.log"))
        assert self.info is not None
        self.info.host_node = host_node.NAME
        self._ready(f"host node {host_node.NAME} (pool {host_node.POOL}) started")

    def _build_images(self, registry_port: int) -> None:
        """This checkout's images, built (or found cached) before anything starts."""
        from gpufleet.local import images

        assert self.info is not None
        try:
            built = images.build(progress=lambda line: self._progress(f"images: {line}"))
        except images.ImageError as exc:
            raise ComponentError("registry", None, str(exc)) from exc
        self._images_layout = built.layout
        if self.spec.image_seed:
            self._seed_disk = self._build_seed(built)
        self.info.images = {
            "gpufleet": built.gpufleet,
            "slurm": built.slurm,
            "coredns": built.coredns,
        }
        self.info.registry_url = f"http://127.0.0.1:{registry_port}"

    def _build_seed(self, built: ImageSet) -> Path:
        """The machines' image seed disk, hard-linked into the run directory (a rebuild that
        prunes the cache does not take it from under a running cluster)."""
        from gpufleet.local import image_seed, images

        try:
            seed = image_seed.build(
                built.layout,
                self._boot_dir,
                trimmed={built.gpufleet},
                trim=built.app_layers,
                progress=lambda line: self._progress(f"images: {line}"),
            )
        except image_seed.SeedError as exc:
            raise ComponentError("registry", None, str(exc)) from exc
        assert self.info is not None
        disk = self.info.run_dir / "machines" / image_seed.DISK
        disk.parent.mkdir(parents=True, exist_ok=True)
        images.link_or_copy(seed.disk, disk)
        return disk

    def _start_registry(self, run_dir: Path) -> tuple[tuple[str, str], ...]:
        """The machines' registry, serving this cluster's copy of the images; returns the
        (registry, URL) the machines' containerd is told to pull from."""
        from gpufleet.local import images, registry

        assert self.info is not None and self.info.registry_url is not None
        layout = run_dir / "registry"
        images.link_layout(self._images_layout, layout)
        port = int(self.info.registry_url.rsplit(":", 1)[1])
        service = self._launch(registry.process(run_dir, port, layout))
        with httpx.Client(timeout=2) as http:
            service.wait_ready(
                lambda: http.get(f"{self.info.registry_url}/v2/").status_code == 200,  # type: ignore[union-attr]
                timeout=self.spec.ready_timeout_s,
            )
        self._ready(f"registry ({', '.join(self.info.images.values())})")
        return ((images.REGISTRY_HOST, f"http://{vm.CLUSTER_ADDRESS}:{port}"),)

    def _kube_lane(
        self,
        kl: kube.KubeLayout,
        bins: Binaries,
        etcd: ManagedProcess,
        apiserver: ManagedProcess,
        names: tuple[str, ...],
    ) -> None:
        timeout = self.spec.ready_timeout_s
        etcd.wait_ready(lambda: kube.etcd_ok(kl), timeout=timeout)
        self._ready("etcd")
        api = kube.client(kl)
        try:
            apiserver.wait_ready(lambda: kube.apiserver_ok(kl, api), timeout=timeout)
            self._ready("kube-apiserver")
            sched = self._launch(kube.scheduler(kl, bins))
            kcm = self._launch(kube.controller_manager(kl, bins))
            kwok = self._launch(kube.kwok(kl, bins))
            kube.create_nodes(
                api,
                names,
                kube.NodeShape(
                    gpus=self.spec.gpus_per_node,
                    gpu_product=self.spec.gpu_product,
                    cpus=self.spec.cpus_per_node,
                    memory_gib=self.spec.memory_gib,
                    kubelet_version=kube.server_version(api),
                    nvl72_domains=self.spec.nvl72_domains,
                    trays_per_domain=self.spec.trays_per_domain,
                ),
            )
            kube.wait_nodes_ready(api, kwok, names, timeout)
            self._ready(f"kwok ({len(names)} nodes Ready)")
            sched.wait_ready(lambda: kube.healthz_ok(kl.scheduler_port), timeout=timeout)
            self._ready("kube-scheduler")
            kcm.wait_ready(lambda: kube.healthz_ok(kl.controller_manager_port), timeout=timeout)
            kcm.wait_ready(
                lambda: kube.default_service_account_ok(api),
                timeout=timeout,
                what="creating ServiceAccounts",
            )
            self._ready("kube-controller-manager")
        finally:
            api.close()

    def _slurm_root(self) -> Path | None:
        """The Slurm 24.11 tree when the spec asks for that release; None for the host's."""
        version = self.spec.slurm_version
        if version not in slurm.VERSIONS:
            raise ComponentError(
                "slurm", None, f"Slurm {version!r} is not one of {', '.join(slurm.VERSIONS)}"
            )
        if version == slurm.VERSIONS[0]:
            return None
        try:
            return slurm_root.require().tree
        except slurm_root.SlurmRootError as exc:
            raise ComponentError("slurm", None, str(exc)) from exc

    def _plan_accounting(self, sl: slurm.SlurmLayout) -> accounting.AccountingLayout | None:
        """MariaDB and slurmdbd for ``slurm_accounting``: both beside the host's Slurm
        (24.11 only), or MariaDB alone for the chart's slurmdbd (``images``, no Slurm)."""
        spec = self.spec
        if not spec.slurm_accounting:
            return None
        if spec.slurm and sl.slurm_root is None:
            raise ComponentError(
                "slurmdbd",
                None,
                "Slurm accounting needs --slurm 24.11: slurmdbd comes from its root "
                "(the host's Slurm 22.05 has none installed)",
            )
        if not spec.slurm and not spec.images:
            raise ComponentError(
                "mariadb",
                None,
                "Slurm accounting needs Slurm here (--slurm 24.11) or in the chart's pods "
                "(--images: MariaDB alone, for the chart's slurmdbd)",
            )
        if not spec.slurm:
            (db_port,) = processes.free_ports(1)
            return accounting.AccountingLayout(
                root=sl.root.parent / "accounting", logs=sl.logs, db_port=db_port
            )
        db_port, dbd_port = processes.free_ports(2)
        return accounting.AccountingLayout(
            root=sl.root / "accounting",
            logs=sl.logs,
            db_port=db_port,
            dbd=accounting.DbdPlace(
                port=dbd_port, host=sl.hostname, slurm_etc=sl.etc, munge_socket=sl.munge_socket
            ),
        )

    def _database_lane(self, acct: accounting.AccountingLayout) -> None:
        """MariaDB, with slurmdbd's database user."""
        db = self._launch(accounting.mariadbd(acct))
        db.wait_ready(lambda: accounting.mariadb_ok(acct), timeout=self.spec.ready_timeout_s)
        accounting.grant_slurmdbd(acct)
        self._ready("MariaDB")

    def _accounting_lane(self, sl: slurm.SlurmLayout, acct: accounting.AccountingLayout) -> None:
        """MariaDB, then slurmdbd (before slurmctld, which registers the cluster with it
        on start)."""
        self._database_lane(acct)
        dbd = self._launch(accounting.slurmdbd(acct, sl.bin_dir / "slurmdbd", sl.env()))
        dbd.wait_ready(
            lambda: accounting.slurmdbd_ok(sl.bin_dir / "sacctmgr", sl.env()),
            timeout=self.spec.ready_timeout_s,
        )
        if sl.enforce_limits:
            accounting.deny_on_limit(sl.bin_dir / "sacctmgr", sl.env())
        self._ready("slurmdbd")

    def _slurm_lane(
        self,
        sl: slurm.SlurmLayout,
        bins: Binaries,
        acct: accounting.AccountingLayout | None = None,
    ) -> None:
        timeout = self.spec.ready_timeout_s
        if sl.slurm_root is not None:
            holder = self._launch(slurm.root_holder(sl))
            holder.wait_ready(sl.root_pid_file.exists, timeout=timeout, what="mounted")
            self._ready(f"Slurm {sl.release} root")
            bins = slurm.commands(sl, bins)
        munged = self._launch(slurm.munged(sl, bins))
        munged.wait_ready(lambda: slurm.munge_ok(sl, bins), timeout=timeout)
        self._ready("munged")
        if acct is not None:
            self._accounting_lane(sl, acct)
        self._slurm = (sl, bins)
        ctld = self._launch(slurm.slurmctld(sl, bins))
        if sl.backup_ctld:
            # The backup once the primary answers: a starting primary asks every backup to
            # give up control and waits for the answer, which a backup still starting took
            # 30 s to send; slurmds once both answer (a backup in standby refuses them).
            ctld.wait_ready(lambda: slurm.ctld_ok(sl, bins), timeout=timeout)
            backup = self._launch(slurm.slurmctld(sl, bins, 1))
            names = tuple(name for name, _ in sl.controllers)
            backup.wait_ready(
                lambda: slurm.controllers_up(sl, bins) == names,
                timeout=timeout,
                what="answering as the backup",
            )
        daemons = [self._launch(slurm.slurmd(sl, bins, n)) for n in sl.nodes]
        restd = self._launch(slurm.slurmrestd(sl, bins))
        ctld.wait_ready(lambda: slurm.ctld_ok(sl, bins), timeout=timeout)
        self._ready("slurmctld (primary and backup)" if sl.backup_ctld else "slurmctld")
        slurm.wait_nodes_idle(sl, bins, daemons, timeout)
        self._ready(f"slurmd ({len(daemons)} nodes idle)")
        assert self.info is not None and self.info.slurm_jwt is not None
        token = self.info.slurm_jwt
        restd.wait_ready(lambda: slurm.restd_ok(sl, token), timeout=timeout)
        self._ready("slurmrestd")

    def _pod_scheduler_lane(self) -> None:
        """``gpufleet pod-scheduler`` once the apiserver and Slurm answer: it is ready when
        its metrics count a pass (it listed the pods, the nodes and Slurm's jobs)."""
        assert self.info is not None
        port = processes.free_ports(1)[0]
        proc = self._launch(pod_scheduler_process(self.info, port))
        url = f"http://127.0.0.1:{port}/metrics"
        with httpx.Client(timeout=2) as http:
            proc.wait_ready(
                lambda: PASSES_METRIC in http.get(url).text,
                timeout=self.spec.ready_timeout_s,
                what="through its first pass",
            )
        self.info.pod_scheduler_metrics_url = url
        self._ready("pod-scheduler")

    def _tenant_controller_lane(self, kl: kube.KubeLayout) -> None:
        """The gpufleet CRDs (Tenant among them), then ``gpufleet tenant-controller``: ready
        when its metrics answer."""
        assert self.info is not None
        api = kube.client(kl)
        try:
            machines.install_crds(api)
        finally:
            api.close()
        port = processes.free_ports(1)[0]
        proc = self._launch(tenant_controller_process(self.info, port))
        url = f"http://127.0.0.1:{port}/metrics"
        with httpx.Client(timeout=2) as http:
            proc.wait_ready(
                lambda: http.get(url).status_code == 200,
                timeout=self.spec.ready_timeout_s,
                what="serving its metrics",
            )
        self.info.tenant_controller_metrics_url = url
        self._ready("tenant-controller")

    def _redfish_lane(self, run_dir: Path, password: str, python: str, vms: dict[str, Any]) -> None:
        assert self.info is not None
        config = {
            "user": DEFAULT_BMC_USER,
            "password": password,
            "bmcs": [
                {
                    "node": b.node,
                    "port": int(b.url.rsplit(":", 1)[1]),
                    "boot_seconds": self.spec.bmc_boot_seconds,
                    "os_shutdown_seconds": self.spec.bmc_os_shutdown_seconds,
                    **(
                        {"boot_hook": self.spec.bmc_boot_hooks[b.node]}
                        if b.node in self.spec.bmc_boot_hooks
                        else {}
                    ),
                    **({"vm": vms[b.node]} if b.node in vms else {}),
                }
                for b in self.info.bmcs.values()
            ],
        }
        path = run_dir / "redfish.json"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        proc = self._launch(
            ManagedProcess(
                "redfish-bmcs",
                [python, "-m", "gpufleet.local.redfish", str(path)],
                run_dir / "logs" / "redfish.log",
            )
        )
        # One client for all polls: building an httpx client per request costs
        # more than the request (it loads the CA bundle).
        with httpx.Client(timeout=2) as http:
            for bmc in self.info.bmcs.values():
                url = f"{bmc.url}/redfish/v1"
                proc.wait_ready(
                    lambda u=url: http.get(u).status_code == 200,  # type: ignore[misc]
                    timeout=self.spec.ready_timeout_s,
                    what=f"serving the BMC of {bmc.node}",
                )
        self._ready(f"redfish ({len(self.info.bmcs)} BMCs)")

    def launch(self, proc: ManagedProcess) -> ManagedProcess:
        """Start one more process as part of this cluster (logged, recorded in
        ``cluster.json``, stopped with it and by ``gpufleet local down``)."""
        return self._launch(proc)

    def start_slurmctld(self, index: int = 0) -> ManagedProcess:
        """Start controller ``index`` of this cluster's Slurm again (0: the primary), e.g.
        after a failover test killed it; it runs and stops like the others."""
        if self._slurm is None:
            raise ComponentError("slurmctld", None, "this cluster was started without Slurm")
        sl, bins = self._slurm
        return self._launch(slurm.slurmctld(sl, bins, index))

    def detach(self) -> None:
        """Leave the cluster running after this process exits (``gpufleet local up``)."""
        atexit.unregister(self.stop)
        if self.info is not None:
            with self._lock:
                self.info.owner = None
                self._save()

    def stop(self) -> None:
        """Stop every process and sweep the run directory. Idempotent."""
        atexit.unregister(self.stop)
        with self._lock:
            procs, self._procs = self._procs, []
        _stop_in_order([p.record for p in procs if p.record is not None])
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop(grace=0.5)  # reaps the child
        if self.info is not None:
            processes.sweep(self.info.run_dir)
            _remove_host_node_cgroups(self.info.run_dir)
            if self._owns_run_dir and not os.environ.get("GPUFLEET_KEEP_RUN_DIR"):
                _remove_tree(self.info.run_dir)

    def __enter__(self) -> ClusterInfo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


PASSES_METRIC = 'gpufleet_pod_scheduler_passes_total{result="done"}'
"""A pass of the pod scheduler that read the pods, the nodes and Slurm's jobs."""


def pod_scheduler_process(
    info: ClusterInfo,
    port: int,
    *,
    log: Path | None = None,
    interval_s: float = 2.0,
    scheduler_name: str | None = None,
    lease_namespace: str | None = None,
) -> ManagedProcess:
    """``gpufleet pod-scheduler`` against the cluster ``info`` describes: the apiserver as
    its admin, Slurm through ``slurm.conf`` (the munge socket it names) and, with the 24.11
    root, that release's commands; ``/metrics`` on ``port``. One process, so no Lease unless
    ``lease_namespace`` names where to hold it; ``scheduler_name`` serves Pods of another name
    (a test's own). Its log is ``logs/pod-scheduler.log`` unless ``log`` says otherwise."""
    if info.slurm_conf is None:
        raise ComponentError("pod-scheduler", None, "this cluster was started without Slurm")
    bin_dir = info.slurm_bin_dir
    lease = (
        ["--leader-election", f"--lease-namespace={lease_namespace}"]
        if lease_namespace is not None
        else ["--no-leader-election"]
    )
    argv = [
        sys.executable,
        "-m",
        "gpufleet.cli.main",
        "pod-scheduler",
        f"--kubeconfig={info.kubeconfig}",
        f"--slurm-conf={info.slurm_conf}",
        *([f"--slurm-bin-dir={bin_dir}"] if bin_dir is not None else []),
        *([f"--scheduler-name={scheduler_name}"] if scheduler_name is not None else []),
        *lease,
        f"--interval={interval_s:g}",
        f"--metrics-port={port}",
    ]
    return ManagedProcess("pod-scheduler", argv, log or info.logs_dir / "pod-scheduler.log")


def tenant_controller_process(
    info: ClusterInfo, port: int, *, log: Path | None = None, interval_s: float = 5.0
) -> ManagedProcess:
    """``gpufleet tenant-controller`` against the cluster ``info`` describes, as its admin,
    alone (no Lease); ``/metrics`` on ``port``. With Slurm accounting it keeps the tenants'
    Slurm accounts too (``sacctmgr`` of the cluster's Slurm, found through its PATH);
    without, Kubernetes only. Its log is ``logs/tenant-controller.log`` unless ``log`` says
    otherwise."""
    slurm = info.slurm_accounting and info.slurm_conf is not None
    argv = [
        sys.executable,
        "-m",
        "gpufleet.cli.main",
        "tenant-controller",
        f"--kubeconfig={info.kubeconfig}",
        "--no-leader-election",
        f"--interval={interval_s:g}",
        f"--metrics-port={port}",
        *([f"--slurm-conf={info.slurm_conf}"] if slurm else []),
    ]
    return ManagedProcess(
        "tenant-controller",
        argv,
        log or info.logs_dir / "tenant-controller.log",
        env=info.slurm_env() if slurm else None,
    )


def _stop_in_order(records: list[ProcessRecord]) -> None:
    """Stop everything at once except etcd, then etcd.

    The apiserver needs etcd to shut down (it removes its endpoint lease); with
    both stopping together they wait on each other for the whole grace period.
    """
    last = {"etcd"}
    processes.stop_records([r for r in records if r.name not in last])
    processes.stop_records([r for r in records if r.name in last])


def _remove_host_node_cgroups(run_dir: Path) -> None:
    """The host node's runner removes its pods' cgroups when it stops; this catches the
    runner killed before it could (a cluster without a host node has none: no-op)."""
    from gpufleet.local import host_node

    if (run_dir / "host-node").is_dir():
        host_node.remove_cgroups(host_node.cgroup_root_of(run_dir), timeout=2.0)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def reap_orphans(tmp: Path) -> list[Path]:
    """Stop and delete temporary clusters whose owning process died without stopping them.

    A test run killed with SIGKILL cannot clean up; the next start does it.
    Clusters whose owner is alive (another test run) and detached ones are left alone.
    """
    reaped: list[Path] = []
    for state in tmp.glob(f"{TEMP_PREFIX}*/{STATE_FILE}"):
        try:
            info = ClusterInfo.from_json(state.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if info.owner is None or info.owner.alive():
            continue
        _stop_in_order(info.processes)
        processes.sweep(info.run_dir)
        _remove_host_node_cgroups(info.run_dir)
        _remove_tree(info.run_dir)
        reaped.append(info.run_dir)
    return reaped


def load_info(run_dir: Path) -> ClusterInfo:
    """The description of the cluster in ``run_dir`` (running or not)."""
    path = run_dir / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"no local cluster in {run_dir} ({path} does not exist)")
    return ClusterInfo.from_json(path.read_text())


def component_status(info: ClusterInfo) -> list[tuple[ProcessRecord, bool]]:
    """Each recorded process and whether it is still running."""
    return [(p, p.alive()) for p in info.processes]


def stop_run_dir(run_dir: Path) -> list[int]:
    """Stop the cluster described in ``run_dir`` (from any process); return swept stragglers."""
    info = load_info(run_dir)
    _stop_in_order(info.processes)
    swept = processes.sweep(info.run_dir)
    _remove_host_node_cgroups(info.run_dir)
    return swept


@contextlib.contextmanager
def running(
    spec: ClusterSpec, *, progress: Callable[[str], None] | None = None
) -> Iterator[ClusterInfo]:
    """``with running(spec) as info:`` -- a started cluster, stopped on exit or SIGTERM."""
    cluster = LocalCluster(spec, progress=progress)
    with processes.terminate_on_signals():
        try:
            yield cluster.start()
        finally:
            cluster.stop()
