"""The acts on a node's hardware, each asked of the gate: BMC steps, GPU resets, commands.

This is the only collaborator of the controller that holds the gate
(:mod:`gpufleet.gate`), besides the boot watchdog. A decision that starts a
step is stored first; then one task per node asks the gate to carry it out:

- a reboot, power cycle or reimage: :meth:`Gate.bmc_step` (a restarted
  controller's tick takes an unfinished attempt up again; the write-ahead mark
  says whether its reset was posted, docs/decisions/0072);
- a GPU reset or a maintenance command: :meth:`Gate.agent_request` writes the
  request the agent carries out (it checks the binding and the node's work
  again, decision 0074).

What the gate answers is fed back to ``decide`` bound to its attempt (a result
that arrives after the ladder moved on is dropped): done or failed as the step's
result; *refused* (the node is not empty) as :class:`~gpufleet.domain.events.WorkFound`,
which drains the node again and never escalates; *held* (the lease, the rails,
an untrusted record) as nothing at all: the tick asks again, and an Event says why.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.clock import Clock
from gpufleet.domain import agent_requests
from gpufleet.domain import events as ev
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import NodeRecord, Outcome
from gpufleet.domain.states import NodeState
from gpufleet.gate import Done, Failed, Gate, Held, Refused, Stale
from gpufleet.gate.attempts import attempt_in_progress, network_boot_may_be_starting
from gpufleet.kubeapi import ApiError, KubePort, NotFound
from gpufleet.lifecycle import bmc as kube_bmc
from gpufleet.lifecycle import machines
from gpufleet.lifecycle.core import log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.lifecycle.tasks import TaskGroup
from gpufleet.remediate import steps

DecideBound = Callable[[str, ev.Event, Callable[[NodeRecord], bool]], Awaitable[NodeRecord | None]]
"""The node pass's ``decide_bound``: decide an event on the Node as stored now, only if
the stored record still satisfies the binding; returns the record stored after it."""

Json = dict[str, Any]
Key = tuple[str, object]
"""What a task works on: (node, the attempt or the command's record time)."""


class GatedSteps:
    """Steps on the node's hardware: claim, ask the gate, record the answer."""

    def __init__(
        self,
        client: KubePort,
        *,
        gate: Gate,
        book: NodeBook,
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
        self.gate = gate
        self.book = book
        self.fleet = fleet
        self.policies = policies
        self.events = events
        self.metrics = metrics
        self.tasks = tasks
        self.clock = clock
        self.decide_bound = decide_bound
        self.reimage_version = reimage_version
        self._running: set[Key] = set()
        """What a task of this process works on now: never two tasks for one act."""
        self._results: dict[Key, ev.Event] = {}
        """Answers the apiserver has not taken yet (fed again by the tick, never re-run)."""
        self._asked: dict[str, Key] = {}
        """Per node, the agent request the gate wrote (not asked again each tick)."""
        self._held_said: dict[str, str] = {}
        """Per node, the last hold announced (an Event once, not every tick)."""
        self._held_back: dict[str, tuple[steps.Attempt, ...]] = {}
        """Per node, ended attempts whose cleanup waits for the node's act task to end."""

    # ------------------------------------------------------------ starting

    def start(self, name: str, step: Step) -> None:
        """A step the decision just recorded as started: its task, claimed now."""
        record = self.fleet.records.get(name)
        attempt = attempt_in_progress(record)
        if attempt is None or attempt.step is not step:
            log.warning("node=%s %s not started: not the attempt in progress", name, step)
            return
        self._spawn(name, attempt)

    def start_command(self, name: str) -> None:
        """A maintenance command the decision just recorded: its request, through the gate."""
        record = self.fleet.records.get(name)
        if record is not None and record.state is NodeState.MAINTENANCE:
            self._spawn(name, record.since)

    def _spawn(self, name: str, what: steps.Attempt | float) -> None:
        key: Key = (name, what)
        if key in self._running or self._asked.get(name) == key:
            return
        if (name, CLEANUP) in self._running:
            return  # a one-time boot being removed: the tick asks again once it is (0177)
        self._running.add(key)
        label = what.step if isinstance(what, steps.Attempt) else "command"
        task = self.tasks.spawn(self._drive(name, what), f"{label} {name}", acting=True)
        task.add_done_callback(functools.partial(self._act_done, key))

    def resume(self) -> None:
        """Tick: an act the records say is in progress and that no task of this process
        has (a restart, a hold lifted, a result the apiserver did not take) is asked
        of the gate again, unless the policy is paused or dry-run; a mark of an attempt
        that ended is cleaned up, paused or not: what it undoes (a one-time network boot
        armed) would turn the machine's next reset, an operator's too, into a reimage
        (decision 0295)."""
        policy = self.policies.effective()
        if not (policy.paused or policy.dry_run):
            for name, record in self.fleet.ticking():
                attempt = attempt_in_progress(record)
                if attempt is not None:
                    self._spawn(name, attempt)
                elif record.state is NodeState.MAINTENANCE and agent_requests.request_id(record):
                    self._spawn(name, record.since)
        for name in self.book.marked():  # in any state: triage and production are not ticked
            marked = self.fleet.records.get(name)
            if marked is not None:
                self._sweep(name, marked)

    def after(self, before: NodeRecord, record: NodeRecord) -> None:
        """A decision was stored: attempts it ended are cleaned up (mark, one-time boot)."""
        ended = _ended_attempts(before, record)
        if ended:
            self._clean(record.name, ended)

    def forget(self, name: str) -> None:
        """A deleted Node: nothing of its acts is kept."""
        for key in [k for k in self._results if k[0] == name]:
            del self._results[key]
        self._asked.pop(name, None)
        self._held_said.pop(name, None)
        self._held_back.pop(name, None)

    # ---------------------------------------------------------------- the task

    async def _drive(self, name: str, what: steps.Attempt | float) -> None:
        key: Key = (name, what)
        if key not in self._results:
            result = await (
                self._step(name, what) if isinstance(what, steps.Attempt) else self._command(name)
            )
            if result is None:
                return
            self._results[key] = result
        await self._record(name, what)

    async def _step(self, name: str, attempt: steps.Attempt) -> ev.Event | None:
        """Ask the gate for one attempt; the event to decide, or None (nothing to record)."""
        policy = self.policies.effective()
        step = attempt.step
        if step in steps.BMC_STEPS:

            async def prepare(body: Json) -> None:
                if step is Step.REIMAGE:  # the network boot must get a new join token
                    image = self.reimage_version(name)
                    await machines.rearm_for_reimage(
                        self.client, body, self.clock.now(), image=image
                    )

            outcome = await self.gate.bmc_step(name, attempt, policy=policy, prepare=prepare)
        else:
            outcome = await self.gate.agent_request(name, "gpu-reset", policy=policy)
        action = f"bmc-{step}" if step in steps.BMC_STEPS else f"request-{step}"
        if isinstance(outcome, Done):
            self._held_said.pop(name, None)
            self.metrics.actions.labels(action=action, result="ok").inc()
            if step not in steps.BMC_STEPS:
                self._asked[name] = (name, attempt)  # the agent answers on the Node
                return None
            log.info("node=%s %s done: %s", name, step, outcome.detail)
            await self._identity(name, mismatch=False, detail=outcome.detail)
            return ev.StepCompleted(step, True, outcome.detail)
        if isinstance(outcome, Failed):
            self.metrics.actions.labels(action=action, result="failed").inc()
            # Not logged here: the decision's reason says "<step> failed: <detail>" once.
            if outcome.identity:
                self._node_event(name, "Warning", "BmcIdentityMismatch", outcome.detail)
                await self._identity(name, mismatch=True, detail=outcome.detail)
            return ev.StepCompleted(step, False, outcome.detail)
        if isinstance(outcome, Refused):
            self.metrics.actions.labels(action=action, result="refused").inc()
            log.warning("node=%s %s refused by the gate: %s", name, step, outcome.detail)
            self._node_event(name, "Warning", "ActRefused", f"{step}: {outcome.detail}")
            return ev.WorkFound(step, outcome.detail)
        self._say_held(name, step, outcome)
        return None

    async def _command(self, name: str) -> ev.Event | None:
        """Ask the gate for the maintenance command the record names."""
        outcome = await self.gate.agent_request(name, "command", policy=self.policies.effective())
        if isinstance(outcome, Done):
            self._held_said.pop(name, None)
            record = self.fleet.records.get(name)
            if record is not None:
                self._asked[name] = (name, record.since)
            return None
        if isinstance(outcome, Refused):
            self._node_event(name, "Warning", "ActRefused", f"command: {outcome.detail}")
            return ev.WorkFound(None, outcome.detail)
        self._say_held(name, "command", outcome)
        return None

    def _say_held(self, name: str, what: object, outcome: Held | Stale | Failed | Done) -> None:
        if isinstance(outcome, Held):
            said = f"{what}: {outcome.detail}"
            if self._held_said.get(name) != said:
                self._held_said[name] = said
                log.warning("node=%s %s held by the gate: %s", name, what, outcome.detail)
                self._node_event(name, "Warning", "ActHeld", said)
        else:
            log.info("node=%s %s: %s", name, what, getattr(outcome, "detail", outcome))

    async def _record(self, name: str, what: steps.Attempt | float) -> None:
        """Feed the answer bound to its act: one that arrives after the record moved on
        (a timeout started the next rung) is dropped, not taken for a later act's."""
        key: Key = (name, what)
        result = self._results.get(key)
        if result is None:
            return

        def bound(record: NodeRecord) -> bool:
            if isinstance(what, steps.Attempt):
                return attempt_in_progress(record) == what
            return record.state is NodeState.MAINTENANCE and record.since == what

        try:
            stored = await self.decide_bound(name, result, bound)
        except NotFound:
            self._results.pop(key, None)
            return
        except ApiError as exc:
            log.warning("node=%s result not recorded yet: %s", name, exc)
            return
        self._results.pop(key, None)
        if stored is None:
            log.info("node=%s result dropped: no longer the act in progress", name)

    def _act_done(self, key: Key, task: asyncio.Task[Any]) -> None:
        """An act's task ended: the cleanups held back while it ran (a cleanup does not
        run beside it) run now, not a tick later. Not after a task that was stopped (a
        lost lease, a pause): their marks stay, and the next tick's sweep (the next
        holder's, or this replica's while paused) comes back to them."""
        self._running.discard(key)
        held = self._held_back.pop(key[0], ())
        if held and not task.cancelled():
            self._clean(key[0], held)

    # ------------------------------------------------------------- cleaning up

    def _sweep(self, name: str, record: NodeRecord) -> None:
        """A mark left by an attempt that is no longer in progress (a crash between the
        result and its cleanup): cleaned up, and a reimage's one-time boot removed."""
        mark = kube_bmc.mark_of(self.book.get(name))
        if mark is None:
            return
        current = attempt_in_progress(record)
        if current is not None and mark.binds(
            current.step.value, current.attempt, current.started_at
        ):
            return
        if mark.step == Step.REIMAGE.value and network_boot_may_be_starting(record):
            return  # its firmware may not have read the network boot yet (0177)
        self._clean(name, (steps.Attempt(Step(mark.step), mark.attempt, mark.started_at),))

    def _clean(self, name: str, ended: tuple[steps.Attempt, ...]) -> None:
        """Clean up ``ended`` attempts of ``name`` in a task of their own, never beside
        an act of the node: a one-time boot removed while the node's next reimage sets
        its own would cancel that one, and one removed while the ended attempt's own task
        is between its mark and its POST (an operator's triage at that moment) would turn
        the reset it still sends into a plain power cycle (both found by the simulation,
        decision 0255). Held back, it runs when the node's act task ends; its mark stays
        meanwhile, so a restart's sweep comes back to it. A pause does not stop it, a lost
        lease does (decision 0295)."""
        if any(key[0] == name for key in self._running):
            if (name, CLEANUP) not in self._running:  # run when the node's act ends
                self._held_back[name] = (*self._held_back.get(name, ()), *ended)
            return
        key: Key = (name, CLEANUP)
        self._running.add(key)
        task = self.tasks.spawn(self._cleanup(name, ended), f"cleanup {name}", restoring=True)
        task.add_done_callback(functools.partial(_discard, self._running, key))

    async def _cleanup(self, name: str, ended: tuple[steps.Attempt, ...]) -> None:
        window = self.policies.effective().provisioning.stall_seconds
        for attempt in ended:
            if attempt.step is Step.REIMAGE and not await self.gate.disarm(
                name, attempt, boot_window_s=window
            ):
                continue  # keep the mark: the next sweep tries again
            await self.gate.clear_mark(name, attempt)

    # ------------------------------------------------------------------ helpers

    def _node_event(self, name: str, type_: str, reason: str, message: str) -> None:
        body = self.book.get(name)
        if body is not None:
            self.events.node(body, type_, reason, message)

    async def _identity(self, name: str, *, mismatch: bool, detail: str) -> None:
        body = self.book.get(name)
        if body is not None:
            await kube_bmc.mismatch_condition(
                self.client, body, mismatch=mismatch, message=detail, now=self.clock.now()
            )


CLEANUP = "cleanup"
"""The key of a node's cleanup task in :attr:`GatedSteps._running`."""


def _discard(running: set[Key], key: Key, _task: object) -> None:
    running.discard(key)


def _ended_attempts(before: NodeRecord, after: NodeRecord) -> tuple[steps.Attempt, ...]:
    """The BMC attempt this decision ended other than by succeeding (failed, timed out,
    refused, or the node taken elsewhere): its mark goes, and a reimage's unused one-time
    boot is removed (docs/decisions/0143)."""
    prev = attempt_in_progress(before)
    if prev is None or prev.step not in steps.BMC_STEPS or attempt_in_progress(after) == prev:
        return ()
    for a in after.incident.tried if after.incident else ():
        same = (a.step, a.attempt, a.started_at) == (prev.step, prev.attempt, prev.started_at)
        if same and a.outcome is Outcome.SUCCEEDED:
            return ()
    return (prev,)
