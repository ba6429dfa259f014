"""``gpufleet topology``: where each node sits in the fabric (spine, leaf switch, block,
NVLink domain) and which labels contradict each other, read the way the SlurmCluster
operator reads them (:mod:`gpufleet.domain.topology`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.options import KubeconfigOpt, kubeconfig_arg
from gpufleet.cli.output import Column, Format, OutputOpt, emit, table

if TYPE_CHECKING:
    from rich.console import RenderableType

    from gpufleet.domain.topology import FabricTopology, Placement

_DEFAULTS = {
    "leaf": "network.topology.kubernetes.io/block",
    "spine": "network.topology.kubernetes.io/spine",
    "nvlink": "network.topology.nvidia.com/accelerator",
}
"""The SlurmCluster's defaults (spec.topology; a unit test keeps them equal)."""

COLUMNS = [
    Column("NODE"),
    Column("SPINE"),
    Column("LEAF"),
    Column("LEAF FROM"),
    Column("BLOCK", cut=24),
    Column("NVLINK DOMAIN", cut=24),
    Column("PROBLEM", cut=60),
]


def topology(
    kubeconfig: KubeconfigOpt = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="Read the Nodes from this file (JSON or YAML: kubectl get nodes -o json, a "
            "List, or a list of Node objects) instead of the cluster.",
        ),
    ] = None,
    tree: Annotated[
        bool, typer.Option("--tree", help="Draw spine > leaf > nodes instead of a table.")
    ] = False,
    leaf_label: Annotated[
        str, typer.Option(help="The Node label naming the leaf switch.")
    ] = _DEFAULTS["leaf"],
    spine_label: Annotated[str, typer.Option(help="The Node label naming the spine.")] = _DEFAULTS[
        "spine"
    ],
    block_label: Annotated[
        str, typer.Option(help="The Node label naming the Slurm block ('': the NVLink domain).")
    ] = "",
    nvlink_label: Annotated[
        str,
        typer.Option(help="The Node label an operator or Topograph sets to the NVLink domain."),
    ] = _DEFAULTS["nvlink"],
    output: OutputOpt = Format.TABLE,
) -> None:
    """Show the fabric topology: spine, leaf switch, block and NVLink domain per node.

    Read from the Nodes' labels (an operator's or Topograph's, and the NVLink clique and
    InfiniBand leaf switch the node's own agent reports) the way the SlurmCluster operator
    reads them. LEAF FROM says where the leaf came from: "node" (the switch the node's
    rail 0 is cabled to, named by its GUID, its own name in brackets) or "label"; a node
    whose labels contradict each other shows the problem, and the contradicted part is
    empty (it is left out of Slurm's topology and of the scheduler labels too), except a
    leaf label that contradicts the node's own view: the node's view is shown and
    written. The label options are the SlurmCluster's spec.topology fields
    (docs/slurm.md, "Topology").

    Example:

        gpufleet topology --context prod-east --tree
        kubectl get nodes -o json > nodes.json; gpufleet topology -f nodes.json -o json
    """
    from gpufleet.domain import topology as topo

    nodes = _from_file(file) if file is not None else _from_cluster(kubeconfig)
    keys = topo.SourceKeys(
        leaf=leaf_label, spine=spine_label, block=block_label, nvlink_domain=nvlink_label
    )
    fabric = topo.build(
        (
            (
                str((n.get("metadata") or {}).get("name", "")),
                (n.get("metadata") or {}).get("labels") or {},
            )
            for n in nodes
        ),
        keys,
    )
    held = _held(nodes)
    emit(
        output,
        as_data(fabric, held),
        lambda wide: _tree(fabric) if tree else _table(fabric, wide, held),
    )


def _held(nodes: list[dict[str, Any]]) -> set[str]:
    """The Nodes the controller holds with their faulty NVLink domain (their record's
    incident is the domain's: docs/decisions/0240); shown, never trusted for a decision."""
    from gpufleet.domain import domain_faults, well_known
    from gpufleet.domain.records import record_from_json

    out: set[str] = set()
    for n in nodes:
        meta = n.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(well_known.ANNOTATION_RECORD)
        try:
            record = record_from_json(str(text)) if text else None
        except ValueError:
            continue
        if record is not None and domain_faults.held(record.incident):
            out.add(str(meta.get("name", "")))
    return out


def as_data(fabric: FabricTopology, held: set[str] | None = None) -> dict[str, Any]:
    """What ``-o json|yaml`` prints (``held``: the nodes held with their NVLink domain)."""
    held = held or set()
    return {
        "nodes": [
            {
                "name": p.node,
                "spine": p.spine,
                "leaf": p.leaf,
                "leafFrom": None if p.leaf_from is None else str(p.leaf_from),
                "leafName": p.leaf_name,
                "block": p.block,
                "nvlinkDomain": p.nvlink_domain,
                "heldWithDomain": p.node in held,
            }
            for p in fabric.placements
        ],
        "spines": fabric.spines(),
        "leaves": fabric.leaves(),
        "blocks": fabric.blocks(),
        "problems": [
            {"node": p.node, "kind": str(p.kind), "message": p.message} for p in fabric.problems
        ],
    }


def _table(fabric: FabricTopology, wide: bool, held: set[str] | None = None) -> RenderableType:
    held = held or set()
    rows = [
        [
            p.node,
            p.spine or "-",
            p.leaf or "-",
            _leaf_from(p),
            p.block or "-",
            (p.nvlink_domain or "-") + (" (held: faulty)" if p.node in held else ""),
            "; ".join(x.message for x in fabric.problems_of(p.node)) or "-",
        ]
        for p in fabric.placements
    ]
    return table(COLUMNS, rows, wide=wide)


def _leaf_from(p: Placement) -> str:
    if p.leaf_from is None:
        return "-"
    return f"{p.leaf_from} ({p.leaf_name})" if p.leaf_name else str(p.leaf_from)


def _tree(fabric: FabricTopology) -> RenderableType:
    from rich.tree import Tree

    from gpufleet.domain import hostlist

    root = Tree("fabric")
    leaves = fabric.leaves()
    named = {p.leaf: f" ({p.leaf_name})" for p in fabric.placements if p.leaf and p.leaf_name}
    under: set[str] = set()
    for spine, names in fabric.spines().items():
        branch = root.add(f"spine {spine}")
        for leaf in names:
            branch.add(f"leaf {leaf}{named.get(leaf, '')}: {hostlist.compress(leaves[leaf])}")
            under.add(leaf)
    for leaf in sorted(set(leaves) - under):
        nodes = hostlist.compress(leaves[leaf])
        root.add(f"leaf {leaf}{named.get(leaf, '')} (no spine): {nodes}")
    blocks = root.add("blocks")
    for block, names in fabric.blocks().items():
        blocks.add(f"{block}: {hostlist.compress(names)}")
    if fabric.problems:
        problems = root.add("problems")
        for p in fabric.problems:
            problems.add(f"{p.node}: {p.message}")
    return root


def _from_file(path: Path) -> list[dict[str, Any]]:
    import yaml

    from gpufleet.cli.errors import fail

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        fail(f"cannot read Nodes from {path}: {e}")
    items = doc.get("items") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and doc.get("kind") == "Node":
        items = [doc]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        fail(
            f"{path} holds no Node objects",
            hint="give kubectl get nodes -o json output, a List, or a list of Nodes",
        )
    return items


def _from_cluster(kubeconfig: Path | None) -> list[dict[str, Any]]:
    import asyncio

    from gpufleet.kubeapi import NODES, KubeApi

    async def read() -> list[dict[str, Any]]:
        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
        return (await client.list(NODES)).items

    return asyncio.run(read())
