"""topology.conf (tree and block) and topology.yaml from the Nodes' topology."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpufleet.api import slurmcluster as crd
from gpufleet.domain import well_known
from gpufleet.slurm import render

UUID = "3f1c2b7e-8a4d-4c1e-9b2a-0d6e5f4a3b21"
LEAF, SPINE = "network.topology.kubernetes.io/block", "network.topology.kubernetes.io/spine"


def spec(**topology: Any) -> crd.SlurmClusterSpec:
    return crd.SlurmClusterSpec.model_validate(
        {
            "nodePools": [{"name": "gb200", "nodeSelector": {"gpu": "true"}, "gpus": 4}],
            "partitions": [{"name": "batch", "pools": ["gb200"], "default": True}],
            "topology": topology,
        }
    )


def tray(i: int, rack: int, **extra: str) -> render.NodeInfo:
    """A GB200 tray: two racks (NVLink domains) of four, one leaf per rack, one spine."""
    labels = {
        "gpu": "true",
        LEAF: f"leaf{rack}",
        SPINE: "spine0",
        well_known.LABEL_NVLINK_CLUSTER: f"{UUID[:-1]}{rack}",
        well_known.LABEL_NVLINK_CLIQUE: f"{UUID[:-1]}{rack}.1",
        **extra,
    }
    return render.NodeInfo(f"gb-{i:02d}", labels)


TRAYS = [tray(i, i // 4) for i in range(8)]


def test_the_tree_is_rendered_as_before() -> None:
    data = render.render_all(spec(), TRAYS)
    assert "TopologyPlugin=topology/tree" in data["slurm.conf"]
    assert data["topology.conf"].splitlines()[1:] == [
        "SwitchName=leaf0 Nodes=gb-[00-03]",
        "SwitchName=leaf1 Nodes=gb-[04-07]",
        "SwitchName=spine0 Switches=leaf0,leaf1",
    ]


def test_blocks_are_the_nvlink_domains_with_the_block_sizes_asked() -> None:
    data = render.render_all(spec(plugin="block", blockSizes=[2, 4]), TRAYS)
    assert "TopologyPlugin=topology/block" in data["slurm.conf"]
    assert data["topology.conf"].splitlines()[1:] == [
        f"BlockName={UUID[:-1]}0.1 Nodes=gb-[00-03]",
        f"BlockName={UUID[:-1]}1.1 Nodes=gb-[04-07]",
        "BlockSizes=2,4",
    ]


def test_a_labelled_block_replaces_the_domain() -> None:
    nodes = [tray(i, i // 4, **{"example.com/block": f"b{i // 4}"}) for i in range(8)]
    data = render.render_all(spec(plugin="block", blockLabel="example.com/block"), nodes)
    assert "BlockName=b0 Nodes=gb-[00-03]" in data["topology.conf"]


def test_a_contradicted_node_is_left_out_of_its_block() -> None:
    nodes = [*TRAYS[:3], tray(3, 0, **{"network.topology.nvidia.com/accelerator": "other"})]
    topo = render.render_all(spec(plugin="block"), nodes)["topology.conf"]
    assert f"BlockName={UUID[:-1]}0.1 Nodes=gb-[00-02]" in topo
    assert "gb-03" not in topo


@pytest.mark.parametrize("plugin", ["tree", "block"])
def test_topology_yaml_is_for_slurm_25_05_and_names_no_plugin_in_slurm_conf(plugin: str) -> None:
    data = render.render_all(spec(plugin=plugin, file="topology.yaml", blockSizes=[4]), TRAYS)
    assert "topology.conf" not in data
    assert "TopologyPlugin" not in data["slurm.conf"]
    (doc,) = yaml.safe_load(data["topology.yaml"])
    assert doc["topology"] == "default" and doc["cluster_default"] is True
    if plugin == "block":
        assert doc["block"] == {
            "blocks": [
                {"block": f"{UUID[:-1]}0.1", "nodes": "gb-[00-03]"},
                {"block": f"{UUID[:-1]}1.1", "nodes": "gb-[04-07]"},
            ],
            "block_sizes": [4],
        }
    else:
        assert doc["tree"]["switches"] == [
            {"switch": "leaf0", "nodes": "gb-[00-03]"},
            {"switch": "leaf1", "nodes": "gb-[04-07]"},
            {"switch": "spine0", "children": "leaf0,leaf1"},
        ]


def test_a_disabled_topology_writes_no_file_and_no_plugin() -> None:
    data = render.render_all(spec(enabled=False), TRAYS)
    assert "TopologyPlugin" not in data["slurm.conf"]
    assert not {"topology.conf", "topology.yaml"} & set(data)


def test_the_spec_refuses_a_bad_label_key_and_an_unknown_plugin() -> None:
    with pytest.raises(ValueError, match="blockLabel"):
        spec(blockLabel="has space")
    with pytest.raises(ValueError, match="plugin"):
        spec(plugin="dragonfly")
