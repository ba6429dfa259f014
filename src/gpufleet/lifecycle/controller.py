"""The lifecycle controller: Node events in, ``decide()``, record, act.

One pass for a node (``_process``), always in this order:

1. read the Node: its record, the faults its agent reports that the record
   has not seen, the agent's answer to the request the record waits for;
2. ``decide`` each event, under the fleet lock (budget, breaker, rate limit
   see every other node's latest decision);
3. write the record, the state label, gpufleet's cordon and taints and the
   next agent request in *one* merge patch guarded by ``resourceVersion``
   (a 409 re-reads the Node and starts again);
4. only then act outside the Node: drain, BMC steps, Events, metrics,
   the NodeRemediation object.

A decision held by a rail writes its bookkeeping and an Event saying what
was withheld and why; the periodic tick (``tick_all``) retries it. A BMC step
is carried out by one task per node, with a write-ahead mark on the Node
before its one Reset POST; a restarted controller's tick takes an unfinished
step up again and reads the mark and the BMC to learn whether the reset
already happened (docs/decisions/0072).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from gpufleet.domain import emptiness, well_known
from gpufleet.domain import events as ev
from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.decide import Decision, decide
from gpufleet.domain.ladder import Step
from gpufleet.domain.operator import Received, answer
from gpufleet.domain.policy import DrainMode, Policy
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.domain.safety import breaker_refresh
from gpufleet.kubeapi import (
    NODES,
    PODS,
    SECRETS,
    ApiError,
    Conflict,
    NotFound,
    TooManyRequests,
    custom,
)
from gpufleet.kubeapi.secrets import decode_data
from gpufleet.lifecycle import bmc as kube_bmc
from gpufleet.lifecycle import crds, draining, machines, nodes, remediations
from gpufleet.lifecycle.core import ControllerCore, ControllerSettings, Json, S, log
from gpufleet.lifecycle.events import Events
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.policy import PolicyKeeping
from gpufleet.remediate import redfish, steps
from gpufleet.remediate.evidence import ActionMark

__all__ = ["Controller", "ControllerSettings"]

IDLE = frozenset({S.PRODUCTION, S.TRIAGE, S.RMA, S.MAINTENANCE, S.PROVISIONING})
"""States in which a tick has nothing to do (unless a fault is pending)."""
_REMEDIATIONS = custom(crds.NODE_REMEDIATION_PLURAL)


class Controller(Events, PolicyKeeping, ControllerCore):
    """The lifecycle controller of one process: the concepts combined, state in ControllerCore.

    Each base is one concept (its own module); they call each other only through the
    methods :class:`~gpufleet.lifecycle.core.ControllerCore` declares.
    """

    async def prime(self) -> None:
        """Load every Node's record before the first decision (budget needs the whole fleet)."""
        listing = await self.client.list(NODES)
        now = self.clock.now()
        for body in listing.items:
            record, _ = nodes.record_of(body, now)
            self.fleet.put(record)
            self.bodies[nodes.name_of(body)] = body
        self._update_gauges()
        log.info("fleet loaded: %d nodes", len(self.fleet.records))

    async def on_node(self, body: Mapping[str, Any]) -> None:
        """A Node changed (watch event): feed what is new to ``decide``."""
        name = nodes.name_of(body)
        async with self._lock(name):
            if _older(body, self.bodies.get(name)):
                return  # a watch event from before our own last write
            await self._reconcile(dict(body), extra=())

    def on_node_deleted(self, name: str) -> None:
        self.fleet.forget(name)
        self.bodies.pop(name, None)
        task = self._drains.pop(name, None)
        if task is not None:
            task.cancel()

    async def feed(self, name: str, event: ev.Event) -> None:
        """Decide an event that did not come from the Node (drain done, step done, tick)."""
        async with self._lock(name):
            body = self.bodies.get(name)
            if body is None or not isinstance(event, ev.Tick):
                # A result must be decided on the Node as it is now: decided on a stale
                # copy it could be judged "not the step in progress" and lost.
                try:
                    body = await self.client.get(NODES, name)
                except NotFound:
                    return
                except ApiError as exc:
                    log.warning("node=%s %s not decided yet: %s", name, type(event).__name__, exc)
                    if body is None:
                        return
            await self._reconcile(body, extra=(event,))

    async def _reconcile(self, body: Json, *, extra: Sequence[ev.Event]) -> None:
        name = nodes.name_of(body)
        for _ in range(self.settings.conflict_retries):
            try:
                await self._process(body, extra)
                return
            except Conflict:
                try:
                    body = await self.client.get(NODES, name)
                except NotFound:
                    self.on_node_deleted(name)
                    return
        log.warning(
            "node=%s gave up after %d conflicting writes", name, self.settings.conflict_retries
        )

    async def _process(self, body: Json, extra: Sequence[ev.Event]) -> None:
        name = nodes.name_of(body)
        self.bodies[name] = body
        now = self.clock.now()
        record, new = nodes.record_of(body, now)
        obs = nodes.observe(body, record)
        events: list[ev.Event] = [*obs.events, *extra]
        joined: machines.Registration | None = None
        if record.state is S.PROVISIONING and nodes.is_ready(body):
            joined = await machines.registration(self.client, body)  # waits for the agent
            if joined is not None:
                events.append(joined.event)
        before = record
        decisions: list[Decision] = []
        policy = self.effective_policy()
        async with self.fleet.lock:
            previous = self.fleet.records.get(name)
            for event in events:
                d = decide(record, self.fleet.view(), event, policy, now)
                self.fleet.apply(d, now, policy)
                decisions.append(d)
                record = d.record
            if not decisions:
                self.fleet.put(record)
        actions = tuple(a for d in decisions for a in d.actions)
        patch = nodes.node_patch(body, record, actions, seen=obs.seen)
        if joined is not None:
            patch["metadata"]["annotations"].update(joined.annotations)
        if record.incident is not None:
            patch["metadata"]["annotations"][well_known.ANNOTATION_REMEDIATION] = (
                remediations.name_for(name, record.incident)
            )
        if obs.request is not None:  # removed in the write that stores its decision: once only
            patch["metadata"]["annotations"][well_known.ANNOTATION_OPERATOR_REQUEST] = None
        if not new and nodes.apply_merge_patch(body, patch) == body:
            self._after(body, body, before, record, decisions, now)
            return
        log.debug(
            "node=%s write rv=%s state=%s pending=%s new=%s events=%s",
            name,
            patch["metadata"].get("resourceVersion"),
            record.state,
            record.pending is not None,
            new,
            [type(e).__name__ for e in events],
        )
        try:
            written = await self.client.patch(NODES, name, patch)
        except Conflict:
            async with self.fleet.lock:  # undo the reservation; decide again on fresh data
                if previous is not None:
                    self.fleet.put(previous)
            raise
        except NotFound:
            self.on_node_deleted(name)
            return
        self.bodies[name] = written
        if obs.request is not None:
            self._answer_operator(written, obs.request, before, events, decisions)
        self._after(body, written, before, record, decisions, now)

    def _answer_operator(
        self,
        body: Json,
        received: Received,
        first: NodeRecord,
        events: Sequence[ev.Event],
        decisions: Sequence[Decision],
    ) -> None:
        """The audit trail of a person's request: one Node Event, accepted or refused and why."""
        before, decision = first, None
        for event, d in zip(events, decisions, strict=False):
            if event is received.event:
                decision = d
                break
            before = d.record
        accepted, message = answer(
            received,
            before,
            held=str(decision.hold) if decision is not None and decision.hold else None,
            transition=decision.transition if decision is not None else None,
            reasons=decision.reasons if decision is not None else (),
        )
        log.info("node=%s operator request %s", nodes.name_of(body), message)
        self.metrics.actions.labels(
            action="operator-request", result="ok" if accepted else "refused"
        ).inc()
        self._event(body, "Normal" if accepted else "Warning", "OperatorRequest", message)

    def _after(
        self,
        original: Json,
        body: Json,
        before: NodeRecord,
        record: NodeRecord,
        decisions: Sequence[Decision],
        now: float,
    ) -> None:
        """Everything after the record is stored: Events, metrics, drains, steps, CR."""
        name = record.name
        m = self.metrics
        for d in decisions:
            for event_reason in d.reasons:
                log.info("node=%s %s", name, event_reason)
            if d.transition is not None:
                t = d.transition
                m.transitions.labels(source=t.source.value, target=t.target.value).inc()
                done = ", ".join(str(a.kind) for a in d.actions)
                self._event(
                    body,
                    "Normal",
                    "StateChanged",
                    f"{t.source} -> {t.target}: {t.reason}" + (f" [{done}]" if done else ""),
                )
            if d.hold is not None:
                m.holds.labels(reason=d.hold.value).inc()
                for a in d.withheld:
                    m.actions.labels(action=a.kind.value, result="withheld").inc()
                withheld = ", ".join(str(a) for a in d.withheld)[:800]
                said = f"{d.hold}: {', '.join(a.kind.value for a in d.withheld)}"
                if self._held_said.get(name) != said:
                    self._held_said[name] = said
                    self._event(body, "Warning", "ActionWithheld", f"{d.hold}: {withheld}")
            elif d.actions or d.transition is not None:
                self._held_said.pop(name, None)
            for a in d.actions:
                self._act(original, record, a, now)
        if record.state is S.DRAINING and before.state is not S.DRAINING:
            fault = record.incident
            if fault is not None:
                opened = _fault_time(record)
                if opened is not None:
                    m.time_to_cordon.observe(max(0.0, now - opened))
        for occ in record.occurrences:
            if occ not in before.occurrences:
                m.faults.labels(fault=occ.key).inc()
        self._ensure_drain(record)
        incident = record.incident or before.incident
        if incident is not None and any(d.record != before for d in decisions):
            self._spawn(self._sync_remediation(record, incident, now), f"nrem {name}")
        for d in decisions:
            _observe_steps(m, before, d.record)
        if self.fleet.dirty_breaker:
            self._schedule_status_save()
        self._update_gauges()

    def _act(self, body: Json, record: NodeRecord, a: Action, now: float) -> None:
        name = record.name
        kind = a.kind
        result = "ok"
        if kind is ActionKind.CORDON:
            self._event(body, "Warning", "Cordoned", a.detail or record.reason)
        elif kind is ActionKind.UNCORDON:
            annotations = body.get("metadata", {}).get("annotations") or {}
            ours = annotations.get(well_known.ANNOTATION_CORDONED) == well_known.CONTROLLER
            if ours or not body.get("spec", {}).get("unschedulable"):
                self._event(body, "Normal", "Uncordoned", "cleared gpufleet's cordon")
            else:
                result = "kept"  # someone else's cordon: not cleared
                self._event(body, "Normal", "CordonKept", "the cordon was not set by gpufleet")
        elif kind is ActionKind.RUN_STEP:
            assert a.step is not None
            self._event(body, "Warning", "StepStarted", f"{a.step}: {a.detail}")
            if a.step in steps.BMC_STEPS:
                self._spawn(self._run_bmc_step(body, a.step), f"{a.step} {name}")
        elif kind is ActionKind.RESTART_JOB:
            self._event(body, "Warning", "RestartJob", a.detail)
        elif kind is ActionKind.NOTIFY:
            self._event(body, "Warning", "Notice", a.detail)
        self.metrics.actions.labels(action=kind.value, result=result).inc()

    async def tick_all(self) -> None:
        """Retry held decisions and examine timeouts, node by node."""
        now = self.clock.now()
        policy = self.effective_policy()
        refreshed = breaker_refresh(
            self.fleet.breaker,
            now=now,
            config=policy.safety.breaker,
            fleet_size=self.fleet.view().size,
        )
        if refreshed != self.fleet.breaker:
            self.fleet.breaker = refreshed
            self.fleet.dirty_breaker = True
        for name, record in list(self.fleet.records.items()):
            if record.state in IDLE and record.pending is None:
                if record.state is S.PROVISIONING and record.name in self.bodies:
                    body = self.bodies[name]
                    if nodes.is_ready(body):
                        await self.feed(name, ev.Tick())  # _process checks the inventory
                continue
            self._ensure_drain(record)
            await self.feed(name, ev.Tick())
        self._resume_bmc_steps()  # after the Ticks: a step they timed out is not resumed
        if self.fleet.dirty_breaker:
            self._schedule_status_save()
        self._update_gauges()
        self.metrics.ticks.inc()

    def _ensure_drain(self, record: NodeRecord) -> None:
        name = record.name
        inc = record.incident
        wanted = record.state is S.DRAINING and inc is not None and not inc.drained
        task = self._drains.get(name)
        if wanted and (task is None or task.done()):
            self._drains[name] = self._spawn(self._drain(name), f"drain {name}")

    async def _drain(self, name: str) -> None:
        while True:
            record = self.fleet.records.get(name)
            if record is None or record.state is not S.DRAINING or record.incident is None:
                return
            inc = record.incident
            if inc.drained:
                return
            policy = self.effective_policy()
            if policy.paused or policy.dry_run:
                await asyncio.sleep(self.settings.drain_poll_s)
                continue
            try:
                pods = (await self.client.list(PODS, field_selector=f"spec.nodeName={name}")).items
            except ApiError as exc:
                log.warning("node=%s drain: %s", name, exc)
                await asyncio.sleep(self.settings.drain_poll_s)
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
                self._slurm_heard.pop(name, None)
                self._drain_said.pop(name, None)
                log.info("node=%s drained: %s", name, ready.why)
                await self.feed(name, ev.DrainCompleted(detail=ready.why))
                return
            self._say_drain_wait(name, ready.why)
            await asyncio.sleep(self.settings.drain_poll_s)

    def _ready_to_disrupt(
        self, name: str, inc: Incident, policy: Policy, pods_left: int
    ) -> emptiness.Readiness:
        """Kubernetes and Slurm both empty (domain.emptiness), from the Node as last seen."""
        body = self.bodies.get(name) or {}
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        text = annotations.get(well_known.ANNOTATION_SLURM_WORK)
        work = emptiness.SlurmWork.from_annotation(text)
        now = self.clock.monotonic()
        heard = self._slurm_heard.get(name)
        if heard is None or heard[0] != text:
            heard = self._slurm_heard[name] = (text, now)
        taints = [str(t.get("key")) for t in (body.get("spec") or {}).get("taints") or []]
        return emptiness.ready_to_disrupt(
            pods_left=pods_left,
            slurm_node=emptiness.is_slurm_node(
                meta.get("labels") or {}, annotations, taints, policy.drain.slurm
            ),
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
        body = self.bodies.get(name)
        if body is not None:
            self._event(body, "Normal", "DrainWaiting", why)

    async def _bmc_credentials(self, body: Mapping[str, Any]) -> redfish.BmcCredentials:
        ref = nodes.bmc_secret_ref(body)
        if ref is None:
            raise redfish.BmcRejected(
                nodes.name_of(body),
                f"the Node has no {well_known.ANNOTATION_BMC_SECRET} annotation (namespace/name)",
            )
        data = decode_data(await self.client.get(SECRETS, ref[1], namespace=ref[0]))
        try:
            values = {k: data[k] for k in ("endpoint", "username", "password")}
        except KeyError as exc:
            raise redfish.BmcRejected(
                nodes.name_of(body), f"Secret {ref[0]}/{ref[1]} lacks the key {exc}"
            ) from None
        return redfish.BmcCredentials(values["endpoint"], values["username"], values["password"])

    def _run_bmc_step(self, body: Mapping[str, Any], step: Step) -> Coroutine[Any, Any, None]:
        """The task for the BMC step the decision just recorded as started.

        Not a coroutine function on purpose: the attempt is claimed *now*, before
        the task first runs, so the tick's resume (``_resume_bmc_steps``) can never
        start a second task for it.
        """
        name = nodes.name_of(body)
        record = self.fleet.records.get(name)
        attempt = kube_bmc.current_attempt(record) if record is not None else None
        if attempt is None or attempt.step is not step or not self._bmc.claim(name, attempt):
            log.warning("node=%s %s not started: not the attempt in progress", name, step)
            return self._drive_bmc(name, None)
        return self._drive_bmc(name, attempt)

    def _resume_bmc_steps(self) -> None:
        """Tick: a BMC attempt that the records say is in progress and that no task
        of this process has (a restart, or a result the apiserver did not take) is
        taken up again: the write-ahead mark says whether its reset was posted."""
        policy = self.effective_policy()
        if policy.paused or policy.dry_run:
            return
        for name, record in list(self.fleet.records.items()):
            attempt = kube_bmc.current_attempt(record)
            if attempt is None or not self._bmc.claim(name, attempt):
                continue
            if (name, attempt) not in self._bmc.results:
                log.info(
                    "node=%s %s attempt %d in progress without a task here: resuming",
                    name,
                    attempt.step,
                    attempt.attempt,
                )
            self._spawn(self._drive_bmc(name, attempt), f"resume {attempt.step} {name}")

    async def _drive_bmc(self, name: str, attempt: steps.Attempt | None) -> None:
        """One task per node at a time: carry the attempt out (or resume it), then record it."""
        if attempt is None:
            return
        key = (name, attempt)
        try:
            async with self._bmc.lock(name):
                if key not in self._bmc.results:
                    result = await self._bmc_attempt(name, attempt)
                    if result is None:
                        return  # not this attempt any more, or the Node unreadable: next tick
                    self._bmc.results[key] = result
                await self._record_bmc_result(name, attempt)
        finally:
            self._bmc.release(name, attempt)

    async def _bmc_attempt(self, name: str, attempt: steps.Attempt) -> ev.StepCompleted | None:
        """Carry out one attempt against the Node as stored now; None: nothing to do yet."""
        step = attempt.step
        try:
            body = await self.client.get(NODES, name)  # the mark and the record as they are
        except NotFound:
            return None
        except ApiError as exc:
            log.warning("node=%s %s waits: the Node could not be read: %s", name, step, exc)
            return None
        record, _ = nodes.record_of(body, self.clock.now())
        if kube_bmc.current_attempt(record) != attempt:
            return None
        text = kube_bmc.mark_text(body)
        mark = ActionMark.from_json(text)
        identity_failed = False
        try:
            if text is not None and mark is None:
                raise redfish.BmcRejected(
                    name,
                    f"the {well_known.ANNOTATION_BMC_ACTION} annotation cannot be read, so "
                    "whether a reset was posted is unknown: nothing posted",
                )
            creds = await self._bmc_credentials(body)
            expected = await kube_bmc.expected_identity(self.client, body, creds.endpoint)

            async def prepare() -> None:
                if step is Step.REIMAGE:  # the network boot must get a new join token
                    await machines.rearm_for_reimage(self.client, body, self.clock.now())

            async with redfish.RedfishClient(
                creds, name=name, retry_delays=self.settings.bmc_retry_delays
            ) as client:
                detail = await steps.run_bmc_step(
                    step,
                    client,
                    attempt=attempt,
                    journal=kube_bmc.NodeJournal(self.client, name),
                    expected=expected,
                    mark=mark,
                    prepare=prepare,
                    clock=self.clock.now,
                )
            ok = True
        except steps.BmcIdentityMismatch as exc:
            detail, ok, identity_failed = str(exc), False, True
        except (redfish.RedfishError, ApiError) as exc:
            detail, ok = str(exc), False
        log.info("node=%s %s %s: %s", name, step, "done" if ok else "failed", detail)
        self.metrics.actions.labels(action=f"bmc-{step}", result="ok" if ok else "failed").inc()
        if identity_failed:
            self._event(body, "Warning", "BmcIdentityMismatch", detail)
        if identity_failed or ok:
            await kube_bmc.mismatch_condition(
                self.client, body, mismatch=identity_failed, message=detail, now=self.clock.now()
            )
        return ev.StepCompleted(step, ok, detail)

    async def _record_bmc_result(self, name: str, attempt: steps.Attempt) -> None:
        """Feed the attempt's result, bound to that attempt: a result that arrives after
        the ladder moved on (a timeout) is dropped, not taken for a later attempt's."""
        key = (name, attempt)
        result = self._bmc.results.get(key)
        if result is None:
            return
        async with self._lock(name):
            try:
                body = await self.client.get(NODES, name)
            except NotFound:
                self._bmc.results.pop(key, None)
                return
            except ApiError as exc:
                log.warning("node=%s %s result not recorded yet: %s", name, attempt.step, exc)
                return
            record, _ = nodes.record_of(body, self.clock.now())
            if kube_bmc.current_attempt(record) != attempt:
                self._bmc.results.pop(key, None)
                log.info(
                    "node=%s %s result dropped: no longer the attempt in progress",
                    name,
                    attempt.step,
                )
                return
            try:
                await self._reconcile(body, extra=(result,))
            except ApiError as exc:
                log.warning("node=%s %s result not recorded yet: %s", name, attempt.step, exc)
                return
            stored, _ = nodes.record_of(self.bodies.get(name) or body, self.clock.now())
        if kube_bmc.current_attempt(stored) != attempt:
            self._bmc.results.pop(key, None)
            await kube_bmc.NodeJournal(self.client, name).clear(attempt)

    async def _sync_remediation(self, record: NodeRecord, incident: Incident, now: float) -> None:
        name = remediations.name_for(record.name, incident)
        lock = self._nrem_locks.setdefault(name, asyncio.Lock())
        async with lock:
            current = record.incident if record.incident is not None else incident
            try:
                await self.client.create(
                    _REMEDIATIONS,
                    remediations.manifest(record.name, current, self.policy),
                )
            except Conflict:
                pass
            except ApiError as exc:
                log.warning("node=%s NodeRemediation %s not created: %s", record.name, name, exc)
                return
            status = remediations.status(record, current, now)
            try:
                await self.client.patch(_REMEDIATIONS, name, {"status": status}, status=True)
            except ApiError as exc:
                log.warning(
                    "node=%s NodeRemediation %s status not written: %s", record.name, name, exc
                )
            if record.state in (S.PRODUCTION, S.TRIAGE, S.RMA):
                self._nrem_locks.pop(name, None)


def _older(body: Mapping[str, Any], known: Mapping[str, Any] | None) -> bool:
    """Whether ``body`` is an older version of the Node than ``known``.

    resourceVersions are opaque by contract, but every apiserver backed by etcd
    uses the etcd revision; if either is not a number, nothing is skipped.
    """
    if known is None:
        return False
    a = str(body.get("metadata", {}).get("resourceVersion", ""))
    b = str(known.get("metadata", {}).get("resourceVersion", ""))
    return a.isdigit() and b.isdigit() and int(a) < int(b)


def _fault_time(record: NodeRecord) -> float | None:
    inc = record.incident
    if inc is None:
        return None
    times = [o.at for o in record.occurrences if o.key == inc.key]
    return max(times) if times else None


def _observe_steps(m: Metrics, before: NodeRecord, after: NodeRecord) -> None:
    old = {
        (a.step, a.attempt, a.started_at): a
        for a in (before.incident.tried if before.incident else ())
    }
    for a in after.incident.tried if after.incident else ():
        prev = old.get((a.step, a.attempt, a.started_at))
        if (
            a.ended_at is not None
            and a.outcome is not None
            and (prev is None or prev.ended_at is None)
        ):
            m.step_seconds.labels(step=a.step.value, outcome=a.outcome.value).observe(
                max(0.0, a.ended_at - a.started_at)
            )
