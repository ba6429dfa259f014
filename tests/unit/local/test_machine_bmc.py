"""A machine BMC powers its VM: resets become power operations, PowerState reads the
truth, a stop nobody asked for is logged as a crash; and the VM's qemu command line
keeps the machine on its own network with only the cluster's ports forwarded.

The VM here is a stand-in recording the calls (the real qemu machine is exercised by
the end-to-end test); what is checked is the BMC's side of the contract."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.local import joining, redfish, vm


class RecordingVm:
    """What :class:`gpufleet.local.vm.Vm` offers the BMC, with the calls recorded."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[str] = []
        self.crashes = 0

    def is_on(self) -> bool:
        return self.on

    def power_on(self) -> bool:
        self.calls.append("power_on")
        was, self.on = self.on, True
        return not was

    def power_off(self, *, grace: float = 0.0) -> bool:
        self.calls.append(f"power_off(grace={grace:g})")
        was, self.on = self.on, False
        return was

    def reset(self) -> None:
        self.calls.append("reset")
        self.on = True

    def crash(self) -> None:
        self.on = False
        self.crashes += 1


def _bmc() -> tuple[redfish.BmcState, RecordingVm]:
    machine = RecordingVm()
    return redfish.BmcState(node="vm-node-0000", vm=machine, power_state="Off"), machine  # type: ignore[arg-type]


def _settle(bmc: redfish.BmcState) -> None:
    """Wait for the BMC's background power steps to finish (bounded), then read."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        t.name == f"power-{bmc.node}" for t in threading.enumerate()
    ):
        time.sleep(0.01)
    with bmc.lock:
        bmc.refresh()


def test_on_force_off_and_restarts_act_on_the_machine() -> None:
    bmc, machine = _bmc()
    with bmc.lock:
        bmc.reset("On")
    _settle(bmc)
    assert machine.calls == ["power_on"] and bmc.power_state == "On"
    with bmc.lock:
        bmc.reset("ForceRestart")
    _settle(bmc)
    with bmc.lock:
        bmc.reset("PowerCycle")
    _settle(bmc)
    with bmc.lock:
        bmc.reset("ForceOff")
    _settle(bmc)
    assert machine.calls == [
        "power_on",
        "reset",
        "power_off(grace=0)",
        "power_on",
        "power_off(grace=0)",
    ]
    assert bmc.power_state == "Off"
    assert bmc.boot_count == 3 and bmc.reset_count == 4


def test_a_graceful_restart_presses_the_button_then_starts_a_new_machine() -> None:
    bmc, machine = _bmc()
    machine.on = True
    with bmc.lock:
        bmc.reset("GracefulRestart")
    _settle(bmc)
    assert machine.calls == [f"power_off(grace={redfish.BmcState.GRACE_S:g})", "power_on"]
    assert bmc.power_state == "On"


def test_every_boot_of_a_diskless_machine_is_a_network_boot() -> None:
    bmc, _machine = _bmc()
    with bmc.lock:
        bmc.patch_system({"Boot": {"BootSourceOverrideTarget": "Pxe"}})
        bmc.reset("On")
    _settle(bmc)
    assert bmc.last_boot_source == "Pxe" and bmc.boot_enabled == "Disabled"
    with bmc.lock:
        bmc.reset("ForceRestart")
    _settle(bmc)
    assert bmc.last_boot_source == "Pxe"


def test_power_state_reads_the_machine_and_a_crash_is_logged() -> None:
    bmc, machine = _bmc()
    with bmc.lock:
        bmc.reset("On")
    _settle(bmc)
    machine.crash()
    with bmc.lock:
        bmc.refresh()
        rendered: Any = redfish.render(bmc, redfish.SYSTEM)
    assert rendered["PowerState"] == "Off"
    crash = [e for e in bmc.log if e["MessageId"] == "Gpufleet.1.0.SystemCrashed"]
    assert len(crash) == 1 and crash[0]["Severity"] == "Critical"
    with bmc.lock:
        bmc.refresh()  # the same crash is logged once
    assert len([e for e in bmc.log if e["MessageId"] == "Gpufleet.1.0.SystemCrashed"]) == 1


def test_an_emulated_bmc_keeps_its_old_behaviour() -> None:
    bmc = redfish.BmcState(node="gpu-node-0000")
    with bmc.lock:
        bmc.refresh()
        bmc.reset("ForceOff")
    assert bmc.power_state == "Off"
    with bmc.lock:
        bmc.reset("On")
    assert bmc.power_state == "On" and bmc.last_boot_source == "Hdd"


def test_the_qemu_command_line_isolates_the_machine(tmp_path: Path) -> None:
    spec = vm.VmSpec(
        name="vm-node-0000",
        mac="52:54:00:67:00:00",
        boot_url="http://10.0.2.100:8080/ipxe?mac=52:54:00:67:00:00",
        console_log=tmp_path / "console.log",
        state_dir=tmp_path,
        memory_mib=1536,
        serial="SN-vm-node-0000",
        uuid="6f1c9a52-1d7e-5a53-9a0e-3f0c3d5b8e11",
        forwards=(vm.Forward(40001, 9401),),
        guest_ports=(8080, 6443),
        accel=vm.TCG,
    )
    argv = vm.argv(spec)
    nic = argv[argv.index("-nic") + 1].split(",")
    assert "restrict=on" in nic and "mac=52:54:00:67:00:00" in nic
    assert "guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:8080" in nic
    assert "guestfwd=tcp:10.0.2.100:6443-cmd:socat - TCP:127.0.0.1:6443" in nic
    assert "hostfwd=tcp:127.0.0.1:40001-:9401" in nic
    assert "bootfile=http://10.0.2.100:8080/ipxe?mac=52:54:00:67:00:00" in nic
    assert argv[argv.index("-accel") + 1] == "tcg,thread=multi,tb-size=512"  # 1536 MiB / 3
    assert argv[argv.index("-smp") + 1] == "1" and argv[argv.index("-m") + 1] == "1536"
    assert argv[argv.index("-smbios") + 1] == "type=1,serial=SN-vm-node-0000"
    # The kubelet's systemUUID and the BMC's UUID name the same machine (decision 0073).
    assert argv[argv.index("-uuid") + 1] == "6f1c9a52-1d7e-5a53-9a0e-3f0c3d5b8e11"
    assert not any(a.startswith("-drive") or a == "-hda" for a in argv)  # no disk


def test_a_paravirtual_kvm_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_VM_ACCEL", raising=False)
    real_exists = Path.exists
    monkeypatch.setattr("os.access", lambda *_: True)
    monkeypatch.setattr(
        Path,
        "exists",
        lambda self: (
            str(self) in ("/sys/module/kvm_pvm", "/sys/module/kvm_intel")
            or (real_exists(self) and not str(self).startswith("/sys/module/"))
        ),
    )
    assert vm.accelerator() == vm.TCG
    monkeypatch.setattr(Path, "exists", lambda self: str(self) == "/sys/module/kvm_intel")
    assert vm.accelerator() == "kvm"
    monkeypatch.setenv("GPUFLEET_VM_ACCEL", "tcg")
    assert vm.accelerator() == "tcg"


def test_the_join_objects_name_the_machines_address_and_kubeadms_groups() -> None:
    objects = joining.objects(
        server="https://10.0.2.100:6443", ca_pem=b"-----BEGIN CERTIFICATE-----\n", version="v1.36.3"
    )
    by_name = {body["metadata"]["name"]: body for _, body in objects}
    info = by_name["cluster-info"]["data"]["kubeconfig"]
    assert "server: https://10.0.2.100:6443" in info
    assert (
        "controlPlaneEndpoint: 10.0.2.100:6443"
        in by_name["kubeadm-config"]["data"]["ClusterConfiguration"]
    )
    autoapprove = by_name["kubeadm:node-autoapprove-bootstrap"]
    assert autoapprove["subjects"][0]["name"] == "system:bootstrappers:kubeadm:default-node-token"
    assert autoapprove["roleRef"]["name"].endswith(":nodeclient")


def test_a_missing_node_image_stops_start_up_naming_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.local import machines
    from gpufleet.local.processes import ComponentError

    (tmp_path / "vmlinuz").write_bytes(b"x")
    with pytest.raises(ComponentError, match=r"missing initrd.img, rootfs.squashfs"):
        machines.boot_dir(tmp_path)
    monkeypatch.delenv("GPUFLEET_NODE_IMAGE", raising=False)
    monkeypatch.setenv("GPUFLEET_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ComponentError, match="gpufleet local image build"):
        machines.boot_dir(None)
