"""The decision function: (node record, fleet view, event, policy, now) -> decision.

Every handler below proposes a :class:`_Plan` (the record if the change goes
ahead, the record if it is held, actions, reasons, and which safety rails the
plan must pass); :func:`_gate` then applies pause, dry-run, the circuit
breaker, the disruption budget and the rate limit in that order. A held plan
keeps only its bookkeeping (fault occurrences, a pending fault, a finished
drain) so that a later ``Tick`` can try again.

Nothing here reads a clock or does I/O; ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.domain import (
    domain_burnin,
    domain_faults,
    lemon,
    maintenance,
    operator,
    spares,
    well_known,
)
from gpufleet.domain import events as ev
from gpufleet.domain import gpu_quarantine as quarantine
from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.faults import FaultEvent
from gpufleet.domain.ladder import NODE_ACTIONS, TERMINAL, Step, severity
from gpufleet.domain.modes import DrainMode, RequeueMode
from gpufleet.domain.policy import Policy, Response, Rule, Scope, TaintEffect
from gpufleet.domain.records import (
    FleetView,
    Incident,
    NodeRecord,
    Occurrence,
    Outcome,
    StepAttempt,
)
from gpufleet.domain.safety import (
    BreakerState,
    Hold,
    breaker_observe,
    breaker_refresh,
    budget_allows,
    rate_allows,
)
from gpufleet.domain.states import OUT_OF_SERVICE, NodeState, Trigger, transition
from gpufleet.domain.xids import XID_154_ACTIONS

S = NodeState


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about one event on one node.

    ``record`` is what to store (always; it may only carry bookkeeping when the
    decision is held). ``actions`` are to be carried out in order, after the
    record is stored. ``withheld`` lists what a safety rail (``hold``) stopped.
    """

    record: NodeRecord
    actions: tuple[Action, ...] = ()
    reasons: tuple[str, ...] = ()
    transition: Any = None  # states.Transition | None (Any keeps slots + forward refs simple)
    withheld: tuple[Action, ...] = ()
    hold: Hold | None = None
    breaker: BreakerState | None = None
    """The circuit breaker after this decision (store it fleet-wide)."""

    @property
    def changed(self) -> bool:
        """Whether the node changes state."""
        return self.transition is not None


@dataclass(frozen=True, slots=True)
class _Plan:
    applied: NodeRecord
    held: NodeRecord
    actions: tuple[Action, ...] = ()
    reasons: tuple[str, ...] = ()
    transition: Any = None
    breaker: BreakerState | None = None
    isolates: bool = False
    """Takes the node out of production (circuit breaker)."""
    acts_on_node: bool = False
    """Runs a remediation step (breaker)."""
    extra: tuple[str, ...] = field(default=())
    held_actions: tuple[Action, ...] = ()
    """Notices that stand when a rail holds the plan (what the held record says changed)."""
    domain_scale: bool = False
    """Takes the node out with its faulty NVLink domain: the domain's own budget does not
    hold it (the pool's, the fleet's and the group's do; docs/decisions/0240)."""


@dataclass(frozen=True, slots=True)
class _Ctx:
    record: NodeRecord
    fleet: FleetView
    policy: Policy
    now: float
    breaker: BreakerState


def decide(
    record: NodeRecord, fleet: FleetView, event: ev.Event, policy: Policy, now: float
) -> Decision:
    """Decide what an event means for a node. Pure: same inputs, same decision."""
    breaker = breaker_refresh(
        fleet.breaker, now=now, config=policy.safety.breaker, fleet_size=fleet.size
    )
    ctx = _Ctx(_prune(record, policy, now), fleet, policy, now, breaker)
    handler = _HANDLERS[type(event)]
    plan = handler(ctx, event)
    return _gate(ctx, plan)


# --------------------------------------------------------------------- gating


def _gate(ctx: _Ctx, plan: _Plan) -> Decision:
    breaker = plan.breaker or ctx.breaker
    changes = plan.transition is not None or any(
        a.kind not in (ActionKind.NOTIFY,) for a in plan.actions
    )
    hold: Hold | None = None
    why = ""
    if changes:
        p = ctx.policy
        if p.paused:
            hold = Hold.PAUSED
        elif p.dry_run:
            hold = Hold.DRY_RUN
        elif (plan.isolates or plan.acts_on_node) and breaker.is_open:
            hold = Hold.BREAKER_OPEN
        elif _enters_service_hold(plan) and (short := _budget_short(ctx, plan)) is not None:
            hold, why = Hold.BUDGET_EXHAUSTED, short
        elif any(a.disruptive for a in plan.actions) and not rate_allows(
            ctx.fleet.recent_actions, now=ctx.now, config=p.safety.rate_limit
        ):
            hold = Hold.RATE_LIMITED
    breaker_out = breaker if breaker != ctx.fleet.breaker else None
    if hold is None:
        return Decision(
            record=plan.applied,
            actions=plan.actions,
            reasons=plan.reasons,
            transition=plan.transition,
            breaker=breaker_out,
        )
    why = why or _HOLD_TEXT[hold]
    return Decision(
        record=plan.held,
        actions=plan.held_actions,
        reasons=(*plan.reasons, f"held: {why}"),
        withheld=plan.actions,
        hold=hold,
        breaker=breaker_out,
    )


_HOLD_TEXT = {
    Hold.PAUSED: "the policy is paused",
    Hold.DRY_RUN: "dry-run: nothing is changed",
    Hold.BREAKER_OPEN: "the circuit breaker is open (too many nodes faulted at once)",
    Hold.BUDGET_EXHAUSTED: "the disruption budget (of the pool or the fleet) is used up",
    Hold.RATE_LIMITED: "the disruptive-action rate limit is reached",
}


def _enters_service_hold(plan: _Plan) -> bool:
    """Whether the plan moves the node into a state the budget counts.

    Every such entry is checked, not only isolation from production: a batch of
    nodes returned from triage or maintenance into verification counts too.
    """
    t = plan.transition
    return (
        t is not None
        and t.target in OUT_OF_SERVICE
        and t.source not in OUT_OF_SERVICE
        and t.trigger is not Trigger.WORK_FOUND  # already out: drained again, not taken out
    )


def _budget_short(ctx: _Ctx, plan: _Plan) -> str | None:
    """None when every budget that covers the node allows one more out; otherwise why not
    (the NVLink domain's budget is named with its domain; it does not hold a tray taken
    out with its faulty domain, which is out of work either way, nor a tray of a
    domain-scope plan's domain: the plan empties the domain on purpose, decision 0244)."""
    per_domain = ctx.policy.domain_budget
    name = ctx.record.nvlink_domain
    exempt = plan.domain_scale or _domain_consented(plan, name)
    if per_domain is not None and name and not exempt:
        me = 1 if ctx.record.state in OUT_OF_SERVICE else 0
        out = ctx.fleet.domain(name).out_of_service - me
        if not per_domain.allows(out):
            return (
                f"the disruption budget of NVLink domain {name} is used up "
                f"({out} of at most {per_domain.max_nodes} out)"
            )
    return None if _budget_ok(ctx) else _HOLD_TEXT[Hold.BUDGET_EXHAUSTED]


def _domain_consented(plan: _Plan, domain: str) -> bool:
    """Whether the node goes out for a domain-scope plan of its own NVLink domain: the
    plan's explicit scope is the operator's consent to exceed that domain's budget, for
    that domain and that incident only (the pool's, the fleet's and the group's still
    hold, and the breaker)."""
    inc = plan.applied.incident
    return inc is not None and inc.whole_domain == domain


def _budget_ok(ctx: _Ctx) -> bool:
    """The pool's budget, the fleet's when the policy sets one (every pool together) and
    the node group's when its override sets one (the group's nodes): every budget that
    covers the node must allow it (docs/decisions/0225; the NVLink domain's: 0232)."""
    pool = ctx.fleet.pool(ctx.record.pool)
    me = 1 if ctx.record.state in OUT_OF_SERVICE else 0
    budget = ctx.policy.safety.budget
    group_budget = ctx.policy.group_budget
    if group_budget is not None:
        group = ctx.fleet.group(ctx.policy.group)
        if not budget_allows(
            out_of_service=group.out_of_service - me, pool_size=group.size, config=group_budget
        ):
            return False
    fleet_out = fleet_size = 0
    if budget.fleet_limited:
        pools = ctx.fleet.pools.values()
        fleet_out = sum(p.out_of_service for p in pools) - me
        fleet_size = sum(p.size for p in pools)
    return budget_allows(
        out_of_service=pool.out_of_service - me,
        pool_size=pool.size,
        config=budget,
        fleet_out_of_service=fleet_out,
        fleet_size=fleet_size,
    )


def _noop(ctx: _Ctx, *reasons: str, record: NodeRecord | None = None) -> _Plan:
    r = record or ctx.record
    return _Plan(applied=r, held=r, reasons=reasons)


def _move(
    ctx: _Ctx, record: NodeRecord, target: NodeState, trigger: Trigger, reason: str
) -> tuple[NodeRecord, Any]:
    t = transition(record.state, target, trigger=trigger, reason=reason, at=ctx.now)
    return record.moved(t), t


# ---------------------------------------------------------------- bookkeeping


def _prune(record: NodeRecord, policy: Policy, now: float) -> NodeRecord:
    keep = max(policy_window(policy), policy.domain_faults.window_seconds)
    occ = tuple(o for o in record.occurrences if now - o.at < keep)
    if occ == record.occurrences:
        return record
    return replace(record, occurrences=occ)


def policy_window(policy: Policy) -> float:
    """The longest repeat window of the policy: how long occurrences are kept."""
    windows = [r.repeat.window_seconds for r in policy.rules if r.repeat is not None]
    return max(windows, default=0.0)


def _remember(record: NodeRecord, fault: FaultEvent) -> NodeRecord:
    occ = Occurrence(key=fault.key, scope=fault.evidence.scope(), at=fault.at)
    if occ in record.occurrences:
        return record
    return replace(record, occurrences=(*record.occurrences, occ))


def _scored(
    record: NodeRecord, fault: FaultEvent, policy: Policy, now: float, *, out: bool
) -> NodeRecord:
    """``record`` with ``fault`` added to its lemon score (domain.lemon).

    ``out``: the fault takes the node out. An application fault that does (its
    repeats escalated to a node action) counts as hardware: repeats of a
    program's error on one GPU point at the GPU.
    """
    cls = lemon.fault_class(fault)
    if out and cls is lemon.FaultClass.APPLICATION:
        cls = lemon.FaultClass.HARDWARE
    score = lemon.add(
        record.lemon,
        weight=policy.lemon.weights.of(cls),
        scope=fault.evidence.scope(),
        now=now,
        half_life_seconds=policy.lemon.half_life_seconds,
    )
    return replace(record, lemon=score)


def respond(rule: Rule, fault: FaultEvent, record: NodeRecord, now: float) -> tuple[Response, str]:
    """How a rule answers a fault, given the node's recent occurrences.

    ``record`` must already contain this occurrence. Returns the response and
    a sentence saying why.
    """
    response, why = rule.action, f"{fault.key}: rule action {rule.action}"
    rep = rule.repeat
    if rep is not None:
        scope = fault.evidence.scope()
        count = sum(
            1
            for o in record.occurrences
            if o.key == fault.key
            and now - o.at < rep.window_seconds
            and (rep.scope is Scope.NODE or o.scope == scope)
        )
        where = "on the node" if rep.scope is Scope.NODE else f"on {scope}"
        if count >= rep.count:
            response = rep.then
            window = f"{rep.window_seconds:g}s"
            why = f"{fault.key}: {count} occurrences {where} within {window} -> {rep.then}"
        else:
            why += f" ({count} of {rep.count} occurrences {where} before {rep.then})"
    if fault.xid == 154 and fault.evidence.recovery_action:
        wanted = XID_154_ACTIONS.get(fault.evidence.recovery_action)
        if (
            wanted is not None
            and response.step in NODE_ACTIONS | {None}
            and (response.step is None or severity(wanted) > severity(response.step))
        ):
            response = Response(wanted.value)
            why += f"; driver asks for {fault.evidence.recovery_action} -> {wanted}"
    return response, why


# ------------------------------------------------------------------- handlers


def _on_fault(ctx: _Ctx, event: ev.FaultObserved) -> _Plan:
    fault = event.fault
    rule = ctx.policy.rule_for(fault)
    book = _remember(ctx.record, fault)
    response, why = respond(rule, fault, book, ctx.now)
    desc = f"{fault.describe()}: {fault.evidence.summary()}".rstrip(": ")
    if response is Response.IGNORE:
        return _noop(replace(ctx, record=book), why)
    if book is not ctx.record and book.state is S.PRODUCTION and response.step is None:
        # Restarted or logged while it serves: counts now; an isolation counts in _isolate.
        book = _scored(book, fault, ctx.policy, ctx.now, out=False)
    ctx = replace(ctx, record=book)
    if response is Response.LOG or (
        response is Response.RESTART_JOB and book.state is not S.PRODUCTION
    ):
        return _Plan(
            applied=book,
            held=book,
            actions=(Action(ActionKind.NOTIFY, detail=desc),),
            reasons=(why,),
        )
    if response is Response.RESTART_JOB:
        return _Plan(
            applied=book,
            held=book,
            actions=(Action(ActionKind.RESTART_JOB, detail=desc),),
            reasons=(why,),
        )
    step = response.step
    assert step is not None
    state = book.state
    if state is S.PRODUCTION:
        return _take_out(ctx, fault, rule, step, why, desc)
    if state is S.BURN_IN:
        rec, t = _move(ctx, book, S.TRIAGE, Trigger.BURN_IN_FAILED, f"failed burn-in: {desc}")
        return _Plan(
            applied=rec,
            held=book,
            actions=(Action(ActionKind.NOTIFY, detail=f"burn-in failed: {desc}"),),
            reasons=(why, "a fault during burn-in sends new hardware to triage"),
            transition=t,
        )
    if state is S.DRAINING and book.incident is not None:
        return _raise_plan(ctx, book, book.incident, rule, step, why, desc)
    if state is S.VERIFYING:
        return _checks_failed(ctx, f"fault during verification: {desc}", why)
    return _noop(ctx, why, f"recorded only: the node is in {state}")


def _isolate(
    ctx: _Ctx,
    fault: FaultEvent,
    rule: Rule,
    step: Step,
    why: str,
    desc: str,
    *,
    retry: bool = False,
) -> _Plan:
    """Take the node out for ``fault``: cordon, taint, drain; the incident's plan is ``step``.

    A fault still held on the node (``pending``) is not dropped by a later one: the
    incident starts at the more severe of the two steps and a Notice says so.
    ``retry``: the held fault itself, tried again; it was counted by the breaker
    when it was first seen, and is not counted again (a retry is not a new fault).
    """
    book = ctx.record
    policy = ctx.policy
    reasons = [why]
    scored = _scored(book, fault, policy, ctx.now, out=True)
    plan, raised = _lemon_raise(ctx, scored, step)
    if raised:
        reasons.append(raised)
    own = plan  # what this fault alone asks for (kept if the rails hold it)
    notices: list[Action] = []
    held, held_step = book.pending, book.pending_step
    if not retry and held is not None and held_step is not None:
        if severity(held_step) > severity(plan):
            plan = held_step
        text = (
            f"held fault {held.key} (step {held_step}) is handled by this incident"
            f" ({fault.key}), which starts at {plan}"
        )
        reasons.append(text)
        notices.append(Action(ActionKind.NOTIFY, detail=text))
    incident = Incident(
        key=fault.key,
        description=desc,
        opened_at=ctx.now,
        plan=plan,
        taint=rule.taint,
        drain_mode=rule.drain or policy.drain.mode,
        requeue=rule.requeue,
        if_slurm_silent=rule.if_slurm_silent,
    )
    breaker = _observed(ctx, retry)
    applied = replace(
        scored,
        incident=incident,
        pending=None,
        pending_step=None,
    )
    applied, t = _move(ctx, applied, S.DRAINING, Trigger.FAULT, desc)
    actions = (
        Action(ActionKind.CORDON, detail=desc),
        Action(ActionKind.TAINT, detail=well_known.TAINT_UNHEALTHY, taint=rule.taint),
        Action(
            ActionKind.DRAIN,
            detail=desc,
            drain_mode=incident.drain_mode,
            requeue=incident.requeue,
            timeout_seconds=policy.drain.timeout_seconds,
        ),
        *notices,
    )
    held_record, held_notices = _hold_fault(book, fault, own)
    return _Plan(
        applied=applied,
        held=held_record,
        held_actions=held_notices,
        actions=actions,
        reasons=tuple(reasons),
        transition=t,
        breaker=breaker,
        isolates=True,
    )


def _lemon_raise(ctx: _Ctx, scored: NodeRecord, step: Step) -> tuple[Step, str]:
    """The step a lemon verdict on ``scored`` (the record with this fault counted) raises
    ``step`` to, and why ("" and ``step`` when it does not)."""
    policy = ctx.policy
    verdict = lemon.judge(
        scored.lemon,
        now=ctx.now,
        threshold=policy.lemon.threshold,
        gpu_threshold=policy.lemon.gpu_threshold,
    )
    then = policy.lemon.then.step
    if verdict.lemon and then is not None and severity(then) > severity(step):
        return then, f"lemon: {verdict.why} -> {then} instead of another repair"
    return step, ""


def _observed(ctx: _Ctx, retry: bool) -> BreakerState:
    """The breaker with this fault counted; a retry of a held fault is not a new fault."""
    if retry:
        return ctx.breaker
    return breaker_observe(
        ctx.breaker,
        node=ctx.record.name,
        now=ctx.now,
        config=ctx.policy.safety.breaker,
        fleet_size=ctx.fleet.size,
    )


def _take_out(
    ctx: _Ctx,
    fault: FaultEvent,
    rule: Rule,
    step: Step,
    why: str,
    desc: str,
    *,
    retry: bool = False,
) -> _Plan:
    """Quarantine the fault's GPU where the policy and the fault allow it
    (domain.gpu_quarantine), else take the node out (:func:`_isolate`), saying why not."""
    policy = ctx.policy
    if not policy.gpu_quarantine.enabled:
        return _isolate(ctx, fault, rule, step, why, desc, retry=retry)
    choice = quarantine.choose(policy.gpu_quarantine, ctx.record, fault, step, ctx.now)
    if choice.gpu is not None:
        scored = _scored(ctx.record, fault, policy, ctx.now, out=True)
        raised_to, raised = _lemon_raise(ctx, scored, step)
        if raised_to is step:
            return _quarantine(ctx, fault, step, choice, (why, choice.why), scored, retry=retry)
        choice = quarantine.Choice(None, f"{raised}: the node is taken")
    plan = _isolate(ctx, fault, rule, step, why, desc, retry=retry)
    return replace(plan, reasons=(*plan.reasons, choice.why))


def _quarantine(
    ctx: _Ctx,
    fault: FaultEvent,
    step: Step,
    choice: quarantine.Choice,
    reasons: tuple[str, ...],
    scored: NodeRecord,
    *,
    retry: bool,
) -> _Plan:
    """Take one GPU out of service and keep the node in production: nothing but the work on
    that GPU is disrupted, so the budget does not count it; pause, dry-run and an open
    breaker hold it (a monitor gone wrong on every node must not quarantine the fleet's
    GPUs either), and the breaker counts it as a fault. Held, it stays pending like a node's
    isolation and is tried again on every Tick."""
    gpu = choice.gpu
    assert gpu is not None
    book = ctx.record
    applied = replace(scored, quarantined_gpus=(*scored.quarantined_gpus, gpu))
    if retry:
        applied = replace(applied, pending=None, pending_step=None)
    breaker = _observed(ctx, retry)
    text = (
        f"GPU {gpu.index} quarantined for {fault.describe()}: no new work on it, "
        "the node keeps serving on its other GPUs"
    )
    actions: tuple[Action, ...] = (Action(ActionKind.QUARANTINE_GPU, detail=text, gpu=gpu.index),)
    if retry:  # the held fault leaves the record into a quarantine, not an incident: said
        done = f"held fault {fault.key} handled: GPU {gpu.index} quarantined"
        actions = (*actions, Action(ActionKind.NOTIFY, detail=done))
    held_record, held_notices = _hold_fault(book, fault, step)
    return _Plan(
        applied=applied,
        held=held_record,
        held_actions=held_notices,
        actions=actions,
        reasons=reasons,
        breaker=breaker,
        isolates=True,
    )


def _quarantine_repair(ctx: _Ctx) -> _Plan:
    """Take a node that kept a GPU quarantined for ``repairAfterSeconds`` out for the repair
    (the GPU reset that applies the remap needs the node empty, through the one gate): it
    drains letting its jobs finish (no job is cut short for a repair that can wait), through
    every rail as any isolation; the ladder starts at gpu-reset, and verification passed
    releases the GPUs (:func:`_to_production`)."""
    r = ctx.record
    desc = f"repair of quarantined {quarantine.describe(r.quarantined_gpus)}"
    incident = Incident(
        key=r.quarantined_gpus[0].fault,
        description=desc,
        opened_at=ctx.now,
        plan=Step.GPU_RESET,
        drain_mode=DrainMode.WAIT,
        requeue=RequeueMode.LET_FINISH,
    )
    applied, t = _move(ctx, replace(r, incident=incident), S.DRAINING, Trigger.FAULT, desc)
    actions = (
        Action(ActionKind.CORDON, detail=desc),
        Action(ActionKind.TAINT, detail=well_known.TAINT_UNHEALTHY, taint=TaintEffect.NO_SCHEDULE),
        Action(
            ActionKind.DRAIN,
            detail=desc,
            drain_mode=DrainMode.WAIT,
            requeue=RequeueMode.LET_FINISH,
            timeout_seconds=ctx.policy.drain.timeout_seconds,
        ),
    )
    why = (
        f"{desc}: the GPU reset needs the node empty; it drains letting its jobs finish"
        if ctx.policy.gpu_quarantine.enabled
        else f"{desc}: gpuQuarantine is off now, so the GPUs are repaired at once"
    )
    return _Plan(
        applied=applied, held=r, actions=actions, reasons=(why,), transition=t, isolates=True
    )


def _hold_fault(
    record: NodeRecord, fault: FaultEvent, step: Step
) -> tuple[NodeRecord, tuple[Action, ...]]:
    """Keep a withheld fault as the node's pending incident (the most severe one wins),
    and the Notice that says which, when two are held at once.

    Several faults held on one node become one incident when the rails allow it;
    the occurrences of all of them stay in the record either way. Neither is dropped
    silently: the one that does not stay pending is named in a Notice with the one
    that handles it.
    """
    held, current = record.pending, record.pending_step
    if held is None or current is None or held.key == fault.key:
        return replace(record, pending=fault, pending_step=step), ()
    if severity(current) > severity(step):
        text = f"{fault.key} (step {step}) is held with {held.key}, which asks for more ({current})"
        return record, (Action(ActionKind.NOTIFY, detail=text),)
    text = f"held fault {held.key} (step {current}) is handled by {fault.key} (step {step}), held"
    return replace(record, pending=fault, pending_step=step), (
        Action(ActionKind.NOTIFY, detail=text),
    )


def _raise_plan(
    ctx: _Ctx, book: NodeRecord, incident: Incident, rule: Rule, step: Step, why: str, desc: str
) -> _Plan:
    if incident.plan is None or severity(step) <= severity(incident.plan):
        return _noop(ctx, why, "recorded: the node is already draining")
    raised = replace(incident, plan=step)
    actions: tuple[Action, ...] = ()
    if rule.taint is TaintEffect.NO_EXECUTE and incident.taint is not TaintEffect.NO_EXECUTE:
        raised = replace(raised, taint=TaintEffect.NO_EXECUTE)
        actions = (
            Action(
                ActionKind.TAINT, detail=well_known.TAINT_UNHEALTHY, taint=TaintEffect.NO_EXECUTE
            ),
        )
    rec = replace(book, incident=raised)
    return _Plan(
        applied=rec,
        held=rec,
        actions=actions,
        reasons=(why, f"remediation will start at {step} ({desc})"),
    )


def _on_cleared(ctx: _Ctx, event: ev.FaultCleared) -> _Plan:
    r = ctx.record
    if r.pending is not None and r.pending.key == event.key:
        return _noop(
            ctx,
            f"{event.key} cleared; the held fault stays pending until it is acted on or dismissed",
        )
    return _noop(ctx, f"{event.key} cleared (no effect in {r.state})")


def _on_drained(ctx: _Ctx, event: ev.DrainCompleted) -> _Plan:
    r = ctx.record
    if r.state is not S.DRAINING or r.incident is None:
        return _noop(ctx, f"drain completion ignored in {r.state}")
    rec = replace(r, incident=replace(r.incident, drained=True))
    return _after_drain(replace(ctx, record=rec))


def _after_drain(ctx: _Ctx) -> _Plan:
    r = ctx.record
    inc = r.incident
    assert inc is not None
    if domain_faults.held(inc):
        return _noop(ctx, _HELD_TEXT.format(domain=r.nvlink_domain or "?"))
    wait = domain_faults.waits(r, ctx.policy.domain_faults, ctx.now)
    if wait > 0:
        return _noop(
            ctx,
            f"{inc.key}: this tray's own repair waits {wait:.0f}s more for other trays of "
            f"NVLink domain {r.nvlink_domain} (a fault of the fabric is judged with its domain)",
        )
    if inc.maintenance:
        rec, t = _move(ctx, r, S.MAINTENANCE, Trigger.DRAIN_COMPLETED, inc.description)
        command = maintenance.command_of(rec)
        actions: tuple[Action, ...] = ()
        if command is not None:  # a plan's command: the agent runs it now
            timeout = inc.command_timeout_s
            actions = (Action(ActionKind.RUN_COMMAND, detail=command, timeout_seconds=timeout),)
        return _Plan(
            applied=rec, held=r, actions=actions, reasons=("drained for maintenance",), transition=t
        )
    return _start_rung(ctx, r, inc, "drained")


def _next_rung(inc: Incident, policy: Policy) -> Step:
    if not inc.tried:
        assert inc.plan is not None
        return inc.plan
    last = inc.tried[-1]
    if last.outcome is Outcome.REFUSED:
        return last.step  # not carried out: the same rung again, once the node is empty
    entry = policy.ladder_entry(last.step)
    if last.outcome in (Outcome.FAILED, Outcome.TIMED_OUT) and entry is not None:
        tries = sum(1 for a in inc.tried if a.step == last.step and a.outcome != Outcome.REFUSED)
        if tries < entry.attempts:
            return last.step
    return policy.next_step(last.step)


def _start_rung(ctx: _Ctx, r: NodeRecord, inc: Incident, why: str) -> _Plan:
    """Start the next rung (or hand off to people) from draining / remediating / verifying;
    none for a tray held with its NVLink domain."""
    if domain_faults.held(inc):
        text = _HELD_TEXT.format(domain=r.nvlink_domain or "?")
        return _noop(ctx, why, text, record=replace(r, incident=inc))
    step = _next_rung(inc, ctx.policy)
    if step in TERMINAL:
        target = S.TRIAGE if step is Step.TRIAGE else S.RMA
        trigger = Trigger.LADDER_EXHAUSTED if inc.tried else Trigger.FAULT
        text = f"{step}: {inc.description}"
        rec, t = _move(ctx, r, target, trigger, text)
        rec = replace(rec, incident=replace(inc, current=None))
        return _Plan(
            applied=rec,
            held=r,
            actions=(Action(ActionKind.NOTIFY, detail=text),),
            reasons=(why, f"-> {target}"),
            transition=t,
        )
    entry = ctx.policy.ladder_entry(step)
    timeout = entry.timeout_seconds if entry is not None else None
    attempt = 1 + sum(1 for a in inc.tried if a.step == step)
    started = replace(
        inc,
        current=step,
        tried=(*inc.tried, StepAttempt(step=step, attempt=attempt, started_at=ctx.now)),
        checks_started_at=None,
    )
    rec = replace(r, incident=started)
    t = None
    if r.state is not S.REMEDIATING:
        rec, t = _move(
            ctx,
            rec,
            S.REMEDIATING,
            Trigger.DRAIN_COMPLETED if r.state is S.DRAINING else Trigger.VERIFICATION_FAILED,
            f"{step} (attempt {attempt}): {inc.description}",
        )
    action = Action(ActionKind.RUN_STEP, step=step, detail=inc.description, timeout_seconds=timeout)
    held = replace(r, incident=replace(inc, current=None))
    return _Plan(
        applied=rec,
        held=held,
        actions=(action,),
        reasons=(why, f"start {step} (attempt {attempt})"),
        transition=t,
        acts_on_node=True,
    )


def _on_step(ctx: _Ctx, event: ev.StepCompleted) -> _Plan:
    r = ctx.record
    inc = r.incident
    if r.state is not S.REMEDIATING or inc is None or inc.current != event.step:
        return _noop(ctx, f"{event.step} result ignored: not the step in progress")
    outcome = Outcome.SUCCEEDED if event.succeeded else Outcome.FAILED
    return _finish_step(ctx, r, inc, outcome, event.detail)


MAX_REFUSALS = 3
"""Acts refused for work found on the node, per incident, before it goes to triage."""


def _on_work_found(ctx: _Ctx, event: ev.WorkFound) -> _Plan:
    """The act was refused because the node is not empty: drain it again, never escalate.

    A ladder step (or a maintenance command) is asked for again once the node is
    drained anew; a refused attempt does not count against the step's attempts. A
    node that keeps getting work during its repair goes to triage at the
    :data:`MAX_REFUSALS`-th refusal: a person looks at what lands on it.
    """
    r = ctx.record
    inc = r.incident
    if inc is None:
        return _noop(ctx, f"work found ignored in {r.state}: no incident")
    detail = event.detail or "the node is not empty"
    if r.state is S.REMEDIATING and inc.current is not None and inc.current is event.step:
        last = replace(inc.tried[-1], ended_at=ctx.now, outcome=Outcome.REFUSED, detail=detail)
        inc = replace(inc, current=None, tried=(*inc.tried[:-1], last))
    elif not (r.state is S.MAINTENANCE and event.step is None):
        return _noop(ctx, f"work found ignored in {r.state}: not the act in progress")
    refusals = inc.refusals + 1
    inc = replace(inc, drained=False, refusals=refusals, checks_started_at=None)
    what = str(event.step) if event.step is not None else "the maintenance command"
    if refusals >= MAX_REFUSALS:
        text = f"{what} refused {refusals} times: {detail}; held for a person"
        rec, t = _move(ctx, replace(r, incident=inc), S.TRIAGE, Trigger.WORK_FOUND, text)
        return _Plan(
            applied=rec,
            held=r,
            actions=(Action(ActionKind.NOTIFY, detail=text),),
            reasons=(text,),
            transition=t,
        )
    text = f"{what} not started: {detail}; draining again (refusal {refusals})"
    rec, t = _move(ctx, replace(r, incident=inc), S.DRAINING, Trigger.WORK_FOUND, text)
    actions = (
        Action(
            ActionKind.DRAIN,
            detail=text,
            drain_mode=inc.drain_mode,
            requeue=inc.requeue,
            timeout_seconds=ctx.policy.drain.timeout_seconds,
        ),
        Action(ActionKind.NOTIFY, detail=text),
    )
    return _Plan(applied=rec, held=r, actions=actions, reasons=(text,), transition=t)


def _finish_step(ctx: _Ctx, r: NodeRecord, inc: Incident, outcome: Outcome, detail: str) -> _Plan:
    last = replace(inc.tried[-1], ended_at=ctx.now, outcome=outcome, detail=detail)
    done = replace(inc, current=None, tried=(*inc.tried[:-1], last))
    rec = replace(r, incident=done)
    if domain_faults.held(done):  # the step began before its domain was judged faulty
        return _noop(
            ctx, f"{last.step} {outcome}", _HELD_TEXT.format(domain=r.nvlink_domain), record=rec
        )
    if outcome is Outcome.SUCCEEDED:
        return _verify(ctx, rec, done, Trigger.STEP_SUCCEEDED, f"{last.step} done; verifying")
    return _start_rung(
        replace(ctx, record=rec), rec, done, f"{last.step} {outcome}: {detail}".rstrip(": ")
    )


def _verify(ctx: _Ctx, r: NodeRecord, inc: Incident, trigger: Trigger, reason: str) -> _Plan:
    checks = ctx.policy.checks
    inc = replace(inc, checks_started_at=ctx.now)
    rec, t = _move(ctx, replace(r, incident=inc), S.VERIFYING, trigger, reason)
    actions = (
        Action(ActionKind.TAINT, detail=well_known.TAINT_UNVERIFIED, taint=TaintEffect.NO_SCHEDULE),
        Action(
            ActionKind.RUN_CHECKS,
            profile=checks.verification_profile,
            timeout_seconds=checks.verification_timeout_seconds,
        ),
    )
    return _Plan(applied=rec, held=r, actions=actions, reasons=(reason,), transition=t)


def _on_checks(ctx: _Ctx, event: ev.ChecksCompleted) -> _Plan:
    r = ctx.record
    if r.state is S.VERIFYING and domain_faults.held(r.incident):
        return _noop(ctx, "check result ignored", _HELD_TEXT.format(domain=r.nvlink_domain))
    if r.state is S.VERIFYING:
        if event.passed:
            return _passed(ctx, Trigger.VERIFICATION_PASSED, "verification passed")
        return _checks_failed(ctx, f"verification failed: {event.detail}".rstrip(": "))
    if r.state is S.BURN_IN:
        if event.passed:
            return _passed(ctx, Trigger.BURN_IN_PASSED, "burn-in passed")
        return _burn_in_failed(ctx, f"burn-in failed: {event.detail}".rstrip(": "))
    return _noop(ctx, f"check result ignored in {r.state}")


def _burn_in_failed(ctx: _Ctx, text: str) -> _Plan:
    r = ctx.record
    rec, t = _move(ctx, r, S.TRIAGE, Trigger.BURN_IN_FAILED, text)
    return _Plan(
        applied=replace(rec, checks_started_at=None),
        held=r,
        actions=(Action(ActionKind.NOTIFY, detail=text),),
        reasons=(text,),
        transition=t,
    )


def _passed(ctx: _Ctx, trigger: Trigger, text: str) -> _Plan:
    """Node checks passed: production, unless the node's NVLink domain must be burnt in
    as a unit first (domain.domain_burnin.awaits): then it waits, in its state, with no
    check running (so no check timeout), for a verdict kept after now."""
    r = ctx.record
    domain = domain_burnin.awaits(r, ctx.fleet, ctx.policy)
    if domain is None:
        return _to_production(ctx, trigger, text)
    why = (
        f"{text}; waiting for the burn-in of NVLink domain {domain} (no tray of it is in "
        f"production: gpufleet burn-in domain {domain})"
    )
    inc = r.incident if r.incident is None else replace(r.incident, checks_started_at=None)
    rec = replace(r, reason=why, domain_wait=ctx.now, checks_started_at=None, incident=inc)
    return _Plan(
        applied=rec, held=r, actions=(Action(ActionKind.NOTIFY, detail=why),), reasons=(why,)
    )


def _on_domain_burn_in(ctx: _Ctx, event: ev.DomainBurnInJudged) -> _Plan:
    """The verdict a waiting tray needs: production when it passed, the tray's own failed
    checks when it is named, else held with the reason (a later run counts)."""
    r = ctx.record
    if (
        r.domain_wait is None
        or r.state not in (S.BURN_IN, S.VERIFYING)
        or event.domain != r.nvlink_domain
        or event.at <= r.domain_wait
    ):
        return _noop(ctx, f"domain burn-in verdict of {event.domain} ignored: not waited for")
    done = replace(ctx, record=replace(r, domain_wait=None))
    if event.passed:
        trigger = Trigger.BURN_IN_PASSED if r.state is S.BURN_IN else Trigger.VERIFICATION_PASSED
        return _to_production(
            done, trigger, f"node checks and the burn-in of NVLink domain {event.domain} passed"
        )
    if r.name in event.bad:
        text = f"named bad by the burn-in of NVLink domain {event.domain}: {event.reason}"
        if r.state is S.BURN_IN:
            return _burn_in_failed(done, f"burn-in failed: {text}")
        return _checks_failed(done, f"verification failed: {text}")
    why = (
        f"held: the burn-in of NVLink domain {event.domain} failed: {event.reason}; "
        f"waiting for a run that passes (gpufleet burn-in domain {event.domain})"
    )
    rec = replace(r, reason=why, domain_wait=event.at)
    return _Plan(
        applied=rec, held=r, actions=(Action(ActionKind.NOTIFY, detail=why),), reasons=(why,)
    )


def _checks_failed(ctx: _Ctx, text: str, *why: str) -> _Plan:
    r = ctx.record
    inc = r.incident or Incident(
        key="verification", description=text, opened_at=ctx.now, plan=ctx.policy.first_step()
    )
    if inc.plan is None:  # after maintenance: start the ladder from its first rung
        inc = replace(inc, plan=ctx.policy.first_step())
    inc = replace(inc, checks_started_at=None)
    plan = _start_rung(
        replace(ctx, record=replace(r, incident=inc)), replace(r, incident=inc), inc, text
    )
    return replace(plan, reasons=(*why, *plan.reasons))


def _to_production(ctx: _Ctx, trigger: Trigger, reason: str) -> _Plan:
    r = ctx.record
    rec, t = _move(ctx, r, S.PRODUCTION, trigger, reason)
    rec = replace(rec, incident=None, pending=None, pending_step=None, checks_started_at=None)
    actions: tuple[Action, ...] = (Action(ActionKind.UNTAINT), Action(ActionKind.UNCORDON))
    reasons: tuple[str, ...] = (reason,)
    if r.quarantined_gpus:  # the repair that needed the node empty was verified
        rec = replace(rec, quarantined_gpus=())
        released = tuple(
            Action(
                ActionKind.RELEASE_GPU,
                detail=f"GPU {q.index} ({q.fault}) {quarantine.RELEASE_TEXT}",
                gpu=q.index,
            )
            for q in r.quarantined_gpus
        )
        actions = (*actions, *released)
        reasons = (*reasons, f"{quarantine.describe(r.quarantined_gpus)} {quarantine.RELEASE_TEXT}")
    if r.pending is not None:  # held while the node was out: its repair was verified since
        text = (
            f"held fault {r.pending.key} let go: the node passed {trigger} since it was held"
            " (a new occurrence is decided afresh)"
        )
        actions = (*actions, Action(ActionKind.NOTIFY, detail=text))
        reasons = (*reasons, text)
    if spares.becomes_spare(rec, ctx.fleet, ctx.policy):
        rec = replace(rec, spare=True)
        pool = ctx.fleet.pool(rec.pool)
        wanted = ctx.policy.spares.wanted(pool.size)
        reasons = (*reasons, f"kept as a hot spare ({pool.spares + 1} of {wanted} in the pool)")
    return _Plan(applied=rec, held=r, actions=actions, reasons=reasons, transition=t)


def _on_spare_promoted(ctx: _Ctx, event: ev.SparePromoted) -> _Plan:
    """A spare takes the place of a node that left production: it may take work now.

    Nothing on the node is disrupted (work is allowed, not removed), but pause and
    dry-run still mean no change at all.
    """
    r = ctx.record
    if not r.is_spare:
        return _noop(ctx, f"spare promotion ignored: not a spare ({r.state})")
    if ctx.policy.paused or ctx.policy.dry_run:
        why = "paused" if ctx.policy.paused else "dry-run"
        return _noop(ctx, f"spare not promoted ({why}): {event.reason}")
    rec = replace(r, spare=False)
    return _Plan(applied=rec, held=r, reasons=(f"promoted from the spare pool: {event.reason}",))


def _on_tick(ctx: _Ctx, event: ev.Tick) -> _Plan:
    r, now, policy = ctx.record, ctx.now, ctx.policy
    inc = r.incident
    if r.state is S.PRODUCTION and r.pending is not None:
        return _retry_held(ctx, r.pending)
    if quarantine.repair_due(policy.gpu_quarantine, r, now):
        return _quarantine_repair(ctx)
    if r.state is S.DRAINING and inc is not None and inc.drained:
        return _after_drain(ctx)
    if r.state is S.REMEDIATING and inc is not None:
        if inc.current is None:
            return _start_rung(ctx, r, inc, "retry")
        entry = policy.ladder_entry(inc.current)
        started = inc.tried[-1].started_at
        if entry is not None and now - started >= entry.timeout_seconds:
            return _finish_step(
                ctx, r, inc, Outcome.TIMED_OUT, f"no result in {entry.timeout_seconds:g}s"
            )
    if r.state is S.VERIFYING and inc is not None and inc.checks_started_at is not None:
        limit = policy.checks.verification_timeout_seconds
        if now - inc.checks_started_at >= limit:
            return _checks_failed(ctx, f"verification timed out after {limit:g}s")
    if r.state is S.BURN_IN and r.checks_started_at is not None:
        limit = policy.checks.burn_in_timeout_seconds
        if now - r.checks_started_at >= limit:
            return _on_checks(
                ctx, ev.ChecksCompleted(passed=False, detail=f"timed out after {limit:g}s")
            )
    return _noop(ctx)


def _retry_held(ctx: _Ctx, fault: FaultEvent) -> _Plan:
    """Try again to act on a held fault, with the step decided when it was held.

    The occurrences that justified it may have aged out of the repeat window
    while it waited: what was decided then still stands. Only when neither the
    stored step nor the policy asks for a step any more (the policy changed)
    is it let go, and then with a Notice, not silently.
    """
    r = ctx.record
    rule = ctx.policy.rule_for(fault)
    response, why = respond(rule, fault, r, ctx.now)
    steps = [s for s in (r.pending_step, response.step) if s is not None]
    desc = f"{fault.describe()}: {fault.evidence.summary()}".rstrip(": ")
    if steps:
        step = max(steps, key=severity)
        return _take_out(
            ctx, fault, rule, step, f"retry held fault: {why} -> {step}", desc, retry=True
        )
    return _let_go(
        r, f"held fault {fault.key} let go: the policy no longer asks for a repair ({why})"
    )


def _let_go(r: NodeRecord, text: str) -> _Plan:
    """Forget the held fault, saying so (a Notice Event): never silently."""
    rec = replace(r, pending=None, pending_step=None)
    return _Plan(
        applied=rec,
        held=rec,
        actions=(Action(ActionKind.NOTIFY, detail=text),),
        reasons=(text,),
    )


def _on_registered(ctx: _Ctx, event: ev.Registered) -> _Plan:
    r = ctx.record
    if r.state is not S.PROVISIONING:
        return _noop(ctx, f"registration ignored in {r.state}")
    checks = ctx.policy.checks
    rec, t = _move(ctx, r, S.BURN_IN, Trigger.REGISTERED, event.detail or "joined the cluster")
    rec = replace(rec, checks_started_at=ctx.now)
    actions = (
        Action(ActionKind.TAINT, detail=well_known.TAINT_UNVERIFIED, taint=TaintEffect.NO_SCHEDULE),
        Action(
            ActionKind.RUN_CHECKS,
            profile=checks.burn_in_profile,
            timeout_seconds=checks.burn_in_timeout_seconds,
        ),
    )
    return _Plan(applied=rec, held=r, actions=actions, reasons=("start burn-in",), transition=t)


def _simple(
    source: frozenset[NodeState],
    target: NodeState,
    trigger: Trigger,
    actions: Callable[[_Ctx], tuple[Action, ...]] = lambda c: (),
) -> Callable[[_Ctx, Any], _Plan]:
    def handler(ctx: _Ctx, event: Any) -> _Plan:
        r = ctx.record
        text = getattr(event, "reason", "") or getattr(event, "detail", "") or str(trigger)
        if r.state not in source:
            return _noop(ctx, f"{trigger} ignored in {r.state}")
        rec, t = _move(ctx, r, target, trigger, text)
        return _Plan(applied=rec, held=r, actions=actions(ctx), reasons=(text,), transition=t)

    return handler


def _on_maintenance(ctx: _Ctx, event: ev.MaintenanceRequested) -> _Plan:
    r = ctx.record
    if r.state is S.PRODUCTION:
        inc = Incident(
            key=event.key,
            description=event.reason,
            opened_at=ctx.now,
            plan=event.step,  # a plan's reboot or reimage runs as the incident's one rung
            drain_mode=event.drain_mode or ctx.policy.drain.mode,
            command_timeout_s=event.command_timeout_s,
            whole_domain=event.whole_domain,
        )
        if event.requeue is not None:
            inc = replace(inc, requeue=event.requeue)
        rec, t = _move(
            ctx, replace(r, incident=inc), S.DRAINING, Trigger.MAINTENANCE_REQUESTED, event.reason
        )
        actions = (
            Action(ActionKind.CORDON, detail=event.reason),
            Action(
                ActionKind.DRAIN,
                detail=event.reason,
                drain_mode=inc.drain_mode,
                requeue=event.requeue,
                timeout_seconds=ctx.policy.drain.timeout_seconds,
            ),
        )
        return _Plan(
            applied=rec,
            held=r,
            actions=actions,
            reasons=(event.reason,),
            transition=t,
            isolates=True,
        )
    if r.state in (S.PROVISIONING, S.BURN_IN, S.TRIAGE):
        rec, t = _move(ctx, r, S.MAINTENANCE, Trigger.MAINTENANCE_REQUESTED, event.reason)
        return _Plan(
            applied=rec,
            held=r,
            actions=(Action(ActionKind.CORDON, detail=event.reason),),
            reasons=(event.reason,),
            transition=t,
        )
    return _noop(ctx, operator.refusal(r, event) or f"maintenance request ignored in {r.state}")


def _on_domain_emptied(ctx: _Ctx, event: ev.DomainEmptied) -> _Plan:
    """A domain-scope plan's command, once every tray of the domain is empty: the incident
    names the command from now on (the agent is asked through the gate, which reads again
    that this node carries no work), with the time it was asked. Only for the plan's own
    incident, in ``maintenance``, once."""
    r = ctx.record
    inc = r.incident
    if r.state is not S.MAINTENANCE or inc is None or inc.key != event.key:
        return _noop(ctx, f"domain emptied ignored in {r.state}")
    if not inc.whole_domain or inc.acting_since is not None:
        return _noop(ctx, "domain emptied ignored: not a domain-scope plan's, or acted on")
    acting = replace(
        inc,
        description=event.reason,
        command_timeout_s=event.command_timeout_s,
        acting_since=ctx.now,
    )
    rec = replace(r, incident=acting)
    command = maintenance.command_of(rec)
    if command is None:
        return _noop(ctx, f"domain emptied ignored: no command in {event.reason!r}")
    action = Action(ActionKind.RUN_COMMAND, detail=command, timeout_seconds=event.command_timeout_s)
    return _Plan(
        applied=rec,
        held=r,
        actions=(action,),
        reasons=(f"every tray of NVLink domain {inc.whole_domain} is empty: {event.reason}",),
        acts_on_node=True,
    )


def _verify_again(trigger: Trigger) -> Callable[[_Ctx, Any], _Plan]:
    """Verification after people are done: maintenance completed, or an operator's return.

    An operator may return a node from triage or from maintenance
    (:func:`gpufleet.domain.operator.refusal` says which states); a completed
    maintenance applies to ``maintenance`` only.
    """

    def handler(ctx: _Ctx, event: Any) -> _Plan:
        r = ctx.record
        if trigger is Trigger.MAINTENANCE_COMPLETED:
            why = None if r.state is S.MAINTENANCE else f"{trigger} ignored in {r.state}"
        else:
            why = operator.refusal(r, event)
        if why is not None:
            return _noop(ctx, why)
        inc = r.incident or Incident(
            key="operator", description=event.reason, opened_at=ctx.now, plan=None
        )
        plan = _verify(ctx, r, replace(inc, plan=inc.plan), trigger, event.reason or str(trigger))
        return replace(
            plan, actions=(Action(ActionKind.CORDON, detail=event.reason), *plan.actions)
        )

    return handler


def _on_replaced(ctx: _Ctx, event: ev.HardwareReplaced) -> _Plan:
    r = ctx.record
    if r.state is not S.RMA:
        why = operator.refusal(r, event) or f"hardware replacement ignored in {r.state}"
        return _noop(ctx, why)
    rec, t = _move(ctx, r, S.PROVISIONING, Trigger.HARDWARE_REPLACED, event.reason)
    rec = replace(rec, incident=None, occurrences=(), lemon=None, pending=None, pending_step=None)
    return _Plan(applied=rec, held=r, reasons=("new hardware starts a new history",), transition=t)


def _on_operator_triage(ctx: _Ctx, event: ev.OperatorTriage) -> _Plan:
    """Hold a node for a person.

    From production the node is drained first, exactly like a fault's isolation
    (cordon, taint, drain, then the same drain gate and disruption budget):
    the incident's plan is ``triage``, so once drained it goes to triage instead
    of the ladder. A draining node gets the same plan. A node automation is
    repairing or verifying (or one in maintenance, burn-in, provisioning) goes
    to triage at once: no step of the ladder will start on it after this.
    """
    r = ctx.record
    why = operator.refusal(r, event)
    if why is not None:
        return _noop(ctx, why)
    if r.state is S.PRODUCTION:
        p = ctx.policy
        inc = Incident(
            key="operator",
            description=event.reason,
            opened_at=ctx.now,
            plan=Step.TRIAGE,
            drain_mode=p.drain.mode,
        )
        rec, t = _move(ctx, replace(r, incident=inc), S.DRAINING, Trigger.OPERATOR, event.reason)
        actions = (
            Action(ActionKind.CORDON, detail=event.reason),
            Action(
                ActionKind.TAINT, detail=well_known.TAINT_UNHEALTHY, taint=TaintEffect.NO_SCHEDULE
            ),
            Action(
                ActionKind.DRAIN,
                detail=event.reason,
                drain_mode=inc.drain_mode,
                requeue=inc.requeue,
                timeout_seconds=p.drain.timeout_seconds,
            ),
        )
        return _Plan(
            applied=rec,
            held=r,
            actions=actions,
            reasons=(f"triage requested {event.reason}", "drain first, then triage"),
            transition=t,
            isolates=True,
        )
    if r.state is S.DRAINING and r.incident is not None:
        rec = replace(r, incident=replace(r.incident, plan=Step.TRIAGE))
        return _Plan(
            applied=rec,
            held=r,
            reasons=(f"triage requested {event.reason}", "the node goes to triage once drained"),
        )
    rec, t = _move(ctx, r, S.TRIAGE, Trigger.OPERATOR, event.reason)
    if rec.incident is not None:
        rec = replace(rec, incident=replace(rec.incident, current=None, checks_started_at=None))
    rec = replace(rec, checks_started_at=None)
    notify = (
        Action(ActionKind.CORDON, detail=event.reason),
        Action(ActionKind.NOTIFY, detail=f"held for triage {event.reason}"),
    )
    return _Plan(
        applied=rec,
        held=r,
        actions=notify,
        reasons=(f"triage requested {event.reason}",),
        transition=t,
    )


def _on_operator_rma(ctx: _Ctx, event: ev.OperatorRMA) -> _Plan:
    r = ctx.record
    why = operator.refusal(r, event)
    if why is not None:
        return _noop(ctx, why)
    rec, t = _move(ctx, r, S.RMA, Trigger.OPERATOR, event.reason)
    actions = (
        Action(ActionKind.CORDON, detail=event.reason),
        Action(ActionKind.NOTIFY, detail=f"sent to RMA {event.reason}"),
    )
    return _Plan(applied=rec, held=r, actions=actions, reasons=(event.reason,), transition=t)


def _on_dismiss(ctx: _Ctx, event: ev.OperatorDismiss) -> _Plan:
    """Drop the held fault (and the step decided for it); say so.

    Dismissing disturbs nothing on the node, so no rail holds it: it is the way
    out of a pending incident that pause, dry-run or the budget keeps waiting.
    """
    r = ctx.record
    why = operator.refusal(r, event)
    if why is not None or r.pending is None:
        return _noop(ctx, why or "nothing held")
    step = f" (step {r.pending_step})" if r.pending_step is not None else ""
    return _let_go(r, f"held fault {r.pending.key}{step} dismissed {event.reason}")


_HELD_TEXT = (
    "held with NVLink domain {domain}, judged faulty: no ladder step for this tray until "
    "the domain reports healthy (docs/decisions/0240)"
)


def _on_domain_faulted(ctx: _Ctx, event: ev.DomainFaulted) -> _Plan:
    """Take the tray out with its faulty NVLink domain and hold it: no ladder step.

    From production: cordon, taint, drain (its jobs requeued), through pause, dry-run,
    the breaker and the pool's, fleet's and group's budgets (not the domain's own). A
    tray already out (its own fabric fault, or a repair under way) keeps its state and
    drain, and its incident becomes the domain's: the step in progress may end, none
    starts after it (a Notice says so).
    """
    r = ctx.record
    desc = domain_faults.description(event.domain, event.reason)
    inc = r.incident
    if inc is not None and inc.key == domain_faults.KEY:
        return _noop(ctx, f"already out with NVLink domain {event.domain}")
    if r.state is S.PRODUCTION:
        p = ctx.policy
        new = Incident(
            key=domain_faults.KEY,
            description=desc,
            opened_at=ctx.now,
            plan=None,
            drain_mode=p.drain.mode,
        )
        rec = replace(r, incident=new, pending=None, pending_step=None)
        rec, t = _move(ctx, rec, S.DRAINING, Trigger.DOMAIN_FAULT, desc)
        actions: tuple[Action, ...] = (
            Action(ActionKind.CORDON, detail=desc),
            Action(
                ActionKind.TAINT, detail=well_known.TAINT_UNHEALTHY, taint=TaintEffect.NO_SCHEDULE
            ),
            Action(
                ActionKind.DRAIN,
                detail=desc,
                drain_mode=new.drain_mode,
                requeue=new.requeue,
                timeout_seconds=p.drain.timeout_seconds,
            ),
        )
        if r.pending is not None:
            text = f"held fault {r.pending.key} is handled with NVLink domain {event.domain}"
            actions = (*actions, Action(ActionKind.NOTIFY, detail=text))
        return _Plan(
            applied=rec,
            held=r,
            actions=actions,
            reasons=(desc,),
            transition=t,
            isolates=True,
            domain_scale=True,
        )
    if r.state in (S.DRAINING, S.REMEDIATING, S.VERIFYING) and inc is not None:
        joined = replace(inc, key=domain_faults.KEY, description=desc, plan=None)
        if r.state is S.VERIFYING:
            joined = replace(joined, checks_started_at=None)
        text = (
            f"{inc.key} on this tray is handled with NVLink domain {event.domain}, judged "
            "faulty: no ladder step for it"
        )
        rec = replace(r, incident=joined)
        notice = (Action(ActionKind.NOTIFY, detail=text),)
        return _Plan(applied=rec, held=rec, actions=notice, reasons=(desc, text))
    return _noop(ctx, f"NVLink domain {event.domain} faulty; this tray is in {r.state}")


def _on_domain_repaired(ctx: _Ctx, event: ev.DomainRepaired) -> _Plan:
    """Verify a held tray once its domain reports healthy; a failed verification walks
    the tray's own ladder from its first rung (the fault is the tray's from then on)."""
    r = ctx.record
    inc = r.incident
    if not domain_faults.held(inc):
        return _noop(ctx, f"NVLink domain {event.domain} repaired; this tray was not held")
    assert inc is not None
    text = f"NVLink domain {event.domain} repaired: {event.reason}"
    released = replace(inc, plan=ctx.policy.first_step(), description=text)
    rec = replace(r, incident=released)
    if r.state is S.REMEDIATING and inc.current is not None:
        return _Plan(applied=rec, held=r, reasons=(text, f"{inc.current} in progress ends first"))
    if r.state is S.VERIFYING:
        checks = ctx.policy.checks
        rec = replace(rec, incident=replace(released, checks_started_at=ctx.now))
        actions = (
            Action(
                ActionKind.RUN_CHECKS,
                profile=checks.verification_profile,
                timeout_seconds=checks.verification_timeout_seconds,
            ),
        )
        return _Plan(applied=rec, held=r, actions=actions, reasons=(text,))
    return _verify(ctx, rec, released, Trigger.DOMAIN_REPAIRED, text)


_HANDLERS: dict[type, Callable[[_Ctx, Any], _Plan]] = {
    ev.FaultObserved: _on_fault,
    ev.FaultCleared: _on_cleared,
    ev.DrainCompleted: _on_drained,
    ev.StepCompleted: _on_step,
    ev.WorkFound: _on_work_found,
    ev.ChecksCompleted: _on_checks,
    ev.DomainBurnInJudged: _on_domain_burn_in,
    ev.Registered: _on_registered,
    ev.InventoryMismatch: _simple(
        frozenset({S.PROVISIONING}),
        S.TRIAGE,
        Trigger.INVENTORY_MISMATCH,
        lambda c: (Action(ActionKind.NOTIFY, detail="inventory mismatch"),),
    ),
    ev.MaintenanceRequested: _on_maintenance,
    ev.DomainEmptied: _on_domain_emptied,
    ev.MaintenanceCompleted: _verify_again(Trigger.MAINTENANCE_COMPLETED),
    ev.MaintenanceFailed: _simple(
        frozenset({S.MAINTENANCE}),
        S.TRIAGE,
        Trigger.MAINTENANCE_FAILED,
        lambda c: (Action(ActionKind.NOTIFY, detail="maintenance failed"),),
    ),
    ev.OperatorReturn: _verify_again(Trigger.OPERATOR),
    ev.OperatorRMA: _on_operator_rma,
    ev.OperatorTriage: _on_operator_triage,
    ev.OperatorDismiss: _on_dismiss,
    ev.HardwareReplaced: _on_replaced,
    ev.SparePromoted: _on_spare_promoted,
    ev.DomainFaulted: _on_domain_faulted,
    ev.DomainRepaired: _on_domain_repaired,
    ev.Tick: _on_tick,
}
