"""What a machine may reach on the host (gpufleet.local.machines.vm_entry)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.local import machines, vm


def test_the_host_ports_a_machine_may_reach_are_forwarded_and_no_others(tmp_path: Path) -> None:
    entry = machines.vm_entry(
        name="vm-node-0000", mac="52:54:00:00:00:01", run_dir=tmp_path, provision_port=1001,
        apiserver_port=1002, inject_port=1003, memory_mib=1024, registry_port=1004,
        bmc_ports=[1005, 1006], host_ports=[1007],
    )  # fmt: skip
    assert entry["guest_ports"] == [1001, 1002, 1004, 1005, 1006, 1007]
    spec = vm.VmSpec(
        name="vm-node-0000", mac="52:54:00:00:00:01", boot_url="http://x/ipxe",
        console_log=tmp_path / "c.log", state_dir=tmp_path, guest_ports=tuple(entry["guest_ports"]),
    )  # fmt: skip
    nic = next(a for a in vm.argv(spec) if a.startswith("user,"))
    assert f"guestfwd=tcp:{vm.CLUSTER_ADDRESS}:1007-" in nic
    assert nic.count("guestfwd=") == 6
    assert "restrict=on" in nic


def test_a_machine_gets_the_vcpus_its_entry_names(tmp_path: Path) -> None:
    from gpufleet.local.redfish import vm_from_config

    entry = machines.vm_entry(
        name="vm-node-0000", mac="52:54:00:00:00:01", run_dir=tmp_path, provision_port=1001,
        apiserver_port=1002, inject_port=1003, memory_mib=1024, cpus=2,
    )  # fmt: skip
    args = vm.argv(vm_from_config(entry).spec)
    assert args[args.index("-smp") + 1] == "2"
    assert args[args.index("-m") + 1] == "1024"
    del entry["cpus"]  # an entry written before vCPUs were configurable: one
    args = vm.argv(vm_from_config(entry).spec)
    assert args[args.index("-smp") + 1] == "1"


def test_the_seed_disk_is_attached_read_only_and_only_when_named(tmp_path: Path) -> None:
    from gpufleet.local.redfish import vm_from_config

    entry = machines.vm_entry(
        name="vm-node-0000", mac="52:54:00:00:00:01", run_dir=tmp_path, provision_port=1001,
        apiserver_port=1002, inject_port=1003, memory_mib=1024,
        seed_disk=tmp_path / "seed.ext4",
    )  # fmt: skip
    args = vm.argv(vm_from_config(entry).spec)
    drive = args[args.index("-drive") + 1]
    assert drive.startswith(f"file={tmp_path / 'seed.ext4'},")
    assert "readonly=on" in drive.split(",")
    assert args[args.index("-boot") + 1] == "order=n,strict=on"  # it still network-boots
    del entry["seed_disk"]
    assert "-drive" not in vm.argv(vm_from_config(entry).spec)


def test_the_translation_cache_grows_with_the_machine_unless_the_accelerator_names_one(
    tmp_path: Path,
) -> None:
    def spec(memory: int, accel: str) -> vm.VmSpec:
        return vm.VmSpec(
            name="m", mac="52:54:00:00:00:01", boot_url="http://x/ipxe",
            console_log=tmp_path / "c.log", state_dir=tmp_path, memory_mib=memory, accel=accel,
        )  # fmt: skip

    def accel_of(s: vm.VmSpec) -> str:
        args = vm.argv(s)
        return args[args.index("-accel") + 1]

    assert accel_of(spec(3072, vm.TCG)) == f"{vm.TCG},tb-size=1024"
    assert accel_of(spec(1536, vm.TCG)) == f"{vm.TCG},tb-size=512"
    assert accel_of(spec(512, vm.TCG)) == f"{vm.TCG},tb-size=256"
    assert accel_of(spec(3072, "tcg,tb-size=64")) == "tcg,tb-size=64"
    assert accel_of(spec(3072, "kvm")) == "kvm"
