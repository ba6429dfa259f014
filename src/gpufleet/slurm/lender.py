"""Preemption: lend Slurm nodes to high-priority Kubernetes Pods, and take them back.

A Pod qualifies when its ``spec.priority`` is at least the syncer's
``preempt_priority``, it requests ``nvidia.com/gpu``, and kube-scheduler has
marked it ``Unschedulable`` (no free node without Slurm's taint). Then, with
every step recorded on the Node so a restarted syncer carries on:

1. **choose** a node with :func:`gpufleet.domain.slurm_sync.choose_lendable`
   (idle first, then the node whose most important job has the lowest priority;
   never a node with a job that cannot be requeued);
2. **lock** it: annotation ``gpufleet.io/lent-to=<ns>/<pod>`` and taint
   ``gpufleet.io/slurm=lent:NoSchedule`` (nothing else is scheduled there);
3. the syncer's reconcile sees ``lent`` and **drains** the Slurm node
   (``gpufleet: lent to kubernetes``) and **requeues** its jobs;
4. once Slurm shows no running job on the node, **bind** the Pod to it;
5. when the Pod is gone (deleted, finished, or bound elsewhere), **return**
   the node: annotation removed, taint back to ``held``; the next reconcile
   undrains it in Slurm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.clock import Clock
from gpufleet.domain import slurm_sync, well_known
from gpufleet.kubeapi import PODS, ApiError, KubePort, get_or_none
from gpufleet.slurm import nodes as kn
from gpufleet.slurm.metrics import SyncerMetrics

log = logging.getLogger("gpufleet.slurm.lender")


class LendingSettings(Protocol):
    """The syncer settings the lender reads."""

    @property
    def preempt_priority(self) -> int | None: ...
    @property
    def dry_run(self) -> bool: ...
    @property
    def hold_taint(self) -> bool: ...


class SyncerPort(Protocol):
    """What the lender uses of the syncer, and nothing more.

    The syncer owns the lender and implements this; the lender never imports the
    syncer (the imports run one way: syncer -> lending). The lender reads the
    syncer's picture of both sides, asks it to reconcile a node it has just
    locked or returned (drain/undrain happen there, in one place), and hands it
    the pod checks it starts from the watch so they live and die with the syncer.
    """

    @property
    def settings(self) -> LendingSettings: ...
    @property
    def kube(self) -> KubePort: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def metrics(self) -> SyncerMetrics: ...
    @property
    def nodes(self) -> Mapping[str, dict[str, Any]]:
        """Managed Kubernetes Nodes by name (the lender updates a node's annotations)."""
        ...

    @property
    def slurm(self) -> Mapping[str, slurm_sync.SlurmView] | None:
        """The last Slurm node views; None while slurmrestd does not answer."""
        ...

    def managed(self, name: str) -> bool: ...
    def jobs_on(self, name: str) -> list[slurm_sync.JobView]: ...
    async def reconcile(self, name: str) -> None: ...
    async def patch_node(
        self, name: str, patch: Mapping[str, Any], *, status: bool = False
    ) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as one of the syncer's background tasks."""
        ...


@dataclass
class LendTiming:
    """Seconds on the syncer's clock for one Pod (bench breakdown)."""

    pod: str
    node: str = ""
    seen: float = 0.0
    locked: float = 0.0
    drained: float = 0.0
    empty: float = 0.0
    bound: float = 0.0


@dataclass
class LendStats:
    lent: int = 0
    returned: int = 0
    timings: dict[str, LendTiming] = field(default_factory=dict)


class Lender:
    def __init__(self, syncer: SyncerPort) -> None:
        self.syncer = syncer
        assert syncer.settings.preempt_priority is not None
        self.threshold = syncer.settings.preempt_priority
        self.pods: dict[str, dict[str, Any]] = {}
        self.stats = LendStats()
        self._lock = asyncio.Lock()

    # -- which pods ---------------------------------------------------------------------

    def wants_node(self, pod: Mapping[str, Any]) -> bool:
        priority = (pod.get("spec") or {}).get("priority")
        return (
            isinstance(priority, int)
            and priority >= self.threshold
            and kn.pod_gpus(pod) > 0
            and kn.pod_unschedulable(pod)
        )

    def lent_nodes(self) -> dict[str, str]:
        """Node name -> ``ns/pod`` for every node we lent."""
        return {
            name: pod
            for name, node in self.syncer.nodes.items()
            if (pod := kn.lent_to(node)) is not None
        }

    # -- steps ----------------------------------------------------------------------------

    async def consider(self, pod: Mapping[str, Any]) -> None:
        key = kn.pod_key(pod)
        if not self.wants_node(pod) or key in self.lent_nodes().values():
            return
        async with self._lock:
            if key in self.lent_nodes().values():
                return
            await self._lend(pod, key)

    async def _lend(self, pod: Mapping[str, Any], key: str) -> None:
        s = self.syncer
        if s.slurm is None:
            log.info("pod=%s wants a node but the Slurm view is unknown; waiting", key)
            return
        seen = s.clock.monotonic()
        candidates = [
            slurm_sync.Candidate(
                name=name,
                kube=view,
                slurm=s.slurm[name],
                jobs=tuple(s.jobs_on(name)),
                fits=kn.pod_fits(pod, node),
            )
            for name, node in s.nodes.items()
            if s.managed(name) and (view := kn.kube_view(node)) is not None
        ]
        chosen = slurm_sync.choose_lendable(candidates, 1)
        if not chosen:
            log.warning("pod=%s wants a node; none can be lent", key)
            return
        name = chosen[0]
        node = s.nodes[name]
        if s.settings.dry_run:
            log.info("pod=%s would get node=%s [dry run]", key, name)
            return
        await s.patch_node(name, kn.lend_patch(node, key))
        node.setdefault("metadata", {}).setdefault("annotations", {})[
            well_known.ANNOTATION_LENT_TO
        ] = key
        self.stats.lent += 1
        s.metrics.lends.inc()
        self.stats.timings[key] = LendTiming(key, name, seen=seen, locked=s.clock.monotonic())
        log.info("pod=%s node=%s lent to kubernetes (locked)", key, name)
        # Drain and requeue now rather than at the next poll.
        await s.reconcile(name)
        timing = self.stats.timings[key]
        timing.drained = s.clock.monotonic()

    async def tick(self) -> None:
        """Bind pods whose node is empty; return nodes whose pod is gone."""
        s = self.syncer
        for name, key in self.lent_nodes().items():
            ns, _, pod_name = key.partition("/")
            pod = self.pods.get(key)
            if pod is None:
                pod = await get_or_none(s.kube, PODS, pod_name, namespace=ns)
            bound_to = (pod or {}).get("spec", {}).get("nodeName")
            phase = (pod or {}).get("status", {}).get("phase")
            if pod is None or phase in ("Succeeded", "Failed") or (bound_to and bound_to != name):
                await self._return(name, key)
                continue
            if not bound_to and not s.jobs_on(name) and s.slurm is not None:
                view = s.slurm.get(name)
                if view is not None and view.ours and "COMPLETING" not in view.flags:
                    await self._bind(pod, name, key)

    async def _bind(self, pod: Mapping[str, Any], name: str, key: str) -> None:
        s = self.syncer
        timing = self.stats.timings.get(key)
        if timing is not None and not timing.empty:
            timing.empty = s.clock.monotonic()
        meta = pod["metadata"]
        try:
            await s.kube.bind(meta["namespace"], meta["name"], meta["uid"], name)
        except ApiError as e:
            log.warning("pod=%s node=%s bind failed: %s", key, name, e)
            return
        if timing is not None:
            timing.bound = s.clock.monotonic()
        self.pods[key] = {**pod, "spec": {**pod.get("spec", {}), "nodeName": name}}
        log.info("pod=%s bound to node=%s", key, name)

    async def _return(self, name: str, key: str) -> None:
        s = self.syncer
        node = s.nodes.get(name)
        if node is None:
            return
        await s.patch_node(name, kn.return_patch(node, s.settings.hold_taint))
        node.get("metadata", {}).get("annotations", {}).pop(well_known.ANNOTATION_LENT_TO, None)
        self.pods.pop(key, None)
        self.stats.returned += 1
        s.metrics.returns.inc()
        log.info("node=%s returned to slurm (pod %s gone)", name, key)
        await s.reconcile(name)

    # -- watch ------------------------------------------------------------------------------

    async def pod_loop(self) -> None:
        s = self.syncer
        while True:
            try:
                listing = await s.kube.list(PODS)
                self.pods = {kn.pod_key(p): p for p in listing.items}
                for p in listing.items:
                    await self.consider(p)
                async for event in s.kube.watch(PODS, listing.resource_version):
                    kind, obj = event.type, event.object
                    key = kn.pod_key(obj)
                    if kind == "DELETED":
                        self.pods.pop(key, None)
                        continue
                    self.pods[key] = obj
                    if self.wants_node(obj):
                        s.spawn(self.consider(obj))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any watch failure: relist
                log.warning("pod watch ended (%r); listing again", e)
                await asyncio.sleep(1.0)
