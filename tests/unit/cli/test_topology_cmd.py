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


def test_a_tray_held_with_its_faulty_domain_is_marked(tmp_path: Path) -> None:
    """The controller's hold of a faulty NVLink domain (decision 0240) shows per tray."""
    from dataclasses import replace

    import yaml

    from gpufleet.domain import domain_faults, well_known
    from gpufleet.domain.records import Incident, NodeRecord, record_to_json
    from gpufleet.domain.states import NodeState

    doc = yaml.safe_load(EXAMPLE.read_text())
    nodes = doc["items"] if isinstance(doc, dict) else doc
    first = nodes[0]
    held = Incident(domain_faults.KEY, "NVLink domain x faulty: switch", 1.0, None)
    record = replace(NodeRecord.new(first["metadata"]["name"], at=0.0, state=NodeState.DRAINING),
                     incident=held)  # fmt: skip
    first["metadata"].setdefault("annotations", {})[well_known.ANNOTATION_RECORD] = record_to_json(
        record
    )
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["topology", "-f", str(path), "-o", "json"])
    assert r.exit_code == 0, r.output
    marks = {n["name"]: n["heldWithDomain"] for n in json.loads(r.stdout)["nodes"]}
    assert marks[first["metadata"]["name"]] and sum(marks.values()) == 1
    table = runner.invoke(app, ["topology", "-f", str(path), "-o", "wide"])
    assert "(held: faulty)" in table.stdout
