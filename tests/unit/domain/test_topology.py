"""Fabric topology from Node labels: the codec, the contradictions, the scheduler labels."""

from __future__ import annotations

from gpufleet.domain import topology, well_known
from gpufleet.domain.topology import Placement, ProblemKind, SchedulerKeys, SourceKeys

KEYS = SourceKeys()
LEAF, SPINE, DOMAIN = KEYS.leaf, KEYS.spine, KEYS.nvlink_domain
UUID_A = "3f1c2b7e-8a4d-4c1e-9b2a-0d6e5f4a3b21"
UUID_B = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def seen(uuid: str, clique: int = 1) -> dict[str, str]:
    """The labels a node's agent publishes for the NVLink clique its GPUs registered with."""
    return {
        well_known.LABEL_NVLINK_CLUSTER: uuid,
        well_known.LABEL_NVLINK_CLIQUE: f"{uuid}.{clique}",
    }


def test_labels_give_leaf_spine_and_the_nvlink_domain_as_block() -> None:
    fabric = topology.build(
        [
            ("n0", {LEAF: "leaf0", SPINE: "s0", **seen(UUID_A)}),
            ("n1", {LEAF: "leaf0", SPINE: "s0", **seen(UUID_A)}),
            ("n2", {LEAF: "leaf1", SPINE: "s0", **seen(UUID_B)}),
            ("n3", {}),
        ],
        KEYS,
    )
    assert fabric.problems == ()
    assert fabric.leaves() == {"leaf0": ["n0", "n1"], "leaf1": ["n2"]}
    assert fabric.spines() == {"s0": ["leaf0", "leaf1"]}
    assert fabric.blocks() == {f"{UUID_A}.1": ["n0", "n1"], f"{UUID_B}.1": ["n2"]}
    assert fabric.placement("n3") == Placement("n3")


def test_an_operator_label_that_agrees_with_the_node_is_taken_in_either_form() -> None:
    """Topograph may name the domain by its cluster UUID, an operator by the clique."""
    fabric = topology.build(
        [
            ("n0", {DOMAIN: UUID_A, **seen(UUID_A)}),
            ("n1", {DOMAIN: f"{UUID_A}.1", **seen(UUID_A)}),
            ("n2", {DOMAIN: "rack-7"}),  # no view of its own: the label is all there is
        ],
        KEYS,
    )
    assert fabric.problems == ()
    assert fabric.domains() == {f"{UUID_A}.1": ["n0", "n1"], "rack-7": ["n2"]}


def test_a_label_that_lies_about_what_the_node_sees_is_left_out_and_named() -> None:
    fabric = topology.build(
        [
            ("n0", {LEAF: "leaf0", DOMAIN: UUID_B, **seen(UUID_A)}),
            ("n1", {LEAF: "leaf0", **seen(UUID_A)}),
        ],
        KEYS,
    )
    (problem,) = fabric.problems
    assert problem.node == "n0" and problem.kind is ProblemKind.LABEL_CONTRADICTS_NODE
    assert UUID_B in problem.message and f"{UUID_A}.1" in problem.message
    assert fabric.placement("n0") == Placement("n0", leaf="leaf0")  # its leaf is kept
    assert fabric.blocks() == {f"{UUID_A}.1": ["n1"]}


def test_a_node_claiming_two_nvlink_domains_is_in_none() -> None:
    labels = {
        well_known.LABEL_NVLINK_CLUSTER: UUID_A,
        well_known.LABEL_NVLINK_CLIQUE: f"{UUID_B}.3",
    }
    fabric = topology.build([("n0", labels)], KEYS)
    assert [p.kind for p in fabric.problems] == [ProblemKind.TWO_NVLINK_DOMAINS]
    assert fabric.blocks() == {} and fabric.domains() == {}


def test_a_leaf_under_two_spines_is_written_without_a_spine() -> None:
    fabric = topology.build(
        [
            ("n0", {LEAF: "leaf0", SPINE: "s0"}),
            ("n1", {LEAF: "leaf0", SPINE: "s1"}),
            ("n2", {LEAF: "leaf1", SPINE: "s0"}),
        ],
        KEYS,
    )
    assert {(p.node, p.kind) for p in fabric.problems} == {
        ("n0", ProblemKind.LEAF_UNDER_TWO_SPINES),
        ("n1", ProblemKind.LEAF_UNDER_TWO_SPINES),
    }
    assert "s0 from n0; s1 from n1" in fabric.problems[0].message
    assert fabric.leaves() == {"leaf0": ["n0", "n1"], "leaf1": ["n2"]}
    assert fabric.spines() == {"s0": ["leaf1"]}


def test_an_nvlink_domain_over_two_labelled_blocks_is_in_neither() -> None:
    keys = SourceKeys(block="example.com/block")
    fabric = topology.build(
        [
            ("n0", {"example.com/block": "b0", **seen(UUID_A)}),
            ("n1", {"example.com/block": "b1", **seen(UUID_A)}),
            ("n2", {"example.com/block": "b1", **seen(UUID_B)}),
        ],
        keys,
    )
    assert {p.node for p in fabric.problems} == {"n0", "n1"}
    assert {p.kind for p in fabric.problems} == {ProblemKind.DOMAIN_ACROSS_BLOCKS}
    assert fabric.blocks() == {"b1": ["n2"]}


def test_values_that_are_no_names_are_refused_one_by_one() -> None:
    fabric = topology.build(
        [("n0", {LEAF: "leaf 0", SPINE: "s0", DOMAIN: "-bad", **seen(UUID_A)})], KEYS
    )
    assert [p.kind for p in fabric.problems] == [ProblemKind.INVALID_VALUE] * 2
    # the leaf is refused, so is the spine above no leaf; the node's own domain stays
    assert fabric.placement("n0") == Placement(
        "n0", block=f"{UUID_A}.1", nvlink_domain=f"{UUID_A}.1"
    )


def test_scheduler_labels_write_known_levels_and_remove_unknown_ones() -> None:
    keys = SchedulerKeys(nvlink_domain="")
    placement = Placement("n0", leaf="leaf0", spine=None, block="b0", nvlink_domain="d")
    assert topology.scheduler_labels(placement, keys) == {
        keys.spine: None,
        keys.leaf: "leaf0",
        keys.block: "b0",
    }


def test_the_label_patch_touches_only_keys_gpufleet_wrote_or_that_are_free() -> None:
    want = {"a/leaf": "leaf1", "a/block": "b0", "a/spine": None}
    # someone else's a/block stays; a/leaf (ours) moves; a/spine (ours) goes
    labels = {"a/leaf": "leaf0", "a/block": "theirs", "a/spine": "s0"}
    annotations = {topology.OWNED_ANNOTATION: "a/leaf,a/spine"}
    patch = topology.label_patch(labels, annotations, want)
    assert patch == {
        "labels": {"a/leaf": "leaf1", "a/spine": None},
        "annotations": {topology.OWNED_ANNOTATION: "a/leaf"},
    }
    after = {"a/leaf": "leaf1", "a/block": "theirs"}
    assert topology.label_patch(after, {topology.OWNED_ANNOTATION: "a/leaf"}, want) is None


def test_a_replaced_node_gets_its_labels_and_the_old_keys_of_a_disabled_level_go() -> None:
    """A new Node (no annotation) takes every free key; a key dropped from the spec but
    still owned is removed."""
    patch = topology.label_patch({}, {}, {"a/leaf": "leaf0"})
    assert patch == {
        "labels": {"a/leaf": "leaf0"},
        "annotations": {topology.OWNED_ANNOTATION: "a/leaf"},
    }
    gone = topology.label_patch(
        {"a/leaf": "leaf0", "a/old": "x"},
        {topology.OWNED_ANNOTATION: "a/leaf,a/old"},
        {"a/leaf": "leaf0"},
    )
    assert gone == {
        "labels": {"a/old": None},
        "annotations": {topology.OWNED_ANNOTATION: "a/leaf"},
    }


def test_cleanup_takes_off_the_scheduler_labels_gpufleet_wrote_and_no_other() -> None:
    from gpufleet.domain import uninstall

    node = {
        "metadata": {
            "name": "n0",
            "labels": {"a/leaf": "leaf0", "a/block": "theirs", LEAF: "leaf0"},
            "annotations": {topology.OWNED_ANNOTATION: "a/leaf"},
        }
    }
    plan = uninstall.cleanup(node, uninstall.Recorded())
    assert plan.patch is not None
    assert plan.patch["metadata"]["labels"] == {"a/leaf": None}
    assert plan.patch["metadata"]["annotations"] == {topology.OWNED_ANNOTATION: None}
