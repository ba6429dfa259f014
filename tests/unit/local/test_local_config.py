"""Pure checks of what gpufleet.local generates: no processes, no ports bound."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.local import binaries, kube, processes, redfish, slurm
from gpufleet.local.cluster import BmcEndpoint, ClusterInfo, ClusterSpec

ROOT = Path(__file__).resolve().parents[3]


def _layout(tmp_path: Path, nodes: int = 3, gpus: int = 8) -> slurm.SlurmLayout:
    names = tuple(f"gpu-node-{i:04d}" for i in range(nodes))
    return slurm.SlurmLayout(
        root=tmp_path / "slurm",
        logs=tmp_path / "logs",
        nodes=names,
        gpus_per_node=gpus,
        cpus_per_node=64,
        real_memory_mib=4096,
        ctld_port=7000,
        slurmd_ports=tuple(range(7100, 7100 + nodes)),
        restd_port=7200,
        hostname="host",
    )


def test_slurm_conf_has_one_node_line_per_node_with_its_own_port(tmp_path: Path) -> None:
    conf = slurm.render_slurm_conf(_layout(tmp_path))
    node_lines = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [line.split()[0] for line in node_lines] == [
        "NodeName=gpu-node-0000",
        "NodeName=gpu-node-0001",
        "NodeName=gpu-node-0002",
    ]
    assert [line.split("Port=")[1].split()[0] for line in node_lines] == ["7100", "7101", "7102"]
    assert all("Gres=gpu:8" in line and "NodeAddr=127.0.0.1" in line for line in node_lines)
    assert "SlurmctldHost=host(127.0.0.1)" in conf
    assert f"AuthInfo=socket={tmp_path}/slurm/run/munge.socket,cred_expire=5" in conf
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in conf


def test_nodes_without_slurmd_are_one_line_with_one_shared_port(tmp_path: Path) -> None:
    layout = dataclasses.replace(
        _layout(tmp_path, nodes=2),
        defined_only=tuple(f"gpu-node-{i:04d}" for i in range(2, 12500)),
        defined_only_port=7999,
    )
    conf = slurm.render_slurm_conf(layout)
    node_lines = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [line.split()[0] for line in node_lines] == [
        "NodeName=gpu-node-0000",
        "NodeName=gpu-node-0001",
        "NodeName=gpu-node-[0002-9999],gpu-node-[10000-12499]",  # a range per name width
    ]
    assert "Port=7999" in node_lines[-1]
    assert "PartitionName=batch Nodes=gpu-node-[0000-9999],gpu-node-[10000-12499] " in conf
    assert len(conf) < 10_000  # not a line per node: every Slurm command parses this file
    # slurmctld pings every node a third of SlurmdTimeout apart; 12,498 never answer.
    assert f"SlurmdTimeout={slurm.SLURMD_TIMEOUT_WITHOUT_SLURMD}" in conf
    assert "SlurmdTimeout=5" in slurm.render_slurm_conf(_layout(tmp_path, nodes=2))


def test_gres_conf_points_at_character_device_paths(tmp_path: Path) -> None:
    gres = slurm.render_gres_conf(_layout(tmp_path, nodes=2, gpus=4))
    # One hostlist line for every node (12,500 lines would be parsed by every command).
    assert gres.splitlines() == [
        "AutoDetect=off",
        f"NodeName=gpu-node-[0000-0001] Name=gpu File={tmp_path}/slurm/dev/nvidia[0-3]",
    ]
    one = slurm.render_gres_conf(_layout(tmp_path, nodes=1, gpus=1))
    assert one.endswith("File=" + f"{tmp_path}/slurm/dev/nvidia0\n")


def test_node_manifest_carries_gpus_and_topology() -> None:
    node = kube.node_manifest(
        "gpu-node-0005", 5, kube.NodeShape(nodes_per_leaf=4, leaves_per_spine=2)
    )
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["network.topology.kubernetes.io/block"] == "ib-leaf-001"
    assert labels["network.topology.kubernetes.io/spine"] == "ib-spine-00"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_kubeconfig_uses_token_and_ca(tmp_path: Path) -> None:
    layout = kube.KubeLayout(tmp_path, tmp_path / "logs", 1, 2, 6443, 3, 4, token="t0k")
    config = yaml.safe_load(kube.render_kubeconfig(layout))
    assert config["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:6443",
        "certificate-authority": str(tmp_path / "pki" / "apiserver.crt"),
    }
    assert config["users"][0]["user"] == {"token": "t0k"}


def test_cache_key_matches_the_build_script() -> None:
    script = subprocess.run(
        [ROOT / "scripts" / "build-go-binaries.sh", "--print-dir"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GPUFLEET_CACHE": "/nonexistent"},
    )
    assert Path(script.stdout.strip()).name == binaries.cache_key(ROOT / "deps")


def test_cluster_info_round_trips_through_json(tmp_path: Path) -> None:
    info = ClusterInfo(
        run_dir=tmp_path,
        node_names=["a"],
        gpus_per_node=8,
        kubeconfig=tmp_path / "kubeconfig",
        apiserver_url="https://127.0.0.1:1",
        token="t",
        ca_file=tmp_path / "ca",
        etcd_url="http://127.0.0.1:2",
        slurm_conf=tmp_path / "slurm.conf",
        bmcs={"a": BmcEndpoint("a", "http://127.0.0.1:3", "admin", "pw")},
        processes=[processes.ProcessRecord("etcd", 1, 2, "log")],
    )
    again = ClusterInfo.from_json(info.to_json())
    assert again == info
    assert again.slurm_env()["SLURM_CONF"] == str(tmp_path / "slurm.conf")


def test_node_names_are_stable() -> None:
    assert ClusterSpec(nodes=2).node_names() == ("gpu-node-0000", "gpu-node-0001")


def test_free_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    """No outgoing connection can take a chosen port before its server binds it."""
    ports = processes.free_ports(20)
    assert len(set(ports)) == 20
    ephemeral = processes._ephemeral_range()
    assert all(p in processes.LISTEN_PORTS and p not in ephemeral for p in ports)


class _Offers:
    """Offers the given ports first, then random ones from the range."""

    def __init__(self, *first: int) -> None:
        self.offers = list(first)
        self.rest = random.Random(7)

    def choice(self, seq: list[int]) -> int:
        return self.offers.pop(0) if self.offers else self.rest.choice(seq)


def test_a_port_in_use_is_not_chosen() -> None:
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        (chosen,) = processes.free_ports(1, rng=_Offers(taken))  # type: ignore[arg-type]
        assert chosen != taken
    finally:
        busy.close()


def test_a_port_handed_out_before_is_not_chosen_again_while_its_server_is_still_starting() -> None:
    """The demo picks its agents' ports, then the cluster picks its daemons' ports: no
    server is listening yet on the first ones, but they must not be handed out twice."""
    (first,) = processes.free_ports(1)
    (second,) = processes.free_ports(1, rng=_Offers(first, first))  # type: ignore[arg-type]
    assert second != first


def test_process_record_recognises_a_live_process() -> None:
    me = processes.ProcessRecord("me", os.getpid(), processes.start_time_of(os.getpid()) or 0, "")
    assert me.alive()
    assert not processes.ProcessRecord("me", os.getpid(), me.start_time + 1, "").alive()


class TestBmcState:
    def test_force_off_then_on(self) -> None:
        bmc = redfish.BmcState("n0")
        bmc.reset("ForceOff")
        assert bmc.power_state == "Off"
        bmc.reset("On")
        assert (bmc.power_state, bmc.boot_count) == ("On", 1)

    def test_once_override_is_consumed_by_the_next_boot(self) -> None:
        bmc = redfish.BmcState("n0")
        bmc.patch_system({"Boot": {"BootSourceOverrideTarget": "Pxe"}})
        assert bmc.boot_enabled == "Once"
        bmc.reset("PowerCycle")
        assert bmc.last_boot_source == "Pxe"
        assert (bmc.boot_enabled, bmc.boot_target) == ("Disabled", "None")
        bmc.reset("ForceRestart")
        assert bmc.last_boot_source == "Hdd"
        assert [e["MessageId"].rsplit(".", 1)[1] for e in bmc.log] == [
            "BootOverrideSet",
            "ResetRequested",
            "PowerOff",
            "SystemBooted",
            "ResetRequested",
            "PowerOff",
            "SystemBooted",
        ]

    def test_bad_values_are_rejected(self) -> None:
        bmc = redfish.BmcState("n0")
        with pytest.raises(redfish.RedfishError) as err:
            bmc.reset("Explode")
        assert err.value.status == 400
        with pytest.raises(redfish.RedfishError):
            bmc.patch_system({"Boot": {"BootSourceOverrideEnabled": "Sometimes"}})
        with pytest.raises(redfish.RedfishError):
            bmc.patch_system({"AssetTag": "x"})

    def test_system_resource_is_dmtf_shaped(self) -> None:
        system = redfish.render(redfish.BmcState("n0"), redfish.SYSTEM)
        assert system is not None
        assert system["@odata.type"].startswith("#ComputerSystem.")
        reset = system["Actions"]["#ComputerSystem.Reset"]
        assert reset["target"].endswith("/Actions/ComputerSystem.Reset")
        assert "PowerCycle" in reset["ResetType@Redfish.AllowableValues"]


def test_sweep_finds_job_processes_by_their_slurm_conf(tmp_path: Path) -> None:
    """An srun or job script started outside the run dir is tied to it only by SLURM_CONF."""
    import os
    import subprocess
    import sys

    from gpufleet.local import processes

    run = tmp_path / "run"
    (run / "slurm" / "etc").mkdir(parents=True)
    conf = {"SLURM_CONF": str(run / "slurm" / "etc" / "slurm.conf")}
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    job = subprocess.Popen(sleep, env={**os.environ, **conf, "SLURM_JOB_ID": "5"}, cwd=tmp_path)
    # A user's shell after `eval "$(gpufleet local env)"`: SLURM_CONF, but no job.
    other = subprocess.Popen(sleep, env={**os.environ, **conf}, cwd=tmp_path)
    try:
        found = processes.processes_using(run)
        assert job.pid in found and other.pid not in found
        assert job.pid in processes.sweep(run, grace=5)
        assert job.wait(timeout=5) is not None
        assert other.poll() is None
    finally:
        for p in (job, other):
            p.kill()
            p.wait()


def test_a_backup_controller_is_a_second_slurmctld_host_on_its_own_address(
    tmp_path: Path,
) -> None:
    layout = dataclasses.replace(
        _layout(tmp_path, nodes=2), backup_ctld=True, ctld_timeout_s=5, slurm_root=tmp_path
    )
    conf = slurm.render_slurm_conf(layout).splitlines()
    assert [line for line in conf if line.startswith("SlurmctldHost=")] == [
        "SlurmctldHost=gpufleet-ctld-0(127.0.0.2)",
        "SlurmctldHost=gpufleet-ctld-1(127.0.0.3)",
    ]
    # Each binds only its own address, so both listen on the one SlurmctldPort.
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in conf
    assert "SlurmctldTimeout=5" in conf
    # The pid file's directory is each controller's own (a starting slurmctld stops
    # whatever process the file names).
    assert f"SlurmctldPidFile={tmp_path}/slurm/ctld/slurmctld.pid" in conf
    # Each logs to its own stderr: a backup in control reads SlurmctldLogFile again.
    assert not [line for line in conf if line.startswith("SlurmctldLogFile=")]
    slurm.prepare(layout)
    hosts = layout.hosts_file.read_text()
    assert hosts.startswith(Path("/etc/hosts").read_text())
    assert hosts.endswith("127.0.0.2 gpufleet-ctld-0\n127.0.0.3 gpufleet-ctld-1\n")
    assert [p.name for p in sorted((tmp_path / "slurm").glob("ctld*"))] == [
        "ctld",
        "ctld-0",
        "ctld-1",
    ]


def test_a_backup_controller_needs_the_slurm_root(tmp_path: Path) -> None:
    layout = dataclasses.replace(_layout(tmp_path), backup_ctld=True)
    with pytest.raises(processes.ComponentError, match=r"needs Slurm 24\.11"):
        slurm.prepare(layout)


def test_ping_names_the_controllers_that_answer() -> None:
    text = (
        "Slurmctld(primary) at gpufleet-ctld-0 is DOWN\n"
        "Slurmctld(backup) at gpufleet-ctld-1 is UP\n"
        "*****************************************\n"
        "** RESTORE SLURMCTLD DAEMON TO SERVICE **\n"
    )
    assert slurm.parse_ping(text) == ("gpufleet-ctld-1",)
    assert slurm.parse_ping("Slurmctld(primary) at vm is UP\n") == ("vm",)
    assert slurm.parse_ping("") == ()
