"""The operator's Kubernetes side of the topology: scheduler labels and contradiction Events."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpufleet.domain import topology, well_known
from gpufleet.kubeapi.events import EventRecorder
from gpufleet.slurm import topology_labels

from .fakes import RecordingKube

LEAF, SPINE = "network.topology.kubernetes.io/block", "network.topology.kubernetes.io/spine"
KEYS = topology.SchedulerKeys()


class EventKube(RecordingKube):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[Mapping[str, Any]] = []

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.events.append(event)


def node(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}}


def run(
    kube: EventKube,
    reporter: topology_labels.TopologyReporter,
    items: list[dict],
    members: set[str],
    was: set[str] | None = None,
    keys: topology.SchedulerKeys | None = KEYS,
) -> None:
    fabric = topology.build(
        (
            (n["metadata"]["name"], n["metadata"]["labels"])
            for n in items
            if n["metadata"]["name"] in members
        ),
        topology.SourceKeys(),
    )
    asyncio.run(reporter.apply(items, members, was or set(), fabric, keys, 1_800_000_000.0))


def test_members_get_their_levels_and_a_node_that_left_loses_only_gpufleets_labels() -> None:
    kube = EventKube()
    reporter = topology_labels.TopologyReporter(kube, EventRecorder(kube))
    items = [
        node("n0", {LEAF: "leaf0", SPINE: "s0"}),
        node(
            "gone",
            {KEYS.leaf: "leaf9", "other/label": "x"},
            {well_known.ANNOTATION_TOPOLOGY_LABELS: KEYS.leaf},
        ),
        node("stranger", {KEYS.leaf: "theirs"}),
    ]
    run(kube, reporter, items, {"n0"}, {"gone"})
    patches = dict(kube.patches)
    assert patches["n0"]["metadata"]["labels"] == {KEYS.leaf: "leaf0", KEYS.spine: "s0"}
    assert patches["gone"]["metadata"]["labels"] == {KEYS.leaf: None}
    assert "stranger" not in patches  # not a member, never labelled by gpufleet
    assert kube.events == []


def test_a_contradiction_is_one_warning_event_per_change_and_never_a_node_change() -> None:
    kube = EventKube()
    reporter = topology_labels.TopologyReporter(kube, EventRecorder(kube))
    items = [node("n0", {LEAF: "leaf0", SPINE: "s0"}), node("n1", {LEAF: "leaf0", SPINE: "s1"})]
    run(kube, reporter, items, {"n0", "n1"}, keys=None)
    run(kube, reporter, items, {"n0", "n1"}, keys=None)  # the same again: not posted again
    assert [(e["involvedObject"]["name"], e["reason"], e["type"]) for e in kube.events] == [
        ("n0", "TopologyContradiction", "Warning"),
        ("n1", "TopologyContradiction", "Warning"),
    ]
    assert "leaf switch leaf0 is under two spines" in kube.events[0]["message"]
    assert kube.patches == []  # labels off: nothing written, nothing cordoned or tainted
    consistent, message = topology_labels.summary(
        topology.build(
            ((n["metadata"]["name"], n["metadata"]["labels"]) for n in items), topology.SourceKeys()
        )
    )
    assert not consistent and "2 node(s)" in message
