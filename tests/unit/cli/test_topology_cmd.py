"""``gpufleet topology`` offline, from a file of Node objects (examples/topology/nodes.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.api import slurmcluster as crd
from gpufleet.cli import topology_cmd
from gpufleet.cli.main import app

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "topology" / "nodes.yaml"
runner = CliRunner()


def test_json_has_each_node_its_blocks_and_the_lying_label() -> None:
    r = runner.invoke(app, ["topology", "-f", str(EXAMPLE), "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["nodes"]) == 8
    assert doc["spines"] == {"ib-spine-00": ["ib-leaf-000", "ib-leaf-001"]}
    assert sorted(len(ns) for ns in doc["blocks"].values()) == [3, 4]  # gb200-07 left out
    (problem,) = doc["problems"]
    assert problem["node"] == "gb200-07" and problem["kind"] == "label-contradicts-node"


def test_the_tree_and_the_table_name_the_places() -> None:
    tree = runner.invoke(app, ["topology", "-f", str(EXAMPLE), "--tree"])
    assert tree.exit_code == 0, tree.output
    assert "leaf ib-leaf-000: gb200-[00-03]" in tree.stdout
    table = runner.invoke(app, ["topology", "-f", str(EXAMPLE), "-o", "wide"])
    assert "gb200-07" in table.stdout and "label says" in table.stdout


def test_a_file_without_nodes_is_refused_with_a_hint(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("just: a mapping\n")
    r = runner.invoke(app, ["topology", "-f", str(bad)])
    assert r.exit_code != 0 and "holds no Node objects" in r.output


def test_the_label_defaults_are_the_slurmclusters() -> None:
    spec = crd.Topology()
    assert {
        "leaf": spec.leaf_label,
        "spine": spec.spine_label,
        "nvlink": spec.nvlink_domain_label,
    } == topology_cmd._DEFAULTS
