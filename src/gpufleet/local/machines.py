"""Real machines in the local cluster: qemu VMs that network-boot and join with kubeadm.

``gpufleet local up --machines N`` (``ClusterSpec(machines=N)``) adds, beside the
KWOK nodes, N stateless machines (``vm-node-0000`` ...), each with

- a MAC, a serial (``SN-<name>``) and a Redfish BMC of its own that really powers
  it (:mod:`gpufleet.local.redfish` with a :class:`~gpufleet.local.vm.Vm`);
- a ``Machine`` object (gpufleet.io) naming that MAC, serial and BMC (its
  credentials in a Secret in ``gpufleet-system``), expecting the simulated HGX
  H100 the agent reports on a machine without GPUs;
- a console log ``logs/machine-<name>.console.log`` (the serial port, appended
  across power cycles).

The cluster also runs ``gpufleet provision serve`` as its ``provision``
component: it answers the machines' iPXE, cloud-init and token requests, and
serves the node image's kernel, initrd and root image from the image cache
(``/boot/<file>``). The control plane is started ready for ``kubeadm join``
(:mod:`gpufleet.local.pki`, :mod:`gpufleet.local.joining`).

Start-up ends by pressing each machine's power button through its BMC
(``ComputerSystem.Reset On``); it does not wait for the machines to join (a
boot under software emulation takes a minute or more): the lifecycle
controller, the tests and the demo watch the Nodes for that.
"""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.api import crds
from gpufleet.api.machine import MachineSpec, manifest
from gpufleet.api.names import GROUP, VERSION
from gpufleet.clock import SYSTEM_CLOCK
from gpufleet.domain import well_known
from gpufleet.gate import Gate
from gpufleet.kubeapi import ApiError, KubeApi
from gpufleet.kubeapi.machines import MachineStore
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import vm
from gpufleet.local.processes import ManagedProcess
from gpufleet.remediate import machine_power, redfish

Json = dict[str, Any]
SYSTEM_NS = "gpufleet-system"
"""Where the machines' BMC Secrets are (the controller's namespace in the local cluster)."""
MACHINE_PREFIX = "vm-node-"
POOL = "machines"
GPU_MODEL = "NVIDIA-H100-80GB-HBM3"
"""What the agent's simulated backend reports (8 GPUs, 8 HCAs)."""
AGENT_INJECT_PORT = 9401
"""The agent's fault-injection port inside a machine (the host reaches it by ``hostfwd``)."""
MACHINES = f"/apis/{GROUP}/{VERSION}/machines"
BOOT_FILES = {"kernel": "vmlinuz", "initrd": "initrd.img", "image": "rootfs.squashfs"}
"""The node image's files in its cache directory (``gpufleet local image build``)."""


AGENT_ARGS = (
    f"--backend simulated --inject-port {AGENT_INJECT_PORT} --inject-address 0.0.0.0 "
    "--metrics-port 0 --interval 2 --policy-name default"
)
"""The agent on a machine: simulated GPUs (it has none), the fault-injection API for the
host, no metrics endpoint (nothing scrapes it), a poll every 2 s (1 vCPU under emulation),
and the FleetPolicy ``default`` to judge with, as the chart's agent reads the controller's
(with the kubelet's credentials: :func:`gpufleet.local.joining.objects` lets nodes read
FleetPolicies; until one exists the agent fails closed)."""


@dataclass(frozen=True)
class BootFiles:
    """What the provisioning service serves at ``/boot``: the node image and the agent's wheel."""

    dir: Path
    wheel: str
    wheel_sha256: str


def prepare_boot_files(run_dir: Path, image: Path) -> BootFiles:
    """``<run_dir>/boot``: the node image's files and a wheel of this gpufleet (the image
    has the agent's dependencies, not gpufleet: it changes with every commit)."""
    import hashlib
    import os
    import shutil

    from gpufleet.local.processes import ComponentError
    from gpufleet.local.wheel import WheelError, build_wheel

    out = run_dir / "boot"
    out.mkdir(parents=True, exist_ok=True)
    for name in BOOT_FILES.values():
        # A hard link (a copy across filesystems): the cluster keeps booting its image
        # even when the cache entry is replaced by a rebuild while it runs.
        target = out / name
        target.unlink(missing_ok=True)
        try:
            os.link(image / name, target)
        except OSError:
            shutil.copyfile(image / name, target)
    try:
        wheel = build_wheel(out)
    except WheelError as exc:
        raise ComponentError("machines", None, f"the machines' agent wheel: {exc}") from exc
    return BootFiles(out, wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())


def boot_dir(explicit: Path | None) -> Path:
    """The node image the machines boot: ``explicit``, ``$GPUFLEET_NODE_IMAGE``, or this
    checkout's entry of the node image cache. Fails naming what is missing."""
    import os

    from gpufleet.local import node_image
    from gpufleet.local.processes import ComponentError

    if explicit is None and os.environ.get("GPUFLEET_NODE_IMAGE"):
        explicit = Path(os.environ["GPUFLEET_NODE_IMAGE"])
    if explicit is None:
        try:
            return node_image.require().directory
        except node_image.NodeImageError as exc:
            raise ComponentError("machines", None, str(exc)) from None
    missing = [f for f in BOOT_FILES.values() if not (explicit / f).is_file()]
    if missing:
        raise ComponentError(
            "machines", None, f"node image {explicit}: missing {', '.join(missing)}"
        )
    return explicit


@dataclass(frozen=True)
class MachineInfo:
    """One real machine of a running local cluster."""

    name: str
    mac: str
    serial: str
    console_log: str
    """The machine's serial console (its screen), appended across power cycles."""
    inject_url: str
    """The agent's fault-injection API inside the machine, from the host."""
    memory_mib: int
    cpus: int = 1

    @property
    def console(self) -> Path:
        return Path(self.console_log)


def names(count: int) -> list[str]:
    return [f"{MACHINE_PREFIX}{i:04d}" for i in range(count)]


def mac_of(index: int) -> str:
    """A locally administered MAC per machine (qemu's 52:54:00 prefix)."""
    return f"52:54:00:67:{index // 256:02x}:{index % 256:02x}"


FABRIC_MAC_PREFIX = "52:54:01:67"
"""The fabric NIC's MACs: the node image's ``gpufleet-fabric`` recognises the NIC by it."""
FABRIC_SUBNET = "10.1.0.0/16"
"""Node addresses on the fabric: apart from qemu's 10.0.2.0/24, the pod range
10.128.0.0/9 and the service range."""


def fabric_mac_of(index: int) -> str:
    return f"{FABRIC_MAC_PREFIX}:{index // 256:02x}:{index % 256:02x}"


def fabric_address_of(mac: str) -> str:
    """The node address the image derives from a fabric MAC (``10.1.0.1`` for index 0),
    as ``scripts/node-image/files/usr/lib/gpufleet/fabric`` does."""
    import ipaddress

    parts = mac.split(":")
    index = int(parts[4], 16) * 256 + int(parts[5], 16)
    return str(ipaddress.ip_network(FABRIC_SUBNET)[index + 1])


def fabric_switch(run_dir: Path) -> ManagedProcess:
    """The fabric's switch (``vde_switch``; it stops at end of input, so a pipe that never
    ends feeds it). Its control directory is ``<run_dir>/fabric``."""
    sock = run_dir / "fabric"
    return ManagedProcess(
        "fabric",
        ["sh", "-c", f'sleep 2147483647 | exec vde_switch --sock "{sock}" --numports 64'],
        run_dir / "logs" / "fabric.log",
        cwd=run_dir,
    )


def console_log(logs: Path, name: str) -> Path:
    return logs / f"machine-{name}.console.log"


def boot_url(provision_port: int, mac: str) -> str:
    """What the machine's iPXE chains to (qemu's DHCP hands it over as the boot file)."""
    return f"http://{vm.CLUSTER_ADDRESS}:{provision_port}/ipxe?mac={mac}"


def vm_entry(
    *,
    name: str,
    mac: str,
    run_dir: Path,
    provision_port: int,
    apiserver_port: int,
    inject_port: int,
    memory_mib: int,
    cpus: int = 1,
    registry_port: int | None = None,
    bmc_ports: list[int] | tuple[int, ...] = (),
    host_ports: list[int] | tuple[int, ...] = (),
    fabric: Path | None = None,
    fabric_mac: str = "",
    seed_disk: Path | None = None,
) -> Json:
    """The ``vm`` object of the machine's BMC entry in the Redfish emulator's config."""
    return {
        "name": name,
        "mac": mac,
        "serial": f"SN-{name}",
        "boot_url": boot_url(provision_port, mac),
        "console_log": str(console_log(run_dir / "logs", name)),
        "state_dir": str(run_dir / "machines"),
        "memory_mib": memory_mib,
        "cpus": cpus,
        "guest_ports": [
            provision_port,
            apiserver_port,
            *([registry_port] if registry_port is not None else []),
            *bmc_ports,
            *host_ports,
        ],
        "forwards": [[inject_port, AGENT_INJECT_PORT]],
        **({"fabric_socket": str(fabric), "fabric_mac": fabric_mac} if fabric else {}),
        **({"seed_disk": str(seed_disk)} if seed_disk is not None else {}),
    }


def cpus_of(cpus: tuple[int, ...], index: int) -> int:
    """The vCPUs of machine ``index``: ``cpus[index]``, else 1."""
    return cpus[index] if index < len(cpus) else 1


def pool_of(pools: tuple[str, ...], index: int) -> str:
    """The pool of machine ``index``: ``pools[index]``, else :data:`POOL`."""
    return pools[index] if index < len(pools) else POOL


def service_node_terms(pool: str | None) -> list[Json]:
    """Node selector expressions for the local cluster's own services (CoreDNS, the volumes
    of its StorageClass): a node of ``pool`` (a system machine or the host node, which is
    not a Machine), else any machine; never a KWOK node, which runs nothing."""
    if pool:
        return [{"key": well_known.LABEL_POOL, "operator": "In", "values": [pool]}]
    return [{"key": well_known.LABEL_MACHINE, "operator": "Exists"}]


def install_crds(api: SyncKube) -> None:
    """The gpufleet CRDs and the system namespace (kept when present)."""
    for body in crds.manifests().values():
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body)
    api.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}},
    )


def machines_established(api: SyncKube) -> bool:
    """The Machine CRD is served (objects can be created)."""
    crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/machines.{GROUP}")
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )


def register(
    api: SyncKube,
    name: str,
    mac: str,
    bmc_url: str,
    user: str,
    password: str,
    pool: str = POOL,
) -> None:
    """The machine's BMC Secret and its Machine in ``pool`` (kept when present)."""
    secret = f"bmc-{name}"
    data = {
        k: base64.b64encode(v.encode()).decode()
        for k, v in {"endpoint": bmc_url, "username": user, "password": password}.items()
    }
    api.create(
        f"/api/v1/namespaces/{SYSTEM_NS}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret}, "data": data},
    )
    spec = MachineSpec.model_validate(
        {
            "macs": [mac],
            "serial": f"SN-{name}",
            "bmc": {"endpoint": bmc_url, "credentialsSecret": f"{SYSTEM_NS}/{secret}"},
            "pool": pool,
            "hardware": {"gpuModel": GPU_MODEL, "gpuCount": 8, "hcaCount": 8},
        }
    )
    api.create(MACHINES, manifest(name, spec))


def provision_service(
    *,
    run_dir: Path,
    kubeconfig: Path,
    port: int,
    apiserver_port: int,
    boot: BootFiles,
    token_ttl_s: float,
    agent: bool = True,
    registry_mirrors: tuple[tuple[str, str], ...] = (),
) -> ManagedProcess:
    """``gpufleet provision serve`` for the machines: on 127.0.0.1, reached by them at
    :data:`~gpufleet.local.vm.CLUSTER_ADDRESS`, serving ``boot.dir`` at ``/boot``. With
    ``agent`` the machines install and run the agent from the wheel; without, the
    chart's DaemonSet is theirs."""
    public = f"http://{vm.CLUSTER_ADDRESS}:{port}"
    files = BOOT_FILES
    agent_args = [
        f"--agent-wheel-url={public}/boot/{boot.wheel}",
        f"--agent-wheel-sha256={boot.wheel_sha256}",
        f"--agent-args={AGENT_ARGS}",
    ]
    return ManagedProcess(
        "provision",
        [
            sys.executable,
            "-m",
            "gpufleet.cli.main",
            "provision",
            "serve",
            f"--kubeconfig={kubeconfig}",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--public-url={public}",
            f"--apiserver={vm.CLUSTER_ADDRESS}:{apiserver_port}",
            f"--boot-dir={boot.dir}",
            f"--kernel-url={public}/boot/{files['kernel']}",
            f"--initrd-url={public}/boot/{files['initrd']}",
            f"--image-url={public}/boot/{files['image']}",
            f"--token-ttl={token_ttl_s:g}",
            *(agent_args if agent else []),
            *(f"--registry-mirror={name}={url}" for name, url in registry_mirrors),
        ],
        run_dir / "logs" / "provision.log",
        cwd=run_dir,
    )


class PowerOnFailed(Exception):
    """A machine's power-on was refused or failed (the message names it and why)."""


def power_on(kubeconfig: Path, names: list[str]) -> None:
    """Press each machine's power button the way an operator does on Day 0
    (``gpufleet machines power-on``: BMC identity checked, re-armed, the boot recorded
    for the controller's boot watchdog, one-time network boot, On)."""

    async def go() -> None:
        api = await KubeApi.connect(str(kubeconfig))
        gate = Gate.for_operator(api, by="local-cluster", clock=SYSTEM_CLOCK)
        for name in names:
            try:
                await gate.network_boot(
                    MachineStore(api), name, by="local-cluster", now=time.time()
                )
            except (machine_power.PowerRefused, redfish.RedfishError, ApiError) as exc:
                raise PowerOnFailed(f"{name} not powered on: {exc}") from exc

    asyncio.run(go())
