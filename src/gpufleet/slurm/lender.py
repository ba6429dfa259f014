"""Preemption: lend Slurm nodes to high-priority Kubernetes Pods, and take them back.

A Pod qualifies when its ``spec.priority`` is at least the syncer's
``preempt_priority``, it requests ``nvidia.com/gpu``, and kube-scheduler has
marked it ``Unschedulable`` (no free node without Slurm's taint). A Pod that Slurm
schedules itself (``spec.schedulerName`` :data:`~gpufleet.domain.well_known.POD_SCHEDULER_NAME`,
``gpufleet pod-scheduler``) never qualifies: it is Slurm's work already, waiting in
Slurm's queue under Slurm's priorities, and a node taken from Slurm for it would
preempt Slurm's jobs behind that queue's back. Then, with
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

The syncer's account may create ``pods/binding`` for any Pod in the namespaces its
RBAC names, and RBAC cannot say which Pod or which Node. So the one place that
binds asks :func:`bind_refusal` first: only a Pod the lender is entitled to (still
pending, unschedulable, at or above the priority, asking for GPUs, fitting the
node), onto the Node locked for exactly that Pod (annotation *and* our ``lent``
taint), healthy but for the lend. Anything else is refused, logged, and the node
returned to Slurm; nothing is bound. Before it locks a node for a Pod the lender asks
the apiserver whether it may bind in the Pod's namespace at all (a
SelfSubjectAccessReview, remembered for :data:`ACCESS_TTL_S`): with the chart's
``syncer.lendNamespaces`` the syncer may bind only there, and a Pod elsewhere must
not cost Slurm a drained node it can never be given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpufleet.clock import Clock
from gpufleet.domain import slurm_sync, well_known
from gpufleet.kubeapi import NODES, PODS, ApiError, KubePort, Resource, get_or_none
from gpufleet.slurm import nodes as kn
from gpufleet.slurm.metrics import SyncerMetrics

log = logging.getLogger("gpufleet.slurm.lender")
ACCESS_REVIEWS = Resource("selfsubjectaccessreviews", "authorization.k8s.io/v1")
ACCESS_TTL_S = 300.0
"""How long the answer "may the syncer bind Pods in namespace N" is kept."""


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


def bind_refusal(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, *, key: str, threshold: int
) -> str | None:
    """Why the lender may not bind ``pod`` (``key``: ``ns/name``) to ``node`` (None: it may).

    Pure, from the two objects as the syncer sees them: the Pod must be one the lender
    would lend a node to now (:meth:`Lender.wants_node`'s rule), the Node locked for it
    by the syncer's own marks, and the Node fit for work but for the lend.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if kn.pod_key(pod) != key or not meta.get("uid"):
        return f"the pod is {kn.pod_key(pod)}, not {key}"
    if meta.get("deletionTimestamp"):
        return "the pod is being deleted"
    if slurm_schedules(pod):
        return "the pod is Slurm's work (its scheduler is gpufleet pod-scheduler)"
    priority = spec.get("priority")
    if not isinstance(priority, int) or priority < threshold:
        return f"the pod's priority {priority} is below {threshold}"
    if kn.pod_gpus(pod) <= 0:
        return "the pod asks for no GPU"
    if not kn.pod_unschedulable(pod):
        return "the pod is not a pending pod the scheduler could not place"
    if node is None:
        return "the node is not one the syncer manages"
    if kn.lent_to(node) != key:
        return f"the node is locked for {kn.lent_to(node)!r}, not for this pod"
    if kn.slurm_taint_value(node) != kn.LENT:
        return "the node does not carry the syncer's lent taint"
    if not kn.pod_fits(pod, node):
        return "the pod's nodeSelector or GPU count does not fit the node"
    view = kn.kube_view(node)
    if view is None or not view.known:
        return "the node's gpufleet state is unknown"
    out = slurm_sync.out_reason(replace(view, lent=False))
    if out is not None:
        return f"the node is out of service ({out})"
    return None


def slurm_schedules(pod: Mapping[str, Any]) -> bool:
    """Whether Slurm schedules ``pod`` itself (decision 0257): never lent a node."""
    return (pod.get("spec") or {}).get("schedulerName") == well_known.POD_SCHEDULER_NAME


class Lender:
    def __init__(self, syncer: SyncerPort) -> None:
        self.syncer = syncer
        assert syncer.settings.preempt_priority is not None
        self.threshold = syncer.settings.preempt_priority
        self.pods: dict[str, dict[str, Any]] = {}
        self.stats = LendStats()
        self._lock = asyncio.Lock()
        self._may_bind: dict[str, tuple[bool, float]] = {}
        """Namespace -> (may the syncer create pods/binding there, when it was asked)."""

    # -- which pods ---------------------------------------------------------------------

    def wants_node(self, pod: Mapping[str, Any]) -> bool:
        priority = (pod.get("spec") or {}).get("priority")
        return (
            isinstance(priority, int)
            and priority >= self.threshold
            and kn.pod_gpus(pod) > 0
            and kn.pod_unschedulable(pod)
            and not slurm_schedules(pod)
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
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        if not await self.may_bind_in(namespace):
            log.warning(
                "pod=%s wants a node, but the syncer may not bind Pods in namespace %s "
                "(RBAC: the chart's syncer.lendNamespaces); no node is lent",
                key,
                namespace,
            )
            return
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
        if not await self._patch_guarded(name, lambda n: kn.lend_patch(n, key), pod=pod):
            log.warning(
                "pod=%s node=%s not locked: the Node changed (the pod is considered again "
                "on its next change)",
                key,
                name,
            )
            return
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

    async def may_bind_in(self, namespace: str) -> bool:
        """Whether RBAC lets the syncer bind Pods in ``namespace`` (asked, then kept for
        :data:`ACCESS_TTL_S`); False when the apiserver cannot say (fail closed)."""
        s = self.syncer
        now = s.clock.monotonic()
        known = self._may_bind.get(namespace)
        if known is not None and now - known[1] < ACCESS_TTL_S:
            return known[0]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": "create",
                    "resource": "pods",
                    "subresource": "binding",
                }
            },
        }
        try:
            answer = await s.kube.create(ACCESS_REVIEWS, review)
        except ApiError as e:
            log.warning("may the syncer bind in namespace %s? not answered: %s", namespace, e)
            return False
        allowed = bool((answer.get("status") or {}).get("allowed"))
        self._may_bind[namespace] = (allowed, now)
        return allowed

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
                empty = view is not None and view.ours and "COMPLETING" not in view.flags
                if empty and not await self._bind(pod, name, key):
                    await self._return(name, key)

    async def _bind(self, pod: Mapping[str, Any], name: str, key: str) -> bool:
        """Bind ``pod`` to the node locked for it, if the lender is entitled to; False when
        refused (logged; the caller returns the node), True when bound or only failed."""
        s = self.syncer
        why = bind_refusal(pod, s.nodes.get(name), key=key, threshold=self.threshold)
        if why is not None:
            s.metrics.bind_refusals.inc()
            log.warning("pod=%s node=%s bind refused: %s", key, name, why)
            return False
        timing = self.stats.timings.get(key)
        if timing is not None and not timing.empty:
            timing.empty = s.clock.monotonic()
        meta = pod["metadata"]
        try:
            await s.kube.bind(meta["namespace"], meta["name"], meta["uid"], name)
        except ApiError as e:
            log.warning("pod=%s node=%s bind failed: %s", key, name, e)
            return True
        if timing is not None:
            timing.bound = s.clock.monotonic()
        self.pods[key] = {**pod, "spec": {**pod.get("spec", {}), "nodeName": name}}
        log.info("pod=%s bound to node=%s", key, name)
        return True

    async def _return(self, name: str, key: str) -> None:
        s = self.syncer
        node = s.nodes.get(name)
        if node is None:
            return
        if not await self._patch_guarded(name, lambda n: kn.return_patch(n, s.settings.hold_taint)):
            log.warning("node=%s not returned yet: the Node kept changing", name)
            return
        node.get("metadata", {}).get("annotations", {}).pop(well_known.ANNOTATION_LENT_TO, None)
        self.pods.pop(key, None)
        self.stats.returned += 1
        s.metrics.returns.inc()
        log.info("node=%s returned to slurm (pod %s gone)", name, key)
        await s.reconcile(name)

    async def _patch_guarded(
        self,
        name: str,
        build: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        *,
        pod: Mapping[str, Any] | None = None,
        tries: int = 3,
    ) -> bool:
        """Write ``build(node)``, guarded by the ``resourceVersion`` it was built from (the
        taint list is replaced whole: kn.taint_patch); on a 409 read the Node again, keep
        it in the syncer's view, and build again (a lock: only while the node is still
        lendable for ``pod``). False when it was not written."""
        s = self.syncer
        node: Mapping[str, Any] = s.nodes[name]
        for _ in range(tries):
            try:
                await s.patch_node(name, build(node))
                return True
            except ApiError as e:
                if e.status != 409:
                    raise
            fresh = await s.kube.get(NODES, name)
            cached = s.nodes.get(name)
            if cached is not None:
                cached.clear()
                cached.update(fresh)
            node = fresh
            if pod is not None and not self._still_lendable(name, fresh, pod):
                return False
        return False

    def _still_lendable(self, name: str, node: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
        s = self.syncer
        view = kn.kube_view(node)
        slurm = (s.slurm or {}).get(name)
        if view is None or slurm is None or kn.lent_to(node) is not None:
            return False
        return slurm_sync.lendable(
            slurm_sync.Candidate(
                name, view, slurm, tuple(s.jobs_on(name)), fits=kn.pod_fits(pod, node)
            )
        )

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
