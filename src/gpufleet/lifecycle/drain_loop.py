"""The drain loop: evict (or delete) a draining node's pods until Kubernetes and Slurm are empty.

One task per draining node. It does nothing while the policy is paused or in
dry-run; evictions honour PodDisruptionBudgets (a 429 is retried). The node is
ready for disruption only when :mod:`gpufleet.domain.emptiness` says both
Kubernetes and Slurm are empty; then ``DrainCompleted`` is fed to ``decide``.
What to evict is planned by :mod:`gpufleet.lifecycle.draining`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from gpufleet.clock import Clock
from gpufleet.domain import emptiness, well_known
from gpufleet.domain import events as ev
from gpufleet.domain.policy import DrainMode, Policy
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.kubeapi import PODS, ApiError, NotFound, TooManyRequests
from gpufleet.lifecycle import draining
from gpufleet.lifecycle.core import Feed, S, log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.ports import PodPort
from gpufleet.lifecycle.tasks import TaskGroup


class Drains:
    """One drain task per draining node; ``DrainCompleted`` when the node is empty.

    The only collaborator that evicts or deletes pods (its port, :class:`PodPort`,
    says so); it never reaches a BMC: what follows a drain is decided by the
    node pass and done through the gate.
    """

    def __init__(
        self,
        pods: PodPort,
        *,
        book: NodeBook,
        fleet: Fleet,
        policy: Callable[[], Policy],
        events: EventSink,
        tasks: TaskGroup,
        feed: Feed,
        clock: Clock,
        poll_s: float,
    ) -> None:
        self.client = pods
        self.book = book
        self.fleet = fleet
        self.effective_policy = policy
        self.events = events
        self.tasks = tasks
        self.feed = feed
        self.clock = clock
        self.poll_s = poll_s
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._slurm_heard: dict[str, tuple[str | None, float]] = {}
        """Per draining node: the last Slurm report seen and when (monotonic, this process)."""
        self._drain_said: dict[str, str] = {}
        """Per draining node: what the last DrainWaiting Event said (without numbers)."""

    def forget(self, name: str) -> None:
        """A deleted Node: its drain ends."""
        task = self._drains.pop(name, None)
        if task is not None:
            task.cancel()

    def ensure(self, record: NodeRecord) -> None:
        """Start the node's drain task if it should run and does not."""
        name = record.name
        inc = record.incident
        wanted = record.state is S.DRAINING and inc is not None and not inc.drained
        task = self._drains.get(name)
        if wanted and (task is None or task.done()):
            self._drains[name] = self.tasks.spawn(self._drain(name), f"drain {name}", acting=True)

    async def _drain(self, name: str) -> None:
        """One drain, whatever ends it: what it waited for is forgotten with it, so the next
        incident's drain announces its own waits and times Slurm's silence from its start."""
        try:
            await self._drain_until_empty(name)
        finally:
            self._slurm_heard.pop(name, None)
            self._drain_said.pop(name, None)

    async def _drain_until_empty(self, name: str) -> None:
        while True:
            record = self.fleet.records.get(name)
            if record is None or record.state is not S.DRAINING or record.incident is None:
                return
            inc = record.incident
            if inc.drained:
                return
            policy = self.effective_policy()
            if policy.paused or policy.dry_run:
                await asyncio.sleep(self.poll_s)
                continue
            try:
                pods = (await self.client.list(PODS, field_selector=f"spec.nodeName={name}")).items
            except ApiError as exc:
                log.warning("node=%s drain: %s", name, exc)
                await asyncio.sleep(self.poll_s)
                continue
            plan = draining.plan(
                pods,
                mode=inc.drain_mode or DrainMode.EVICT,
                elapsed=self.clock.now() - record.since,
                timeout=policy.drain.timeout_seconds,
            )
            for ns, pod in plan.evict:
                try:
                    await self.client.evict(ns, pod)
                except TooManyRequests:
                    log.info(
                        "node=%s drain: eviction of %s/%s refused by a PDB; retrying", name, ns, pod
                    )
                except NotFound:
                    pass
                except ApiError as exc:
                    log.warning("node=%s drain: %s", name, exc)
            for ns, pod in plan.delete:
                with contextlib.suppress(NotFound):
                    await self.client.delete(PODS, pod, namespace=ns)
            ready = self._ready_to_disrupt(name, inc, policy, plan.remaining)
            if ready.ready:
                self._drains.pop(name, None)
                log.info("node=%s drained: %s", name, ready.why)
                await self.feed(name, ev.DrainCompleted(detail=ready.why))
                return
            self._say_drain_wait(name, ready.why)
            await asyncio.sleep(self.poll_s)

    def _ready_to_disrupt(
        self, name: str, inc: Incident, policy: Policy, pods_left: int
    ) -> emptiness.Readiness:
        """Kubernetes and Slurm both empty (domain.emptiness), from the Node as last seen."""
        body = self.book.get(name) or {}
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        text = annotations.get(well_known.ANNOTATION_SLURM_WORK)
        work = emptiness.SlurmWork.from_annotation(text)
        now = self.clock.monotonic()
        heard = self._slurm_heard.get(name)
        if heard is None or heard[0] != text:
            heard = self._slurm_heard[name] = (text, now)
        return emptiness.ready_to_disrupt(
            pods_left=pods_left,
            slurm_node=emptiness.is_slurm_node(work, policy.drain.slurm),
            work=work,
            incident_opened_at=inc.opened_at,
            slurm_silent_for=now - heard[1],
            silent_limit=policy.drain.slurm_silent_seconds,
            if_silent=inc.if_slurm_silent,
        )

    def _say_drain_wait(self, name: str, why: str) -> None:
        """An Event (and a log line) when what the drain waits for changes, not every poll."""
        gist = "".join(c for c in why if not c.isdigit())
        if self._drain_said.get(name) == gist:
            return
        self._drain_said[name] = gist
        log.info("node=%s drain: %s", name, why)
        body = self.book.get(name)
        if body is not None:
            self.events.node(body, "Normal", "DrainWaiting", why)
