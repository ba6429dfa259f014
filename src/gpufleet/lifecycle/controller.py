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
from collections.abc import Coroutine, Mapping
from typing import Any

from gpufleet.domain import emptiness, well_known
from gpufleet.domain import events as ev
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import DrainMode, Policy
from gpufleet.domain.records import Incident, NodeRecord
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
from gpufleet.lifecycle.acting import Acting
from gpufleet.lifecycle.core import ControllerCore, ControllerSettings, S, log
from gpufleet.lifecycle.events import Events
from gpufleet.lifecycle.policy import PolicyKeeping
from gpufleet.lifecycle.reconcile import NodePass
from gpufleet.lifecycle.ticks import Ticks
from gpufleet.remediate import redfish, steps
from gpufleet.remediate.evidence import ActionMark

__all__ = ["Controller", "ControllerSettings"]

_REMEDIATIONS = custom(crds.NODE_REMEDIATION_PLURAL)


class Controller(Events, PolicyKeeping, NodePass, Acting, Ticks, ControllerCore):
    """The lifecycle controller of one process: the concepts combined, state in ControllerCore.

    Each base is one concept (its own module); they call each other only through the
    methods :class:`~gpufleet.lifecycle.core.ControllerCore` declares.
    """

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
