"""Job-aware draining: which pods leave a node, how, and when the drain is done.

Pure: :func:`plan` looks at the pods on a node and says which to evict (the
Eviction API, so PodDisruptionBudgets are respected), which to delete, and
whether anything still has to leave. The controller runs it in a loop.

Modes (policy ``drain.mode`` or a rule's ``drain``):

``wait``
    Running workloads finish on their own; only pods annotated
    ``gpufleet.io/interruptible: "true"`` are evicted at once.
``evict``
    Evict everything now; a PDB that refuses is retried until it allows.
``delete-after-timeout``
    Evict now; after the drain timeout, delete what is still there.

DaemonSet pods and static (mirror) pods never count: they belong to the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.emptiness import pod_holds_node
from gpufleet.domain.policy import DrainMode

Json = Mapping[str, Any]


def pod_id(pod: Json) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def counts(pod: Json) -> bool:
    """Whether a pod has to leave before the node is drained (domain.emptiness)."""
    return pod_holds_node(pod)


def interruptible(pod: Json) -> bool:
    annotations = pod.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(well_known.ANNOTATION_INTERRUPTIBLE, "")).lower() == "true"


@dataclass(frozen=True, slots=True)
class DrainPlan:
    evict: tuple[tuple[str, str], ...]
    delete: tuple[tuple[str, str], ...]
    remaining: int
    """Pods that still have to leave (0: drained)."""

    @property
    def done(self) -> bool:
        return self.remaining == 0


def plan(pods: Iterable[Json], *, mode: DrainMode, elapsed: float, timeout: float) -> DrainPlan:
    """What to do with the pods on a node draining for ``elapsed`` seconds."""
    present = [p for p in pods if counts(p)]
    active = [p for p in present if not p.get("metadata", {}).get("deletionTimestamp")]
    if mode is DrainMode.WAIT:
        evict = [p for p in active if interruptible(p)]
        delete: list[Json] = []
    elif mode is DrainMode.DELETE_AFTER_TIMEOUT and elapsed >= timeout:
        evict, delete = [], present
    else:
        evict, delete = active, []
    return DrainPlan(
        evict=tuple(pod_id(p) for p in evict),
        delete=tuple(pod_id(p) for p in delete),
        remaining=len(present),
    )
