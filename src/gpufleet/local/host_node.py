"""A system node that runs natively on the host, beside the emulated machines.

Two host cores run the local cluster. Under software emulation a machine's every
process costs 20-40 times its native CPU, so a system machine that runs the chart's
controllers, syncer, operator and the Slurm control plane (slurmctld, slurmrestd,
login, slurmdbd, four munged) and CoreDNS took 30 minutes and more to bring them up
(decision 0138). The host node runs the same work at native speed: the node image's
own kubelet, kube-proxy, containerd and CNI plugins (copied out of its root
filesystem; runc, iptables and conntrack are Debian's), started on the host in
namespaces of their own, and joined through the same TLS bootstrap with a bootstrap
token that ``kubeadm join`` performs on a machine:

- a **network namespace** with the cluster fabric's switch plugged in as ``tap0``
  (``vde_plug2tap``), the node's address :data:`ADDRESS`, its pod bridge and
  kube-proxy's rules: pods there and on the machines reach each other across the
  fabric, by the routes the node image's ``pod-network --routes`` keeps on both sides;
- the host's ports the machines reach at :data:`~gpufleet.local.vm.CLUSTER_ADDRESS`
  (apiserver, registry, BMCs, MariaDB) reached there at the same address: the runner
  in the host's namespace listens inside the node's and forwards to 127.0.0.1;
- a **mount namespace** with ``/etc`` and ``/var`` as overlays whose upper layers are
  in the run directory (``/etc/kubernetes``, ``/var/lib/kubelet``, hostPath volumes:
  the host's own are untouched) and a ``/run`` of its own;
- a **PID namespace**: when its first process (:mod:`gpufleet.local.host_node_init`)
  ends, the kernel ends every process of the node, containers included; the runner
  then removes the pods' cgroups (:data:`cgroup_root`). Nothing outlives the cluster.

The host node belongs to pool ``system`` and carries no ``gpufleet.io/machine``
label: it is not a Machine (no BMC, no reimage). The GPU machines stay emulated,
where power cycles and network boots must be real.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.domain import enrollment, well_known
from gpufleet.kubeapi.machines import TOKEN_NAMESPACE
from gpufleet.local import joining, machines, processes, vm
from gpufleet.local.processes import ManagedProcess

Json = dict[str, Any]
NAME = "host-node-0000"
POOL = "system"
FABRIC_MAC = "52:54:01:67:ff:00"
"""A fabric MAC outside the machines' range (``52:54:01:67:00:NN``)."""
ADDRESS = machines.fabric_address_of(FABRIC_MAC)
"""Its fabric address, derived from :data:`FABRIC_MAC` as every machine's is (10.1.255.1)."""
FABRIC_PREFIX = ipaddress.ip_network(machines.FABRIC_SUBNET).prefixlen
TAP = "tap0"
TOKEN_TTL_S = 3600.0
FILES = (
    "usr/bin/kubelet",
    "usr/bin/kube-proxy",
    "usr/bin/containerd",
    "usr/bin/containerd-shim-runc-v2",
    "usr/bin/ctr",
    "usr/lib/cni",
    "usr/lib/gpufleet/pod-network",
    "usr/lib/gpufleet/kube-proxy.yaml",
    "usr/lib/gpufleet/pause.tar",
    "usr/lib/gpufleet/netcheck.tar",
)
"""What the host node takes from the node image's root filesystem."""
HOST_TOOLS = {"runc": "runc", "iptables": "iptables", "conntrack": "conntrack",
              "vde_plug2tap": "vde2", "unshare": "util-linux"}  # fmt: skip
"""Host commands it needs, with their Debian packages (bootstrap-system.sh installs them)."""
RUNC = "/usr/sbin/runc"
"""Debian 12's runc: the node image's needs a newer glibc than this host's."""
FORWARD_WAIT_S = 60.0


class HostNodeError(RuntimeError):
    """The host node cannot run here; the message says why."""


@dataclass(frozen=True)
class HostNodeConfig:
    """Everything the runner and the node's first process need (``host-node.json``)."""

    name: str
    root: str
    """``<run_dir>/host-node``: the overlays' upper layers, containerd's root, logs."""
    files: str
    """The node image files (:data:`FILES`) under their image paths."""
    fabric_socket: str
    forward_ports: list[int]
    """Host loopback ports reached at the cluster address inside the node."""
    cgroup_root: str
    address: str = ADDRESS
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return Path(self.root)

    def save(self) -> Path:
        path = self.dir / "host-node.json"
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def load(cls, path: Path) -> HostNodeConfig:
        return cls(**json.loads(path.read_text()))


def cgroup_root_of(run_dir: Path) -> str:
    """The cgroup every pod of this cluster's host node lives under (one per run
    directory: two clusters on one host do not share it)."""
    return f"/gpufleet-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]}"


def check_host() -> None:
    """Fails naming the Debian packages of missing host commands."""
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})
    if missing or not Path(RUNC).exists():
        raise HostNodeError(
            f"the host node needs Debian's {', '.join(missing or ['runc'])}: "
            "run scripts/bootstrap-system.sh"
        )
    if os.geteuid() != 0:
        raise HostNodeError("the host node needs root (namespaces, mounts, cgroups)")


def extract(node_image_dir: Path, cache: Path) -> Path:
    """The node image's :data:`FILES`, copied once per node image into ``cache``."""
    out = cache / node_image_dir.name
    if (out / ".complete").exists():
        return out
    building = cache / f".{node_image_dir.name}.building"
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["unsquashfs", "-q", "-n", "-d", str(building),
         str(node_image_dir / "rootfs.squashfs"), *FILES],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise HostNodeError(f"unsquashfs of {node_image_dir}: {done.stderr.strip()[-500:]}")
    absent = [f for f in FILES if not (building / f).exists()]
    if absent:
        raise HostNodeError(f"node image {node_image_dir.name} lacks {', '.join(absent)}")
    (building / ".complete").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    building.rename(out)
    return out


def bootstrap_token_secret(now: float) -> tuple[str, Json]:
    """A bootstrap token (``id.secret``) and its Secret, as the provisioning service issues a
    machine's (no Machine label: the host node is not one), for the node's TLS bootstrap."""
    token_id, token_secret = enrollment.random_token(secrets.token_bytes)
    body = enrollment.secret_body(
        token_id,
        token_secret,
        now + TOKEN_TTL_S,
        namespace=TOKEN_NAMESPACE,
        description=f"TLS bootstrap of the local cluster's {NAME}",
    )
    return f"{token_id}.{token_secret}", body


def bootstrap_kubeconfig(server: str, ca_pem: bytes, token: str) -> str:
    """What the kubelet presents until its client certificate is signed (kubeadm's shape)."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": joining.CLUSTER_NAME,
                    "cluster": {
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                        "server": server,
                    },
                }
            ],
            "users": [{"name": "tls-bootstrap-token-user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "tls-bootstrap",
                    "context": {
                        "cluster": joining.CLUSTER_NAME,
                        "user": "tls-bootstrap-token-user",
                    },
                }
            ],
            "current-context": "tls-bootstrap",
        },
        sort_keys=False,
    )


def kubelet_configuration(cgroup_root: str) -> str:
    """The cluster's KubeletConfiguration (:func:`joining.kubelet_configuration`) for a
    host that mounts cgroup v1 and runs no systemd: the cgroupfs driver, its pods under
    ``cgroup_root``, no static pods, the node's own resolv.conf."""
    config = yaml.safe_load(joining.kubelet_configuration())
    config.update(
        {
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupRoot": cgroup_root,
            "cgroupsPerQOS": True,
            "resolvConf": "/etc/resolv.conf",
            "staticPodPath": "",
        }
    )
    return yaml.safe_dump(config, sort_keys=False)


def containerd_configuration(files: Path) -> str:
    """containerd for the host node: the node image's (pause image, CNI, registries per
    host) with the cgroupfs driver, Debian's runc, and ``restrict_oom_score_adj`` (the
    host may not lower a process's OOM score, which runc otherwise asks for)."""
    return "\n".join(
        [
            "version = 2",
            'root = "/var/lib/containerd"',
            'state = "/run/containerd"',
            '[plugins."io.containerd.grpc.v1.cri"]',
            '  sandbox_image = "gpufleet.local/pause:1.0"',
            "  restrict_oom_score_adj = true",
            '  [plugins."io.containerd.grpc.v1.cri".containerd]',
            "    discard_unpacked_layers = true",
            '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
            '    runtime_type = "io.containerd.runc.v2"',
            '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]',
            "      SystemdCgroup = false",
            f'      BinaryName = "{RUNC}"',
            '  [plugins."io.containerd.grpc.v1.cri".registry]',
            '    config_path = "/etc/containerd/certs.d"',
            '  [plugins."io.containerd.grpc.v1.cri".cni]',
            f'    bin_dir = "{files / "usr/lib/cni"}"',
            '    conf_dir = "/etc/cni/net.d"',
            "",
        ]
    )


def registry_hosts(url: str) -> str:
    """``certs.d/<registry>/hosts.toml``: pull from ``url`` over plain HTTP (what cloud-init
    writes on a machine when the provisioning service names a registry mirror)."""
    return f'server = "{url}"\n\n[host."{url}"]\n  capabilities = ["pull", "resolve"]\n'


def prepare(
    *,
    run_dir: Path,
    files: Path,
    fabric_socket: Path,
    apiserver_port: int,
    ca_pem: bytes,
    token: str,
    forward_ports: list[int],
    registry_mirrors: tuple[tuple[str, str], ...] = (),
) -> HostNodeConfig:
    """The node's directory with the files its overlays start with (``etc.upper``,
    ``var.upper``), as a machine has them once ``kubeadm join`` has written its part."""
    root = run_dir / "host-node"
    etc, var = root / "etc.upper", root / "var.upper"
    server = f"https://{vm.CLUSTER_ADDRESS}:{apiserver_port}"
    cgroup_root = cgroup_root_of(run_dir)
    writes = {
        etc / "kubernetes/bootstrap-kubelet.conf": bootstrap_kubeconfig(server, ca_pem, token),
        etc / "kubernetes/pki/ca.crt": ca_pem.decode(),
        etc / "containerd/config.toml": containerd_configuration(files),
        etc / "hostname": f"{NAME}\n",
        # The host's resolver is not reachable from the node's network; pods use the
        # cluster's DNS, and a host-network pod (ClusterFirstWithHostNet) too.
        etc / "resolv.conf": f"nameserver {joining.CLUSTER_DNS}\noptions ndots:5\n",
        var / "lib/kubelet/config.yaml": kubelet_configuration(cgroup_root),
    }
    for registry, url in registry_mirrors:
        writes[etc / f"containerd/certs.d/{registry}/hosts.toml"] = registry_hosts(url)
    for path, text in writes.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in ("etc.work", "var.work", "containerd", "logs"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (etc / "kubernetes/bootstrap-kubelet.conf").chmod(0o600)
    config = HostNodeConfig(
        name=NAME,
        root=str(root),
        files=str(files),
        fabric_socket=str(fabric_socket),
        forward_ports=sorted(set(forward_ports)),
        cgroup_root=cgroup_root,
        labels={well_known.LABEL_POOL: POOL},
    )
    config.save()
    return config


def process(config: HostNodeConfig, log: Path) -> ManagedProcess:
    """The runner (:func:`run`) as a component of the local cluster."""
    return ManagedProcess(
        "host-node",
        [sys.executable, "-m", "gpufleet.local.host_node", str(config.dir / "host-node.json")],
        log,
        cwd=config.dir,
    )


# -- the runner, in the host's namespaces -------------------------------------------------

CLONE_NEWNET = 0x40000000


def _child_of(pid: int, timeout: float) -> int:
    """The one child of ``pid`` (unshare's: the node's first process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)
    raise HostNodeError(f"process {pid} started no node process in {timeout:.0f} s")


def listeners_in(
    netns: Path, address: str, ports: list[int], timeout: float
) -> list[socket.socket]:
    """Listening sockets on ``address:port`` inside network namespace ``netns``, made by a
    thread that enters it (a socket stays in the namespace it was made in; the thread's
    move does not touch the rest of the process). Waits for ``address`` to be there."""
    libc = ctypes.CDLL(None, use_errno=True)
    made: list[socket.socket] = []
    problem: list[str] = []

    def work() -> None:
        fd = os.open(netns, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                problem.append(f"setns: {os.strerror(ctypes.get_errno())}")
                return
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout
        for port in ports:
            while True:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((address, port))
                    s.listen(128)
                    s.setblocking(False)
                    made.append(s)
                    break
                except OSError as exc:
                    s.close()
                    if time.monotonic() > deadline:
                        problem.append(f"{address}:{port} in the node's network: {exc}")
                        return
                    time.sleep(0.1)

    thread = threading.Thread(target=work, name="host-node-netns")
    thread.start()
    thread.join()
    if problem:
        for s in made:
            s.close()
        raise HostNodeError(problem[0])
    return made


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _forward(listeners: list[socket.socket], stop: asyncio.Event) -> None:
    """Each connection accepted inside the node to the same port on the host's loopback."""

    def handler(port: int) -> Any:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        return serve

    servers = [await asyncio.start_server(handler(s.getsockname()[1]), sock=s) for s in listeners]
    try:
        await stop.wait()
    finally:
        for server in servers:
            server.close()


def remove_cgroups(
    cgroup_root: str, timeout: float = 10.0, base: Path = Path("/sys/fs/cgroup")
) -> list[str]:
    """Removes ``cgroup_root`` from every hierarchy under ``base`` (cgroup v1's, and the
    unified one), deepest first, retrying while the killed processes leave; returns what
    stayed."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for hierarchy in sorted(base.iterdir()) if base.is_dir() else []:
            top = hierarchy / cgroup_root.lstrip("/")
            if not top.is_dir():
                continue
            dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(str(d))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _die_with_parent() -> None:
    """unshare gets SIGKILL when the runner dies, however it dies; its ``--kill-child``
    passes that on to the node's first process, whose end ends the node."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def run(config_path: Path) -> int:
    """Start the node in its namespaces, forward the host's ports into it, and on SIGTERM
    (or the node's end) stop it and remove its cgroups."""
    config = HostNodeConfig.load(config_path)
    node = subprocess.Popen(
        [
            "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--mount", "--net", "--uts", "--propagation", "private",
            sys.executable, "-m", "gpufleet.local.host_node_init", str(config_path),
        ],
        preexec_fn=_die_with_parent,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    stopped = False

    def on_signal() -> None:
        nonlocal stopped
        stopped = True
        print("host-node: stopping", flush=True)
        with contextlib.suppress(ProcessLookupError):
            node.send_signal(signal.SIGTERM)
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_signal)
    loop.add_signal_handler(signal.SIGINT, on_signal)
    code = 0
    try:
        first = _child_of(node.pid, 30)
        listeners = listeners_in(
            Path(f"/proc/{first}/ns/net"), vm.CLUSTER_ADDRESS, config.forward_ports, FORWARD_WAIT_S
        )
        print(
            f"host-node: {vm.CLUSTER_ADDRESS}:{','.join(map(str, config.forward_ports))} in the"
            " node's network forwarded to the host's 127.0.0.1",
            flush=True,
        )

        async def watch() -> None:
            while node.poll() is None and not stop.is_set():
                await asyncio.sleep(0.5)
            stop.set()

        async def main() -> None:
            await asyncio.gather(_forward(listeners, stop), watch())

        loop.run_until_complete(main())
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    except HostNodeError as exc:
        print(f"host-node: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        # Within the cluster's 5 s of grace: PID 1 gives its daemons STOP_GRACE_S.
        processes.end(node, 4)
        left = remove_cgroups(config.cgroup_root)
        if left:
            print(f"host-node: cgroups not removed: {', '.join(left[:5])}", file=sys.stderr)
        loop.close()
    if code or stopped:
        return code
    return node.returncode or 0  # the node ended by itself: say how


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
