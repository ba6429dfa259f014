"""The SlurmCluster operator's Kubernetes side of the fabric topology: the per-level
Node labels topology-aware schedulers read, and an Event on each node whose labels
contradict each other (decisions 0228, 0229).

Nothing here disrupts a node: a contradiction is reported (an Event on the Node, the
SlurmCluster's ``TopologyConsistent`` condition) and the contradicted field is left
out of Slurm's topology and of the labels. Only label keys gpufleet wrote (the
Node's :data:`~gpufleet.domain.well_known.ANNOTATION_TOPOLOGY_LABELS`) are changed or
removed; a key someone else set is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.domain import topology
from gpufleet.domain.enrollment import rfc3339
from gpufleet.kubeapi import NODES, ApiError, KubePort, Patch
from gpufleet.kubeapi.events import EventRecorder, event_body

log = logging.getLogger("gpufleet.slurm.topology")

COMPONENT = "gpufleet-slurm-operator"
"""The Events' reporting component."""


class TopologyReporter:
    """Writes one SlurmCluster's topology to its Nodes' labels and reports its
    contradictions, each only when it changed (a repeat is not posted every pass)."""

    def __init__(self, kube: KubePort, recorder: EventRecorder) -> None:
        self.kube = kube
        self.recorder = recorder
        self._reported: dict[str, frozenset[str]] = {}
        """Node -> the problem messages last posted for it."""

    async def apply(
        self,
        items: Sequence[Mapping[str, Any]],
        members: set[str],
        was_member: set[str],
        fabric: topology.FabricTopology,
        keys: topology.SchedulerKeys | None,
        now: float,
    ) -> None:
        """Label ``members`` by ``fabric`` (``keys`` None: remove what gpufleet wrote),
        take gpufleet's labels off Nodes that left (``was_member``), post new problems."""
        for node in items:
            name = node["metadata"]["name"]
            if name in members:
                place = fabric.placement(name) or topology.Placement(name)
                want = {} if keys is None else topology.scheduler_labels(place, keys)
            elif name in was_member:
                want = {}
            else:
                continue
            meta = node["metadata"]
            patch = topology.label_patch(
                meta.get("labels") or {}, meta.get("annotations") or {}, want
            )
            if patch is not None:
                await self.kube.patch(NODES, name, {"metadata": patch}, kind=Patch.STRATEGIC)
        await self._post(fabric, members, now)

    async def _post(self, fabric: topology.FabricTopology, members: set[str], now: float) -> None:
        for name in sorted(members):
            messages = frozenset(p.message for p in fabric.problems_of(name))
            if messages == self._reported.get(name, frozenset()):
                continue
            self._reported[name] = messages
            for message in sorted(messages):
                event = event_body(
                    involved={"apiVersion": "v1", "kind": "Node", "name": name},
                    type_="Warning",
                    reason=topology.REASON,
                    message=message,
                    component=COMPONENT,
                    instance=COMPONENT,
                    namespace="default",
                    first=rfc3339(now),
                )
                try:
                    await self.recorder.record("default", event)
                except ApiError as e:  # an Event never holds up the config
                    log.warning("node=%s topology Event not posted: %s", name, e)


def summary(fabric: topology.FabricTopology) -> tuple[bool, str]:
    """The SlurmCluster's ``TopologyConsistent`` condition: (status, message)."""
    if not fabric.problems:
        return True, (
            f"{len(fabric.leaves())} leaf switches, {len(fabric.blocks())} blocks, "
            f"{len(fabric.domains())} NVLink domains"
        )
    nodes = sorted({p.node for p in fabric.problems})
    first = fabric.problems[0]
    return False, (
        f"{len(nodes)} node(s) left out of part of the topology "
        f"({', '.join(nodes[:5])}{', ...' if len(nodes) > 5 else ''}); "
        f"{first.node}: {first.message}"
    )
