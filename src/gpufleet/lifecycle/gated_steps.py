"""The steps that act on a node's hardware, carried out through the gate.

One task per node at a time (:class:`gpufleet.lifecycle.bmc.Runs`). A step's
attempt is claimed when the decision that starts it is stored; the task writes
the write-ahead mark on the Node before its one Reset POST
(:mod:`gpufleet.remediate.steps`), so a restarted controller's tick resumes an
unfinished attempt and reads the mark and the BMC to learn whether the reset
already happened (docs/decisions/0072). A result is fed to ``decide`` bound to
its attempt: one that arrives after the ladder moved on is dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from gpufleet.clock import Clock
from gpufleet.domain import events as ev
from gpufleet.domain import well_known
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import NodeRecord
from gpufleet.kubeapi import NODES, SECRETS, ApiError, KubePort, NotFound
from gpufleet.kubeapi.secrets import decode_data
from gpufleet.lifecycle import bmc as kube_bmc
from gpufleet.lifecycle import machines, nodes
from gpufleet.lifecycle.core import ControllerSettings, log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.lifecycle.tasks import TaskGroup
from gpufleet.remediate import redfish, steps
from gpufleet.remediate.evidence import ActionMark

DecideBound = Callable[[str, ev.Event, Callable[[NodeRecord], bool]], Awaitable[NodeRecord | None]]
"""The node pass's ``decide_bound``: decide an event on the Node as stored now, only if
the stored record still satisfies the binding; returns the record stored after it."""


class GatedSteps:
    """Steps on the node's hardware: claim, run (or resume) against the BMC, record the result."""

    def __init__(
        self,
        client: KubePort,
        settings: ControllerSettings,
        *,
        fleet: Fleet,
        policies: PolicyKeeper,
        events: EventSink,
        metrics: Metrics,
        tasks: TaskGroup,
        clock: Clock,
        decide_bound: DecideBound,
        reimage_version: Callable[[str], str | None],
    ) -> None:
        self.client = client
        self.settings = settings
        self.fleet = fleet
        self.policies = policies
        self.events = events
        self.metrics = metrics
        self.tasks = tasks
        self.clock = clock
        self.decide_bound = decide_bound
        self.reimage_version = reimage_version
        self._bmc = kube_bmc.Runs()

    def start(self, name: str, step: Step) -> None:
        """A step the decision just recorded as started: its task, if it is a BMC step."""
        if step in steps.BMC_STEPS:
            self.tasks.spawn(self._run_bmc_step(name, step), f"{step} {name}", acting=True)

    def start_command(self, name: str) -> None:
        """A maintenance command the decision just recorded (the request rides the record)."""

    def forget(self, name: str) -> None:
        """A deleted Node: nothing of its attempts is kept."""
        self._bmc.forget(name)

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

    def _run_bmc_step(self, name: str, step: Step) -> Coroutine[Any, Any, None]:
        """The task for the BMC step the decision just recorded as started.

        Not a coroutine function on purpose: the attempt is claimed *now*, before
        the task first runs, so the tick's resume (``_resume_bmc_steps``) can never
        start a second task for it.
        """
        record = self.fleet.records.get(name)
        attempt = kube_bmc.current_attempt(record) if record is not None else None
        if attempt is None or attempt.step is not step or not self._bmc.claim(name, attempt):
            log.warning("node=%s %s not started: not the attempt in progress", name, step)
            return self._drive_bmc(name, None)
        return self._drive_bmc(name, attempt)

    def resume(self) -> None:
        """Tick: a BMC attempt that the records say is in progress and that no task
        of this process has (a restart, or a result the apiserver did not take) is
        taken up again: the write-ahead mark says whether its reset was posted."""
        policy = self.policies.effective()
        if policy.paused or policy.dry_run:
            return
        for name, record in self.fleet.ticking():  # a step runs in remediating only
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
            self.tasks.spawn(
                self._drive_bmc(name, attempt), f"resume {attempt.step} {name}", acting=True
            )

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
                    image = self.reimage_version(name)
                    await machines.rearm_for_reimage(
                        self.client, body, self.clock.now(), image=image
                    )

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
            self.events.node(body, "Warning", "BmcIdentityMismatch", detail)
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

        def bound(record: NodeRecord) -> bool:
            return kube_bmc.current_attempt(record) == attempt

        try:
            stored = await self.decide_bound(name, result, bound)
        except NotFound:
            self._bmc.results.pop(key, None)
            return
        except ApiError as exc:
            log.warning("node=%s %s result not recorded yet: %s", name, attempt.step, exc)
            return
        if stored is None:
            self._bmc.results.pop(key, None)
            log.info(
                "node=%s %s result dropped: no longer the attempt in progress", name, attempt.step
            )
            return
        if kube_bmc.current_attempt(stored) != attempt:
            self._bmc.results.pop(key, None)
            await kube_bmc.NodeJournal(self.client, name).clear(attempt)
