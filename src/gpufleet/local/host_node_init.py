"""The host node's first process: PID 1 of its namespaces (:mod:`gpufleet.local.host_node`).

It does what a machine's systemd does with the node image's units, in their order:
its filesystems (``/etc`` and ``/var`` overlays, ``/run``, containerd's root), its
network (loopback with the cluster address, the fabric's ``tap0`` with the node
address, forwarding), then containerd with the node image's pause and netcheck images,
the kubelet (TLS bootstrap with the token in ``bootstrap-kubelet.conf``), and once the
kubelet has its credentials the node image's ``pod-network`` (CNI from the Node's pod
subnet), ``pod-network --routes`` and kube-proxy. Long-running ones are restarted
when they exit, as their units are (``Restart=always``).

As PID 1 it reaps every orphan (containerd's shims end up here). On SIGTERM it stops
its children and exits; the kernel then ends every other process of the namespace.
Its output is the runner's log; each daemon logs to ``<root>/logs/<name>.log``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.local import vm
from gpufleet.local.host_node import FABRIC_MAC, FABRIC_PREFIX, TAP, HostNodeConfig

RESTART_S = 5.0
STOP_GRACE_S = 3.0
WAIT_S = 60.0
SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
    "net/bridge/bridge-nf-call-ip6tables": "1",
}
"""The node image's sysctl.d/90-kubernetes.conf, for this network namespace."""


class InitError(RuntimeError):
    pass


def sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise InitError(f"{' '.join(argv)}: {done.stderr.strip()}")


def mount_filesystems(config: HostNodeConfig) -> None:
    """``/etc`` and ``/var`` copy-on-write over the host's (upper layers in the run
    directory), containerd's root on the run directory's filesystem (an overlay cannot
    hold overlay snapshots), a fresh ``/run``. All private to this mount namespace."""
    root = config.dir
    for top in ("etc", "var"):
        layers = f"lowerdir=/{top},upperdir={root}/{top}.upper,workdir={root}/{top}.work"
        sh("mount", "-t", "overlay", "overlay", "-o", layers, f"/{top}")
    Path("/var/lib/containerd").mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", str(root / "containerd"), "/var/lib/containerd")
    sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
    Path("/run/gpufleet").mkdir(parents=True)


def create_cgroup_root(cgroup_root: str) -> None:
    """The kubelet's ``cgroupRoot`` in every hierarchy (it refuses to start without it),
    its cpuset given the host's CPUs and memory nodes (a new cpuset has none, and no
    task can join it then)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if not hierarchy.is_dir():
            continue
        top = hierarchy / cgroup_root.lstrip("/")
        top.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists() and not (top / name).read_text().strip():
                (top / name).write_text((hierarchy / name).read_text())


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise InitError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)


@dataclass
class Daemon:
    """A long-running child, restarted RESTART_S after it exits (its unit's Restart=)."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    exited_at: float | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"# {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )  # fmt: skip
        self.exited_at = None
        print(f"host-node: {self.name} started (pid {self.proc.pid})", flush=True)

    def tend(self, now: float) -> None:
        if self.proc is None:
            return
        code = self.proc.poll()
        if code is None:
            return
        if self.exited_at is None:
            self.exited_at = now
            print(f"host-node: {self.name} exited ({code}); restart in {RESTART_S:g} s", flush=True)
        elif now - self.exited_at >= RESTART_S:
            self.start()


class Node:
    def __init__(self, config: HostNodeConfig) -> None:
        self.config = config
        self.files = Path(config.files)
        self.logs = config.dir / "logs"
        self.daemons: list[Daemon] = []
        self.stopping = False
        os.environ["PATH"] = f"{self.files / 'usr/bin'}:/usr/sbin:/usr/bin:/sbin:/bin"

    def daemon(self, name: str, *argv: str) -> Daemon:
        d = Daemon(name, list(argv), self.logs / f"{name}.log")
        d.start()
        self.daemons.append(d)
        return d

    def network(self) -> None:
        """Loopback with the cluster address; the fabric switch as ``tap0``."""
        for key, value in SYSCTLS.items():
            path = Path("/proc/sys") / key
            if path.exists():
                path.write_text(value)
        sh("ip", "link", "set", "lo", "up")
        sh("ip", "addr", "add", f"{vm.CLUSTER_ADDRESS}/32", "dev", "lo")
        self.daemon("fabric", "vde_plug2tap", "--sock", self.config.fabric_socket, TAP)
        # Asked of the kernel (netlink), not /sys: this namespace's sysfs is the host's.
        wait_for(TAP, lambda: _has_link(TAP))
        sh("ip", "link", "set", TAP, "address", FABRIC_MAC)
        sh("ip", "addr", "add", f"{self.config.address}/{FABRIC_PREFIX}", "dev", TAP)
        sh("ip", "link", "set", TAP, "up")
        Path("/run/gpufleet/fabric").write_text(f"{TAP} {self.config.address}\n")

    def containerd(self) -> None:
        self.daemon("containerd", "containerd", "--config", "/etc/containerd/config.toml")
        wait_for("containerd socket", Path("/run/containerd/containerd.sock").exists)
        for image in ("pause.tar", "netcheck.tar"):
            sh("ctr", "--namespace", "k8s.io", "images", "import", "--all-platforms",
               str(self.files / "usr/lib/gpufleet" / image))  # fmt: skip

    def kubelet(self) -> None:
        labels = ",".join(f"{k}={v}" for k, v in self.config.labels.items())
        self.daemon(
            "kubelet",
            "kubelet",
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--config=/var/lib/kubelet/config.yaml",
            f"--node-ip={self.config.address}",
            f"--node-labels={labels}",
        )

    def pod_network(self) -> bool:
        """The node image's pod-network, once the kubelet has its kubeconfig; then its
        routes loop and kube-proxy. False while the kubelet has not joined yet."""
        if not Path("/etc/kubernetes/kubelet.conf").exists():
            return False
        script = str(self.files / "usr/lib/gpufleet/pod-network")
        done = subprocess.run(["python3", script], capture_output=True, text=True, timeout=400)
        print(f"host-node: pod-network: {(done.stdout + done.stderr).strip()}", flush=True)
        if done.returncode != 0:
            return False
        self.daemon("pod-routes", "python3", script, "--routes")
        proxy_config = self.files / "usr/lib/gpufleet/kube-proxy.yaml"
        self.daemon("kube-proxy", "kube-proxy", f"--config={proxy_config}")
        return True

    def reap(self) -> None:
        """PID 1's duty: collect every exited orphan (containerd's shims end up here).
        A daemon collected here first reads as exited with 0 to its ``poll``: restarted
        just the same."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def run(self) -> int:
        socket.sethostname(self.config.name)
        mount_filesystems(self.config)
        self.network()
        self.containerd()
        create_cgroup_root(self.config.cgroup_root)
        self.kubelet()
        networked = False
        last_try = 0.0
        while not self.stopping:
            now = time.monotonic()
            for d in self.daemons:
                d.tend(now)
            if not networked and now - last_try > 2:
                last_try = now
                networked = self.pod_network()
            self.reap()
            time.sleep(0.5)
        return 0

    def stop(self, *_: object) -> None:
        self.stopping = True
        for d in reversed(self.daemons):
            if d.proc is not None and d.proc.poll() is None:
                d.proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(
            d.proc is not None and d.proc.poll() is None for d in self.daemons
        ):
            time.sleep(0.1)
        print("host-node: stopped", flush=True)
        sys.exit(0)


def _has_link(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def main(config_path: str) -> int:
    node = Node(HostNodeConfig.load(Path(config_path)))
    signal.signal(signal.SIGTERM, node.stop)
    signal.signal(signal.SIGINT, node.stop)
    try:
        return node.run()
    except InitError as exc:
        print(f"host-node: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
