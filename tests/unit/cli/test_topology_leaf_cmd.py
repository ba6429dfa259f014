"""``gpufleet topology`` says where each leaf came from: the node's own view or a label."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.main import app

runner = CliRunner()
LEAF = "network.topology.kubernetes.io/block"


def node(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


def test_the_leaf_source_and_a_lying_label(tmp_path: Path) -> None:
    agent = {
        "gpufleet.io/ib-seen-leaf": "0xfc6a1c0300e7a940",
        "gpufleet.io/ib-seen-leaf-name": "leaf-07",
    }
    nodes = tmp_path / "nodes.json"
    nodes.write_text(
        json.dumps(
            {
                "items": [
                    node("gpu-0", agent),
                    node("gpu-1", {**agent, LEAF: "leaf-08"}),
                    node("gpu-2", {LEAF: "leaf-08"}),
                ]
            }
        )
    )
    r = runner.invoke(app, ["topology", "-f", str(nodes), "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    by = {n["name"]: n for n in doc["nodes"]}
    assert (by["gpu-0"]["leafFrom"], by["gpu-0"]["leafName"]) == ("node", "leaf-07")
    assert by["gpu-1"]["leaf"] == "0xfc6a1c0300e7a940" and by["gpu-1"]["leafFrom"] == "node"
    assert (by["gpu-2"]["leaf"], by["gpu-2"]["leafFrom"]) == ("leaf-08", "label")
    (problem,) = doc["problems"]
    assert problem["node"] == "gpu-1" and problem["kind"] == "label-contradicts-node"
    table = runner.invoke(app, ["topology", "-f", str(nodes), "-o", "wide"])
    assert "node (leaf-07)" in table.stdout and "label" in table.stdout
    tree = runner.invoke(app, ["topology", "-f", str(nodes), "--tree"])
    assert "leaf 0xfc6a1c0300e7a940 (leaf-07) (no spine): gpu-[0-1]" in tree.stdout
