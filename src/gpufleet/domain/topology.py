"""Fabric topology as data: where each node sits (leaf switch, spine, block, NVLink
domain), read from its Node labels by one codec, with the contradictions named (pure).

Two sources describe a node's place, and both arrive as Node labels:

* what the node sees itself: the agent publishes the NVLink clique its GPUs registered
  with (:data:`~gpufleet.domain.well_known.LABEL_NVLINK_CLUSTER` and
  :data:`~gpufleet.domain.well_known.LABEL_NVLINK_CLIQUE`, from NVML, decision 0093)
  and the InfiniBand switch its rail 0 is cabled to
  (:data:`~gpufleet.domain.well_known.LABEL_IB_SEEN_LEAF`, decision 0249);
* what an operator or NVIDIA's Topograph writes: leaf switch, spine, block and NVLink
  domain, under keys the SlurmCluster names (:class:`SourceKeys`).

:func:`read_node` is the one codec from labels to :class:`NodeLabels`; :func:`build`
judges the whole set and returns a :class:`FabricTopology`: one :class:`Placement` per
node with only what is consistent, and a :class:`Problem` for each contradiction (a
node claiming two NVLink domains, a label that says another domain than the node's own
view, a leaf under two spines, an NVLink domain split over two blocks, a value Slurm or
Kubernetes cannot carry). A contradicted field is left out of the placement, so it is
written neither to Slurm nor to the scheduler labels: a contradiction is reported,
never acted on (decision 0228). The leaf is the exception: where the node sees its own
leaf switch, that is its leaf, and a label that says another is reported beside it
(decision 0250).

:func:`scheduler_labels` is the other half of the codec: the per-level Node labels that
Kubernetes topology-aware schedulers (Kueue TAS, KAI) read (decision 0229).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gpufleet.domain import well_known

NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
"""What a switch, block or domain name must be: a Kubernetes label value (63
characters, alphanumeric at both ends) that Slurm takes as one word."""


class ProblemKind(StrEnum):
    """Why a node's place is (partly) left out of what is written."""

    INVALID_VALUE = "invalid-value"
    """A label value that is no switch/domain name (Slurm and Kubernetes would refuse it)."""
    TWO_NVLINK_DOMAINS = "two-nvlink-domains"
    """The node's own view names two NVLink domains (cluster and clique disagree)."""
    LABEL_CONTRADICTS_NODE = "label-contradicts-node"
    """The operator's or Topograph's NVLink domain label is not what the node's GPUs see,
    or its leaf label is not the switch the node's rail 0 is cabled to."""
    LEAF_UNDER_TWO_SPINES = "leaf-under-two-spines"
    """Nodes of one leaf switch name different spines above it."""
    DOMAIN_ACROSS_BLOCKS = "domain-across-blocks"
    """Nodes of one NVLink domain are labelled with different blocks."""


REASON = "TopologyContradiction"
"""The Event reason (and condition reason) that reports a :class:`Problem`."""


@dataclass(frozen=True, slots=True)
class Problem:
    node: str
    kind: ProblemKind
    message: str


class LeafSource(StrEnum):
    """Where a node's leaf switch came from."""

    NODE = "node"
    """The node's own view: the switch its rail 0 answers from (the agent's label)."""
    LABEL = "label"
    """The operator's or Topograph's leaf label (the node says nothing of its own)."""


@dataclass(frozen=True, slots=True)
class SourceKeys:
    """The Node label keys the topology is read from (empty: not read)."""

    leaf: str = "network.topology.kubernetes.io/block"
    spine: str = "network.topology.kubernetes.io/spine"
    block: str = ""
    """An explicit Slurm block per node; empty: the NVLink domain is the block."""
    nvlink_domain: str = "network.topology.nvidia.com/accelerator"
    """The NVLink domain as an operator or Topograph labels it (the agent's own labels
    are read always)."""


@dataclass(frozen=True, slots=True)
class SchedulerKeys:
    """The Node label keys written for Kubernetes topology-aware schedulers (empty: that
    level is not written). Kueue's Topology lists them from the widest level down,
    ending with ``kubernetes.io/hostname``."""

    spine: str = "gpufleet.io/topology-spine"
    leaf: str = "gpufleet.io/topology-leaf"
    block: str = "gpufleet.io/topology-block"
    nvlink_domain: str = "gpufleet.io/topology-nvlink-domain"


@dataclass(frozen=True, slots=True)
class NodeLabels:
    """One node's topology labels, decoded; ``problems`` lists the values refused."""

    name: str
    leaf: str | None = None
    spine: str | None = None
    block: str | None = None
    domain_label: str | None = None
    """The NVLink domain an operator or Topograph says."""
    seen_cluster: str | None = None
    """The NVLink cluster UUID the node's agent reports."""
    seen_clique: str | None = None
    """``<cluster UUID>.<clique id>`` as the node's agent reports it."""
    seen_leaf: str | None = None
    """The GUID of the leaf switch the node's agent sees its rail 0 cabled to."""
    seen_leaf_name: str | None = None
    """That switch's name, from its NodeDescription."""
    leaf_key: str = ""
    """The key the leaf label was read from (for the problems' messages)."""
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one node sits, with only what is consistent (None: unknown or contradicted)."""

    node: str
    leaf: str | None = None
    spine: str | None = None
    block: str | None = None
    nvlink_domain: str | None = None
    leaf_from: LeafSource | None = field(default=None, compare=False)
    """Where ``leaf`` came from (None: no leaf); for people, not part of the place."""
    leaf_name: str | None = field(default=None, compare=False)
    """The leaf switch's own name when the node sees it (``leaf`` is then its GUID)."""


@dataclass(frozen=True, slots=True)
class FabricTopology:
    placements: tuple[Placement, ...]
    problems: tuple[Problem, ...] = field(default=())

    def placement(self, node: str) -> Placement | None:
        return next((p for p in self.placements if p.node == node), None)

    def leaves(self) -> dict[str, list[str]]:
        """Leaf switch -> its nodes (sorted)."""
        return _group((p.leaf, p.node) for p in self.placements)

    def spines(self) -> dict[str, list[str]]:
        """Spine -> the leaf switches under it (sorted, each once)."""
        pairs = ((p.spine, p.leaf) for p in self.placements)
        return {s: sorted(set(ls)) for s, ls in _group(pairs).items()}

    def blocks(self) -> dict[str, list[str]]:
        """Block -> its nodes (sorted)."""
        return _group((p.block, p.node) for p in self.placements)

    def domains(self) -> dict[str, list[str]]:
        """NVLink domain -> its nodes (sorted)."""
        return _group((p.nvlink_domain, p.node) for p in self.placements)

    def problems_of(self, node: str) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.node == node)


_Field = Callable[[Placement], str | None]
_Say = Callable[[str, str], str]
_Drop = Callable[[Placement], Placement]


def _group(pairs: Iterable[tuple[str | None, str | None]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in pairs:
        if key is not None and value is not None:
            out.setdefault(key, []).append(value)
    return {k: sorted(v) for k, v in sorted(out.items())}


def read_node(name: str, labels: Mapping[str, str], keys: SourceKeys) -> NodeLabels:
    """The codec: a node's labels to :class:`NodeLabels`; a value that is no name is
    dropped with an ``invalid-value`` problem (the rest of the node is kept)."""
    problems: list[Problem] = []

    def value(key: str, what: str) -> str | None:
        raw = labels.get(key) if key else None
        if raw is None or raw == "":
            return None
        if not NAME.fullmatch(raw):
            problems.append(
                Problem(
                    name,
                    ProblemKind.INVALID_VALUE,
                    f"label {key}={raw!r} is no {what} name (1-63 letters, digits, '_', "
                    "'.', '-', alphanumeric at both ends): left out",
                )
            )
            return None
        return raw

    return NodeLabels(
        name=name,
        leaf=value(keys.leaf, "leaf switch"),
        spine=value(keys.spine, "spine switch"),
        block=value(keys.block, "block"),
        domain_label=value(keys.nvlink_domain, "NVLink domain"),
        seen_cluster=value(well_known.LABEL_NVLINK_CLUSTER, "NVLink cluster"),
        seen_clique=value(well_known.LABEL_NVLINK_CLIQUE, "NVLink clique"),
        seen_leaf=value(well_known.LABEL_IB_SEEN_LEAF, "leaf switch GUID"),
        seen_leaf_name=value(well_known.LABEL_IB_SEEN_LEAF_NAME, "leaf switch"),
        leaf_key=keys.leaf,
        problems=tuple(problems),
    )


def _leaf(node: NodeLabels) -> tuple[str | None, LeafSource | None, list[Problem]]:
    """The node's leaf: the switch it sees (a label naming another one is reported, not
    taken), else the label. A label agrees when it names the switch by its GUID (with or
    without ``0x``, any case) or by the name in its NodeDescription."""
    seen, said = node.seen_leaf, node.leaf
    if seen is None:
        return said, (LeafSource.LABEL if said is not None else None), []
    same = (seen.lower(), seen.lower().removeprefix("0x"), (node.seen_leaf_name or "").lower())
    if said is None or said.lower() in same:
        return seen, LeafSource.NODE, []
    named = f" ({node.seen_leaf_name})" if node.seen_leaf_name else ""
    return (
        seen,
        LeafSource.NODE,
        [
            Problem(
                node.name,
                ProblemKind.LABEL_CONTRADICTS_NODE,
                f"the leaf switch label {node.leaf_key}={said} is not the switch the node's "
                f"rail 0 is cabled to ({seen}{named}): the node's own view is written",
            )
        ],
    )


def _nvlink_domain(node: NodeLabels) -> tuple[str | None, list[Problem]]:
    """The node's NVLink domain: what its agent sees, checked against the label."""
    seen = node.seen_clique
    cluster = node.seen_cluster
    if seen is not None and cluster is not None and seen.split(".", 1)[0] != cluster:
        return None, [
            Problem(
                node.name,
                ProblemKind.TWO_NVLINK_DOMAINS,
                f"the node reports NVLink cluster {cluster} but clique {seen} "
                "(another cluster): its NVLink domain is left out",
            )
        ]
    if seen is None:
        return node.domain_label, []
    said = node.domain_label
    if said is None or said in (seen, seen.split(".", 1)[0]):
        return seen, []
    return None, [
        Problem(
            node.name,
            ProblemKind.LABEL_CONTRADICTS_NODE,
            f"the NVLink domain label says {said} but the node's GPUs registered with "
            f"{seen}: its NVLink domain is left out",
        )
    ]


def nvlink_domain_of(name: str, labels: Mapping[str, str], label_key: str) -> str:
    """One node's NVLink domain, as :func:`build` places it ("" for none: no label, or a
    contradiction, which is reported by the topology, never acted on): the failure
    domain a per-domain disruption budget counts the node under (decision 0232). A
    value that is no name is left out, as in :func:`build`."""
    read = read_node(name, labels, SourceKeys(leaf="", spine="", nvlink_domain=label_key))
    domain, _ = _nvlink_domain(read)
    return domain or ""


def build(nodes: Iterable[tuple[str, Mapping[str, str]]], keys: SourceKeys) -> FabricTopology:
    """The topology of ``nodes`` (name, labels): placements with the contradictions left
    out, and one problem per node and contradiction."""
    read = sorted((read_node(n, labels, keys) for n, labels in nodes), key=lambda r: r.name)
    problems: list[Problem] = [p for r in read for p in r.problems]
    placements: dict[str, Placement] = {}
    for r in read:
        domain, found = _nvlink_domain(r)
        leaf, leaf_from, lied = _leaf(r)
        problems += found + lied
        placements[r.name] = Placement(
            node=r.name,
            leaf=leaf,
            spine=r.spine if leaf else None,
            block=r.block if r.block is not None else domain,
            nvlink_domain=domain,
            leaf_from=leaf_from,
            leaf_name=r.seen_leaf_name if leaf_from is LeafSource.NODE else None,
        )
    problems += _split_groups(
        placements,
        group=lambda p: p.leaf,
        value=lambda p: p.spine,
        kind=ProblemKind.LEAF_UNDER_TWO_SPINES,
        say=lambda leaf, seen: (
            f"leaf switch {leaf} is under two spines ({seen}): it is written without a spine"
        ),
        drop=lambda p: replace(p, spine=None),
    )
    if keys.block:
        problems += _split_groups(
            placements,
            group=lambda p: p.nvlink_domain,
            value=lambda p: p.block,
            kind=ProblemKind.DOMAIN_ACROSS_BLOCKS,
            say=lambda domain, seen: (
                f"NVLink domain {domain} is labelled with two blocks "
                f"({seen}): its nodes are left out of the blocks"
            ),
            drop=lambda p: replace(p, block=None),
        )
    ordered = tuple(placements[n] for n in sorted(placements))
    return FabricTopology(ordered, tuple(sorted(problems, key=lambda p: (p.node, p.kind))))


def _split_groups(
    placements: dict[str, Placement],
    *,
    group: _Field,
    value: _Field,
    kind: ProblemKind,
    say: _Say,
    drop: _Drop,
) -> list[Problem]:
    """Groups (a leaf, a domain) whose members disagree on ``value`` (its spine, its
    block): every member loses ``value`` and gets a problem naming who said what."""
    said: dict[str, dict[str, list[str]]] = {}
    for p in placements.values():
        g, v = group(p), value(p)
        if g is not None and v is not None:
            said.setdefault(g, {}).setdefault(v, []).append(p.node)
    problems: list[Problem] = []
    for g, values in said.items():
        if len(values) < 2:
            continue
        seen = "; ".join(f"{v} from {', '.join(sorted(ns))}" for v, ns in sorted(values.items()))
        for name, p in list(placements.items()):
            if group(p) == g:
                placements[name] = drop(p)
                problems.append(Problem(name, kind, say(g, seen)))
    return problems


def scheduler_labels(p: Placement, keys: SchedulerKeys) -> dict[str, str | None]:
    """The scheduler labels ``p`` asks for: each key of ``keys`` with its value, or None
    (remove) where the level is unknown or contradicted."""
    out: dict[str, str | None] = {}
    for key, val in (
        (keys.spine, p.spine),
        (keys.leaf, p.leaf),
        (keys.block, p.block),
        (keys.nvlink_domain, p.nvlink_domain),
    ):
        if key:
            out[key] = val
    return out


OWNED_ANNOTATION = well_known.ANNOTATION_TOPOLOGY_LABELS


def owned_keys(annotations: Mapping[str, str]) -> list[str]:
    """The scheduler label keys gpufleet wrote on a Node (its :data:`OWNED_ANNOTATION`)."""
    return [k for k in (annotations.get(OWNED_ANNOTATION) or "").split(",") if k]


def label_patch(
    labels: Mapping[str, str], annotations: Mapping[str, str], want: Mapping[str, str | None]
) -> dict[str, dict[str, str | None]] | None:
    """The metadata patch that brings a Node's scheduler labels to ``want``, touching only
    keys gpufleet wrote (listed in :data:`OWNED_ANNOTATION`) or that are absent; None when
    nothing changes. A key someone else set is left as it is and never claimed."""
    owned = set(owned_keys(annotations))
    patch: dict[str, str | None] = {}
    now_owned = set()
    for key in sorted(set(want) | owned):
        target = want.get(key)
        mine = key in owned
        if not mine and key in labels:
            continue  # someone else's label: not ours to change
        if labels.get(key) != target:
            patch[key] = target
        if target is not None:
            now_owned.add(key)
    ann = ",".join(sorted(now_owned)) or None
    if not patch and ann == (annotations.get(OWNED_ANNOTATION) or None):
        return None
    return {"labels": patch, "annotations": {OWNED_ANNOTATION: ann}}
