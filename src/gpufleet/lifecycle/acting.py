"""Acting on what was recorded: Events, metrics, drains, BMC steps, the NodeRemediation.

Step 4 of the controller's contract: this runs only after the Node write that
stores the decision succeeded, so a crash between the two leaves a record that
the next pass (or a restarted controller's tick) acts on, never an action
without a record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.clock import Clock
from gpufleet.domain import well_known
from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.decide import Decision
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.repeats import Repeats
from gpufleet.domain.safety import Hold
from gpufleet.lifecycle.core import Json, S, log
from gpufleet.lifecycle.drain_loop import Drains
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.gated_steps import GatedSteps
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.policy import HoldNotices, PolicyKeeper
from gpufleet.lifecycle.remediation_sync import RemediationSync
from gpufleet.lifecycle.spare_pool import SparePool
from gpufleet.lifecycle.tasks import TaskGroup
from gpufleet.lifecycle.tickets import Tickets


@dataclass
class Acting:
    """Everything after the record is stored: Events, metrics, and the tasks that act.

    It starts work but does none of it: a drain is the drain loop's, a step the
    gated steps' (the only collaborator that reaches the gate), a ticket the
    ticket keeper's.
    """

    events: EventSink
    metrics: Metrics
    fleet: Fleet
    policies: PolicyKeeper
    holds: HoldNotices
    drains: Drains
    steps: GatedSteps
    spares: SparePool
    tickets: Tickets
    remediations: RemediationSync
    tasks: TaskGroup
    clock: Clock
    log_repeats: Repeats

    def after(
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
                swallowed = self.log_repeats.admit((name, event_reason), self.clock.monotonic())
                if swallowed is not None:
                    again = f" (said {swallowed} more times since)" if swallowed else ""
                    log.info("node=%s %s%s", name, event_reason, again)
            if d.transition is not None:
                t = d.transition
                m.transitions.labels(source=t.source.value, target=t.target.value).inc()
                done = ", ".join(str(a.kind) for a in d.actions)
                self.events.node(
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
                if self.holds.said(name) != said:
                    self.holds.say(name, said)
                    self.events.node(
                        body, "Warning", "ActionWithheld", f"{d.hold}: {withheld}{_which(d)}"
                    )
            elif d.actions or d.transition is not None:
                self.holds.clear(name)
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
        self._spare_pool_after(body, before, record)
        self.tickets.check(name)
        self.drains.ensure(record)
        incident = record.incident or before.incident
        if incident is not None and any(d.record != before for d in decisions):
            self.tasks.spawn(self.remediations.sync(record, incident, now), f"nrem {name}")
        for d in decisions:
            _observe_steps(m, before, d.record)
        self.steps.after(before, record)
        if self.fleet.dirty_breaker:
            self.policies.schedule_status_save()
        self.policies.update_gauges()

    def _spare_pool_after(self, body: Json, before: NodeRecord, record: NodeRecord) -> None:
        """Events for a node that joined or left the spare pool; promote spares for a
        node that left production."""
        if record.is_spare and not before.is_spare:
            self.events.node(
                body, "Normal", "SpareReserved", "kept as a hot spare: " + record.reason
            )
        elif before.is_spare and record.state is S.PRODUCTION and not record.spare:
            self.events.node(body, "Normal", "SparePromoted", "promoted from the spare pool")
        if before.state is S.PRODUCTION and record.state is not S.PRODUCTION:
            self.spares.promote(f"{record.name} left production: {record.reason}")

    def _act(self, body: Json, record: NodeRecord, a: Action, now: float) -> None:
        name = record.name
        kind = a.kind
        result = "ok"
        if kind is ActionKind.CORDON:
            self.events.node(body, "Warning", "Cordoned", a.detail or record.reason)
        elif kind is ActionKind.UNCORDON:
            annotations = body.get("metadata", {}).get("annotations") or {}
            ours = annotations.get(well_known.ANNOTATION_CORDONED) == well_known.CONTROLLER
            if ours or not body.get("spec", {}).get("unschedulable"):
                self.events.node(body, "Normal", "Uncordoned", "cleared gpufleet's cordon")
            else:
                result = "kept"  # someone else's cordon: not cleared
                self.events.node(body, "Normal", "CordonKept", "the cordon was not set by gpufleet")
        elif kind is ActionKind.RUN_STEP:
            assert a.step is not None
            self.events.node(body, "Warning", "StepStarted", f"{a.step}: {a.detail}")
            self.steps.start(name, a.step)
        elif kind is ActionKind.RUN_COMMAND:
            self.steps.start_command(name)
        elif kind is ActionKind.RESTART_JOB:
            self.events.node(body, "Warning", "RestartJob", a.detail)
        elif kind is ActionKind.QUARANTINE_GPU:
            self.events.node(body, "Warning", "GpuQuarantined", a.detail)
        elif kind is ActionKind.RELEASE_GPU:
            self.events.node(body, "Normal", "GpuReleased", a.detail)
        # NOTIFY: posted by the node pass before the record write (EventSink.node_first).
        self.metrics.actions.labels(action=kind.value, result=result).inc()


def _which(d: Decision) -> str:
    """Which budget held a decision, for its ActionWithheld Event (an NVLink domain's is
    named: docs/decisions/0232); empty for the other rails, whose hold says it all."""
    if d.hold is not Hold.BUDGET_EXHAUSTED or not d.reasons:
        return ""
    return f" ({d.reasons[-1].removeprefix('held: ')})"


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
