"""A real machine of the local cluster: one qemu virtual machine, powered by its BMC.

The machine has no state of its own (at most a read-only image seed disk): a vCPU or
two, a little memory, one virtio NIC with a fixed MAC whose iPXE option ROM network-boots from
``gpufleet provision serve`` (qemu's built-in DHCP hands iPXE the boot URL, which
names the MAC). Powering on starts a qemu process; powering off ends it; a
forced restart is a ``system_reset`` over QMP (the firmware runs again, RAM is
gone, it network-boots again). The Redfish emulator (:mod:`gpufleet.local.redfish`)
owns the :class:`Vm` of each machine BMC, so ``ForceOff``/``On``/``ForceRestart``
act on the real thing and ``PowerState`` reads whether the process runs.

With a cluster fabric (``ClusterSpec.images``), a second virtio NIC is plugged into a
``vde_switch`` on the host (a unix socket, no host interface): the machines' node
addresses (``10.1.0.0/16``, from the NIC's MAC) and pod traffic between machines go
there (:mod:`gpufleet.local.machines`, ``gpufleet-fabric.service`` in the node image).

Networking is qemu's user mode with ``restrict=on``: the guest reaches nothing
but the ports forwarded to it at :data:`CLUSTER_ADDRESS` (the provisioning
service and the apiserver, each to the same port on the host's 127.0.0.1; no
packet leaves the host), and the host reaches the guest's agent fault-injection
port on its own loopback (``hostfwd``).

Acceleration: software emulation (TCG) unless ``/dev/kvm`` is a full KVM. A
paravirtual KVM (``kvm_pvm``) runs firmware but kills a stock kernel right after
its decompressor, so it is detected and not used (``GPUFLEET_VM_ACCEL`` overrides).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

QEMU = "qemu-system-x86_64"
TCG = "tcg,thread=multi"
"""Software emulation, one host thread per vCPU; the translation cache's size is added
per machine (:func:`translation_cache_mib`)."""
TCG_CPU = "max,la57=off,pku=off"
"""The emulated CPU: every feature qemu emulates but 5-level paging and protection keys.
With plain ``max`` the guest kernel runs 5-level page tables, a path few guests take, and
qemu 7.2 crashed a machine's kernel under load: a double fault in ``__kmalloc_cache_node``
with a garbage EFLAGS in its frame, while the kubelet started pods. A Nehalem-class CPU
(x86-64-v2 only, tried with two vCPUs per machine) pulled the gpufleet image in 9 min 52 s
where ``max`` took 6 to 8 (decision 0136)."""
CLUSTER_ADDRESS = "10.0.2.100"
"""Where a machine reaches the local cluster: each allowed host port is forwarded
from this guest-side address to the same port on the host's 127.0.0.1 (one
``socat`` per connection, spawned by qemu). qemu refuses forwards on its own host
address 10.0.2.2, which ``restrict=on`` closes."""


def translation_cache_mib(memory_mib: int) -> int:
    """TCG's translation cache for a machine of ``memory_mib``: a third of its memory, 256
    to 1024 MiB. qemu's default (1 GiB) made a 1536 MiB machine a 2.1 GiB process, so small
    machines get less; but a full cache is flushed whole and every process's code
    translated again, and the chart's system machine (3072 MiB, seven pods) flushed a
    256 MiB cache 23 times in its first 12 minutes."""
    return max(256, min(1024, memory_mib // 3))


def accel_argument(spec: VmSpec) -> str:
    """``-accel``'s value: TCG gets its translation cache size unless it names one."""
    if spec.accel.startswith("tcg") and "tb-size=" not in spec.accel:
        return f"{spec.accel},tb-size={translation_cache_mib(spec.memory_mib)}"
    return spec.accel


def accelerator() -> str:
    """``kvm`` only when /dev/kvm is usable and not the paravirtual kind; else TCG."""
    explicit = os.environ.get("GPUFLEET_VM_ACCEL")
    if explicit:
        return explicit
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return TCG
    if Path("/sys/module/kvm_pvm").exists():
        return TCG
    if Path("/sys/module/kvm_intel").exists() or Path("/sys/module/kvm_amd").exists():
        return "kvm"
    return TCG


def qemu_binary() -> str | None:
    return shutil.which(QEMU)


@dataclass(frozen=True)
class Forward:
    """A TCP port of the guest reachable on the host's 127.0.0.1 (``hostfwd``)."""

    host_port: int
    guest_port: int


@dataclass(frozen=True)
class VmSpec:
    """One machine. ``boot_url`` is what its iPXE chains to (``.../ipxe?mac=<mac>``)."""

    name: str
    mac: str
    boot_url: str
    console_log: Path
    """Serial console, appended across power cycles (the machine's screen)."""
    state_dir: Path
    """QMP socket and qemu's own log."""
    memory_mib: int = 1536
    cpus: int = 1
    """vCPUs. Under software emulation each is a host thread (``thread=multi``): a second
    one lets a busy machine use a host core another machine leaves idle."""
    serial: str = ""
    """SMBIOS system serial (``/sys/class/dmi/id/product_serial``); the BMC reports the same."""
    uuid: str = ""
    """SMBIOS system UUID (the kubelet reports it as ``nodeInfo.systemUUID``); the BMC
    reports the same, and the controller checks the two agree before any power action."""
    forwards: tuple[Forward, ...] = ()
    guest_ports: tuple[int, ...] = ()
    """Host loopback ports the guest may reach, at :data:`CLUSTER_ADDRESS`."""
    fabric_socket: Path | None = None
    """The cluster fabric's switch (``vde_switch`` control directory): a second NIC on it
    carries node and pod traffic between machines; None: no second NIC."""
    fabric_mac: str = ""
    seed_disk: Path | None = None
    """The image seed disk (:mod:`gpufleet.local.image_seed`), attached read-only: every
    machine shares the one file and writes nothing to it; None: no disk."""
    accel: str = field(default_factory=accelerator)

    @property
    def qmp_socket(self) -> Path:
        return self.state_dir / f"{self.name}.qmp"

    @property
    def qemu_log(self) -> Path:
        return self.state_dir / f"{self.name}.qemu.log"


def argv(spec: VmSpec, qemu: str = QEMU, socat: str = "socat") -> list[str]:
    """The qemu command line of one power-on."""
    nic = [
        "user",
        "model=virtio-net-pci",
        f"mac={spec.mac}",
        "net=10.0.2.0/24",
        f"bootfile={spec.boot_url}",
        "restrict=on",
    ]
    nic += [
        f"guestfwd=tcp:{CLUSTER_ADDRESS}:{port}-cmd:{socat} - TCP:127.0.0.1:{port}"
        for port in spec.guest_ports
    ]
    nic += [f"hostfwd=tcp:127.0.0.1:{f.host_port}-:{f.guest_port}" for f in spec.forwards]
    return [
        qemu,
        "-name",
        f"gpufleet-machine-{spec.name}",
        "-accel",
        accel_argument(spec),
        "-cpu",
        TCG_CPU if spec.accel.startswith("tcg") else "host",
        "-smp",
        str(spec.cpus),
        "-m",
        str(spec.memory_mib),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-vga",
        "none",
        "-boot",
        "order=n,strict=on",
        "-nic",
        ",".join(nic),
        "-chardev",
        f"file,id=console,path={spec.console_log},append=on",
        "-serial",
        "chardev:console",
        "-qmp",
        f"unix:{spec.qmp_socket},server=on,wait=off",
        *(
            [
                "-netdev",
                f"vde,id=fabric,sock={spec.fabric_socket}",
                "-device",
                f"virtio-net-pci,netdev=fabric,mac={spec.fabric_mac}",
            ]
            if spec.fabric_socket is not None
            else []
        ),
        *(
            ["-drive", f"file={spec.seed_disk},if=virtio,format=raw,readonly=on"]
            if spec.seed_disk is not None
            else []
        ),
        "-device",
        "virtio-rng-pci",
        *(["-smbios", f"type=1,serial={spec.serial}"] if spec.serial else []),
        *(["-uuid", spec.uuid] if spec.uuid else []),
    ]


class QmpError(RuntimeError):
    """QMP did not answer as expected."""


def qmp(path: Path, command: str, *, timeout: float = 5.0) -> dict[str, object]:
    """Run one QMP command on a fresh connection (negotiation, command, answer)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        reader = sock.makefile("rb")
        json.loads(reader.readline())  # greeting
        sock.sendall(b'{"execute": "qmp_capabilities"}\n')
        _answer(reader)
        sock.sendall(json.dumps({"execute": command}).encode() + b"\n")
        return _answer(reader)


def _answer(reader: object) -> dict[str, object]:
    while True:
        line = reader.readline()  # type: ignore[attr-defined]
        if not line:
            raise QmpError("QMP connection closed")
        msg = json.loads(line)
        if "event" in msg:
            continue
        if "error" in msg:
            raise QmpError(str(msg["error"]))
        return dict(msg)


class Vm:
    """Power control of one machine: a qemu process per power-on."""

    def __init__(self, spec: VmSpec, *, qemu: str | None = None) -> None:
        self.spec = spec
        self.qemu = qemu or qemu_binary() or QEMU
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.power_ons = 0
        self.crashes = 0
        """qemu processes that ended without being powered off (a crash, or the guest
        powering itself off)."""
        self._expect_exit = False

    def is_on(self) -> bool:
        with self._lock:
            return self._alive()

    def _alive(self) -> bool:
        if self._proc is None:
            return False
        if self._proc.poll() is None:
            return True
        if not self._expect_exit:
            self.crashes += 1
        self._proc = None
        return False

    def power_on(self) -> bool:
        """Start the machine; False when it was on already."""
        with self._lock:
            if self._alive():
                return False
            self.spec.state_dir.mkdir(parents=True, exist_ok=True)
            self.spec.console_log.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.spec.qmp_socket.unlink()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            with self.spec.console_log.open("a") as console:
                console.write(f"\n===== gpufleet: {self.spec.name} powered on at {stamp} =====\n")
            with self.spec.qemu_log.open("ab") as log:
                log.write(f"# {' '.join(argv(self.spec, self.qemu))}\n".encode())
                log.flush()
                self._proc = subprocess.Popen(
                    argv(self.spec, self.qemu),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._expect_exit = False
            self.power_ons += 1
            return True

    def power_off(self, *, grace: float = 0.0) -> bool:
        """Stop the machine: ACPI power button and ``grace`` seconds when given (a
        graceful shutdown), then the process ends. False when it was off already."""
        with self._lock:
            if not self._alive():
                return False
            proc = self._proc
            assert proc is not None
            self._expect_exit = True
            if grace > 0:
                with contextlib.suppress(OSError, QmpError, ValueError):
                    qmp(self.spec.qmp_socket, "system_powerdown")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(grace)
            if proc.poll() is None:
                with contextlib.suppress(OSError, QmpError, ValueError):
                    qmp(self.spec.qmp_socket, "quit", timeout=2)
                try:
                    proc.wait(3)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
            # The per-connection forwarders qemu spawned share its session.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            self._proc = None
            return True

    def reset(self) -> None:
        """Hard reset (the reset line): the firmware starts again and network-boots;
        a machine that is off is powered on instead."""
        with self._lock:
            alive = self._alive()
        if not alive:
            self.power_on()
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self.spec.console_log.open("a") as console:
            console.write(f"\n===== gpufleet: {self.spec.name} reset at {stamp} =====\n")
        try:
            qmp(self.spec.qmp_socket, "system_reset")
        except (OSError, QmpError, ValueError):
            # No QMP answer: a power cycle does the same for a stateless machine.
            self.power_off()
            self.power_on()

    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._alive() and self._proc else None
