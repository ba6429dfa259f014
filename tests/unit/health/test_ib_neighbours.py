"""The leaf switch each HCA port is cabled to: smpquery's output, the rail-0 rule, when
the agent asks again, and both backends."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpufleet.domain import well_known
from gpufleet.health import ib_neighbours as ibn
from gpufleet.health import sysfs
from gpufleet.health.backend_real import RealHardware
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.hardware import HardwareError
from gpufleet.health.monitors import PassiveMonitors
from gpufleet.health.skus import bundled

H100 = bundled().get("h100-sxm")

# smpquery -C mlx5_0 -P 1 -D nodeinfo 0,1 against a Quantum-2 switch (libibmad's field
# format: name, ':', dots up to 32 characters, value).
NODEINFO = """\
# Node info: DR path slid 65535; dlid 65535; 0,1
BaseVers:........................1
ClassVers:.......................1
NodeType:........................Switch
NumPorts:........................65
SystemGuid:......................0xFC6A1C0300E7A940
Guid:............................0xfc6a1c0300e7a940
PortGuid:........................0xfc6a1c0300e7a940
PartCap:.........................8
DevId:...........................0xd2f2
Revision:........................0x000000a0
LocalPort:.......................17
VendorId:........................0x0002c9
"""
NODEDESC_LONG = "Node Description:.MF0;ib-leaf-sw07.fabric:MQM9700/U1\n"  # 32+ characters
NODEDESC_DEFAULT = "Node Description:...Quantum Mellanox Technologies\n"
CA_INFO = NODEINFO.replace("Switch", "Channel Adapter").replace(
    "LocalPort:" + "." * 23 + "17", "LocalPort:" + "." * 23 + "1"
)


def test_nodeinfo_gives_the_switch_guid_and_the_port_the_cable_is_on() -> None:
    info = ibn.parse_nodeinfo(NODEINFO)
    assert info == ibn.SmpNodeInfo(
        node_type="Switch",
        node_guid="0xfc6a1c0300e7a940",
        system_guid="0xfc6a1c0300e7a940",
        num_ports=65,
        local_port=17,
    )
    failed = "ibwarn: [1234] mad_rpc: _do_madrpc failed; dport (DR path 0,1)"
    assert ibn.parse_nodeinfo(failed) is None


def test_nodedesc_and_the_switch_name_in_it() -> None:
    assert ibn.parse_nodedesc(NODEDESC_LONG) == "MF0;ib-leaf-sw07.fabric:MQM9700/U1"
    assert ibn.switch_name("MF0;ib-leaf-sw07.fabric:MQM9700/U1") == "ib-leaf-sw07.fabric"
    assert ibn.switch_name("leaf-3") == "leaf-3"
    assert ibn.switch_name("Quantum Mellanox Technologies") is None  # no name, not a word
    assert ibn.parse_nodedesc(NODEDESC_DEFAULT) == "Quantum Mellanox Technologies"
    assert ibn.parse_nodedesc("") is None


def test_the_rendered_answer_is_read_back_by_the_same_codec() -> None:
    text = ibn.render_nodeinfo("0x98039b0300a1b2c3", 5)
    guid = "0x98039b0300a1b2c3"
    assert ibn.parse_nodeinfo(text) == ibn.SmpNodeInfo("Switch", guid, guid, 65, 5)
    assert ibn.parse_nodedesc(ibn.render_nodedesc("MF0;l1:MQM9700/U1")) == "MF0;l1:MQM9700/U1"


def test_a_back_to_back_cable_reaches_no_switch() -> None:
    assert ibn.neighbour("mlx5_0", 1, CA_INFO, None) is None
    n = ibn.neighbour("mlx5_0", 1, NODEINFO, NODEDESC_LONG)
    assert n is not None and (n.switch_guid, n.switch_port) == ("0xfc6a1c0300e7a940", 17)
    assert n.switch_name == "ib-leaf-sw07.fabric"


def port(hca: str, *, state: str = "ACTIVE", layer: str = "InfiniBand") -> sysfs.IbPort:
    return sysfs.IbPort(hca, 1, state, "LINKUP", 400.0, layer, node_guid="0x" + "1" * 16)


def switch(guid: int, name: str) -> tuple[str, str]:
    return ibn.render_nodeinfo(f"0x{guid:016x}", 3), ibn.render_nodedesc(f"MF0;{name}:MQM9700/U1")


def test_a_rail_optimized_node_has_eight_leaves_and_rail_0s_is_its_leaf() -> None:
    """Eight HCAs, each on the leaf of its rail; a storage HCA on RoCE is no rail."""
    ports = [port(f"mlx5_{i}") for i in (10, 2, 0, 1, 3, 4, 5, 6, 7)]
    ports[0] = port("mlx5_10", layer="Ethernet")

    def ask(hca: str, p: int) -> tuple[str, str]:
        rail = int(hca.split("_")[1])
        return switch(0xA000 + rail, f"su1-rail{rail}")

    d = ibn.LeafDiscovery(ask, every_s=600)
    labels = d.labels(ports, now=0.0)
    assert labels == {
        well_known.LABEL_IB_SEEN_LEAF: "0x000000000000a000",
        well_known.LABEL_IB_SEEN_LEAF_NAME: "su1-rail0",
    }
    assert d.view is not None
    assert [h for h, _, _ in d.view.rails] == [f"mlx5_{i}" for i in range(8)]
    assert len({n.switch_guid for _, _, n in d.view.rails if n}) == 8
    assert "mlx5_7/1->0x000000000000a007[3]" in d.view.describe()


def test_rail_0_unknown_leaves_the_labels_and_no_rail_removes_them() -> None:
    def fails(hca: str, p: int) -> tuple[str, str]:
        raise HardwareError("no answer")

    d = ibn.LeafDiscovery(fails, every_s=600)
    assert d.labels([port("mlx5_0"), port("mlx5_1")], now=0.0) is None
    assert d.errors == {"mlx5_0/1": "no answer", "mlx5_1/1": "no answer"}
    down = ibn.LeafDiscovery(lambda h, p: switch(1, "x"), every_s=600)
    assert down.labels([port("mlx5_0", state="DOWN"), port("mlx5_1")], now=0.0) is None
    roce = ibn.LeafDiscovery(lambda h, p: switch(1, "x"), every_s=600)
    assert roce.labels([port("mlx5_0", layer="Ethernet")], now=0.0) == {
        well_known.LABEL_IB_SEEN_LEAF: None,
        well_known.LABEL_IB_SEEN_LEAF_NAME: None,
    }
    assert roce.labels(None, now=0.0) is None  # no InfiniBand class: unknown


def test_the_switch_is_asked_again_only_when_something_changed_or_it_is_due() -> None:
    asked: list[str] = []

    def ask(hca: str, p: int) -> tuple[str, str]:
        asked.append(hca)
        return switch(7, "leaf-7")

    d = ibn.LeafDiscovery(ask, every_s=600)
    ports = [port("mlx5_0")]
    d.labels(ports, now=0.0)
    d.labels(ports, now=10.0)
    assert asked == ["mlx5_0"]
    replaced = [dataclasses.replace(ports[0], node_guid="0x" + "2" * 16)]  # new hardware
    d.labels(replaced, now=20.0)
    assert len(asked) == 2
    d.labels(replaced, now=620.0)  # due
    assert len(asked) == 3


def test_the_simulated_node_publishes_its_leaf_and_moves() -> None:
    hw = SimulatedHardware(
        node="gpu-node-0001", ib_leaf="0xfc6a1c0300e7a900", ib_leaf_name="leaf-00"
    )
    try:
        monitors = PassiveMonitors(hw, H100, node="gpu-node-0001", ib_rediscover_s=0)
        snap = monitors.poll(1.0)
        assert snap.labels is not None
        assert snap.labels[well_known.LABEL_IB_SEEN_LEAF] == "0xfc6a1c0300e7a900"
        assert snap.labels[well_known.LABEL_IB_SEEN_LEAF_NAME] == "leaf-00"
        assert snap.ports[0].node_guid is not None and snap.ports[0].sm_lid == 1
        view = monitors.leaves.view
        assert view is not None and len({n.switch_guid for _, _, n in view.rails if n}) == 8
        hw.cable_to("0xfc6a1c0300e7a9ff")  # moved to a switch without a name
        snap = monitors.poll(2.0)
        assert snap.labels is not None
        assert snap.labels[well_known.LABEL_IB_SEEN_LEAF] == "0xfc6a1c0300e7a9ff"
        assert snap.labels[well_known.LABEL_IB_SEEN_LEAF_NAME] is None
        hw.cable_to(None)  # no subnet manager answers: unknown, the labels stay
        assert monitors.poll(3.0).labels is not None  # the NVLink ones only
        assert well_known.LABEL_IB_SEEN_LEAF not in (monitors.poll(4.0).labels or {})
    finally:
        hw.close()


def test_sysfs_gives_the_hcas_guid_and_the_sm_lid(tmp_path: Path) -> None:
    written = dataclasses.replace(port("mlx5_0"), node_guid="0xfc6a1c0300e7a941", sm_lid=0x1A)
    sysfs.write_ib_port(tmp_path, written)
    (read,) = sysfs.read_ib_ports(tmp_path) or []
    assert (read.node_guid, read.sm_lid) == ("0xfc6a1c0300e7a941", 26)
    assert (
        tmp_path / sysfs.IB_CLASS / "mlx5_0" / "node_guid"
    ).read_text() == "fc6a:1c03:00e7:a941\n"
    assert sysfs.parse_guid("garbage") is None and sysfs.parse_lid("x") is None


def test_the_real_backend_without_smpquery_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    hw = RealHardware(sysfs_root=Path("/nonexistent"))
    try:
        with pytest.raises(HardwareError, match="infiniband-diags"):
            hw.ib_neighbour("mlx5_0", 1)
    finally:
        hw.close()


def test_the_simulated_backend_is_cabled_from_the_command_line() -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app
    from gpufleet.health.backends import open_backend

    hw = open_backend("simulated", node="n0", sim_ib_leaf="0xfc6a1c0300e7a900:leaf-00")
    try:
        found = ibn.LeafDiscovery(hw.ib_neighbour, every_s=600)
        assert found.labels(sysfs.read_ib_ports(Path(hw.sysfs_root)), now=0.0) == {
            well_known.LABEL_IB_SEEN_LEAF: "0xfc6a1c0300e7a900",
            well_known.LABEL_IB_SEEN_LEAF_NAME: "leaf-00",
        }
    finally:
        hw.close()
    runner = CliRunner()
    for args, why in (
        (["--backend", "simulated", "--sim-ib-leaf", "leaf-00"], "give the switch GUID"),
        (["--backend", "real", "--sim-ib-leaf", "0x1"], "needs --backend simulated"),
    ):
        r = runner.invoke(app, ["agent", "--node", "n0", "--no-kube", *args])
        assert r.exit_code == 2 and why in r.output, r.output
