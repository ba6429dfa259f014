"""The node's own view of its leaf switch beside the operator's or Topograph's label
(decision 0250): the node wins, a label that says another leaf is reported."""

from __future__ import annotations

from gpufleet.domain import topology, well_known
from gpufleet.domain.topology import LeafSource, ProblemKind, SourceKeys

KEYS = SourceKeys()
LEAF, SPINE = KEYS.leaf, KEYS.spine
GUID_A, GUID_B = "0xfc6a1c0300e7a940", "0xfc6a1c0300e7b180"


def seen(guid: str, name: str | None = None) -> dict[str, str]:
    """The labels a node's agent publishes for the switch its rail 0 is cabled to."""
    out = {well_known.LABEL_IB_SEEN_LEAF: guid}
    if name:
        out[well_known.LABEL_IB_SEEN_LEAF_NAME] = name
    return out


def test_the_nodes_own_view_is_its_leaf_and_says_so() -> None:
    fabric = topology.build(
        [
            ("n0", {SPINE: "s0", **seen(GUID_A, "leaf-07")}),
            ("n1", {SPINE: "s0", **seen(GUID_A, "leaf-07")}),
            ("n2", {LEAF: "leaf-08", SPINE: "s0"}),  # no view of its own: the label
            ("n3", {}),
        ],
        KEYS,
    )
    assert fabric.problems == ()
    assert fabric.leaves() == {GUID_A: ["n0", "n1"], "leaf-08": ["n2"]}
    assert fabric.spines() == {"s0": [GUID_A, "leaf-08"]}
    p0, p2, p3 = (fabric.placement(n) for n in ("n0", "n2", "n3"))
    assert p0 is not None and (p0.leaf_from, p0.leaf_name) == (LeafSource.NODE, "leaf-07")
    assert p2 is not None and (p2.leaf_from, p2.leaf_name) == (LeafSource.LABEL, None)
    assert p3 is not None and p3.leaf_from is None


def test_a_label_that_names_the_same_switch_agrees_in_any_form() -> None:
    fabric = topology.build(
        [
            ("n0", {LEAF: GUID_A.upper().replace("0X", "0x"), **seen(GUID_A)}),
            ("n1", {LEAF: GUID_A.removeprefix("0x"), **seen(GUID_A)}),
            ("n2", {LEAF: "leaf-07", **seen(GUID_A, "leaf-07")}),
        ],
        KEYS,
    )
    assert fabric.problems == ()
    assert fabric.leaves() == {GUID_A: ["n0", "n1", "n2"]}


def test_a_label_that_lies_about_the_leaf_is_reported_and_the_node_wins() -> None:
    fabric = topology.build(
        [
            ("n0", {LEAF: "leaf-08", SPINE: "s0", **seen(GUID_A, "leaf-07")}),
            ("n1", {LEAF: "leaf-07", SPINE: "s0", **seen(GUID_A, "leaf-07")}),
        ],
        KEYS,
    )
    (problem,) = fabric.problems
    assert problem.node == "n0" and problem.kind is ProblemKind.LABEL_CONTRADICTS_NODE
    assert "leaf-08" in problem.message and GUID_A in problem.message
    assert "(leaf-07)" in problem.message and LEAF in problem.message
    assert fabric.leaves() == {GUID_A: ["n0", "n1"]}  # written as the node sees it
    placed = fabric.placement("n0")
    assert placed is not None and placed.spine == "s0"


def test_a_node_that_moves_or_is_replaced_is_placed_where_it_is_now() -> None:
    """The topology is a function of the labels: a new leaf (moved, or new hardware
    cabled elsewhere), or a new node in the old one's place, is the new topology."""
    before = topology.build([("n0", seen(GUID_A)), ("n1", seen(GUID_A))], KEYS)
    moved = topology.build([("n0", seen(GUID_B)), ("n1", seen(GUID_A))], KEYS)
    swapped = topology.build([("n9", seen(GUID_A)), ("n1", seen(GUID_A))], KEYS)
    assert before.leaves() == {GUID_A: ["n0", "n1"]}
    assert moved.leaves() == {GUID_A: ["n1"], GUID_B: ["n0"]}
    assert swapped.leaves() == {GUID_A: ["n1", "n9"]}
    keys = topology.SchedulerKeys()
    p = moved.placement("n0")
    assert p is not None and topology.scheduler_labels(p, keys)[keys.leaf] == GUID_B


def test_a_leaf_guid_that_is_no_name_is_left_out() -> None:
    fabric = topology.build([("n0", {LEAF: "leaf-1", **seen("0x;bad")})], KEYS)
    assert [p.kind for p in fabric.problems] == [ProblemKind.INVALID_VALUE]
    assert fabric.leaves() == {"leaf-1": ["n0"]}
