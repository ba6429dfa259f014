"""How a policy treats one fault, in words: the data behind ``gpufleet policy explain``.

Pure: it only reads the policy and the catalogues, so the answer is exactly
what :func:`gpufleet.domain.decide` will do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpufleet.domain import domain_faults, lemon, policy_groups, well_known, xids
from gpufleet.domain import gpu_quarantine as quarantine
from gpufleet.domain.faults import FAULTS, Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Budget, LadderStep, Policy, Response, Rule, Scope
from gpufleet.domain.slurm_reasons import Verdict

_FIRST_TEXT = {
    Response.IGNORE: "ignored: nothing is recorded or done",
    Response.LOG: "logged as an Event; the node stays in production",
    Response.RESTART_JOB: "the job is restarted; the node stays in production",
}


@dataclass(frozen=True, slots=True)
class Explanation:
    """Everything the policy says about one fault."""

    key: str
    title: str
    meaning: str
    subsystem: str
    condition: str
    source: str
    """Where the rule comes from: a policy rule or the XID catalogue."""
    first: str
    first_text: str
    takes_node_out: bool
    nvidia_action: str | None = None
    xid_class: str | None = None
    repeat: str | None = None
    repeat_takes_node_out: bool = False
    isolation: list[str] = field(default_factory=list)
    ladder: list[str] = field(default_factory=list)
    lemon: str = ""
    safety: list[str] = field(default_factory=list)
    note: str = ""
    gpu_quarantine: str = ""
    """Whether the fault quarantines one GPU or takes the node (domain.gpu_quarantine)."""


def explain(
    policy: Policy, *, xid: int | None = None, fault: FaultKind | None = None
) -> Explanation:
    """Explain one XID (``xid``) or one fault kind (``fault``) under ``policy``."""
    if (xid is None) == (fault is None):
        raise ValueError("explain needs exactly one of xid or fault")
    if xid is not None:
        event = FaultEvent(FaultKind.XID, "node", at=0.0, xid=xid, evidence=Evidence(gpu_index=0))
        info = xids.XIDS.get(xid)
        title = f"XID {xid}: {info.meaning}" if info else f"XID {xid}: not in the catalogue"
        meaning = (info.note or info.meaning) if info else "unknown to gpufleet's catalogue"
    else:
        assert fault is not None
        if fault is FaultKind.XID:
            raise ValueError("explain an XID with xid=<number>")
        event = FaultEvent(fault, "node", at=0.0)
        finfo = FAULTS[fault]
        title, meaning, info = f"{fault.value}", finfo.meaning, None
    rule = policy.rule_for(event)
    explicit = any(r.match.key == event.key for r in policy.rules)
    index = next((i for i, r in enumerate(policy.rules) if r.match.key == event.key), None)
    source = f"policy rule rules[{index}]" if explicit else "XID catalogue default"
    out_rule = rule.action.takes_node_out or (
        rule.repeat is not None and rule.repeat.then.takes_node_out
    )
    return Explanation(
        key=event.key,
        title=title,
        meaning=meaning,
        subsystem=event.subsystem.value,
        condition=well_known.CONDITIONS[event.subsystem],
        source=source,
        first=rule.action.value,
        first_text=_first_text(rule.action),
        takes_node_out=rule.action.takes_node_out,
        nvidia_action=info.nvidia_action.value if info else None,
        xid_class=info.xid_class.value if info else None,
        repeat=_repeat_text(rule),
        repeat_takes_node_out=rule.repeat is not None and rule.repeat.then.takes_node_out,
        isolation=[
            *_isolation(policy, rule),
            *domain_faults.explain(policy.domain_faults, event.key),
        ]
        if out_rule
        else [],
        ladder=_ladder(policy, rule) if out_rule else [],
        lemon=_lemon_text(policy, event),
        safety=_safety(policy) if out_rule else [],
        note=rule.note,
        gpu_quarantine=quarantine.explain(
            policy.gpu_quarantine,
            event.key,
            (rule.action.step, rule.repeat.then.step if rule.repeat is not None else None),
        ),
    )


def _budgets(policy: Policy, domain: str | None = None) -> list[str]:
    """Every budget that covers a node under ``policy`` (each must allow it); ``domain``:
    the node's NVLink domain ("" none; None: no node named, the rule is said)."""
    b = policy.safety.budget
    lines = [
        f"budget: at most {b.max_nodes} nodes and {b.max_percent:g}% of a pool "
        f"out at once (at least {b.min_nodes}){_fleet_budget(b)}"
    ]
    g = policy.group_budget
    if g is not None:
        lines.append(
            f"group {policy.group} budget: at most {g.max_nodes} nodes and {g.max_percent:g}% "
            f"of the group's nodes out at once (at least {g.min_nodes}), on top of the above"
        )
    d = policy.domain_budget
    if d is not None:
        k = f"at most {d.max_nodes} nodes of one NVLink domain out at once"
        fleet_k = b.per_domain.max_nodes if b.per_domain is not None else None
        if d is not b.per_domain:
            k += f" (group {policy.group}'s own k, in place of the fleet's {fleet_k})"
        if domain is None:
            lines.append(f"domain budget: {k} (domain from {d.label} or the node's own clique)")
        elif domain:
            lines.append(f"NVLink domain {domain} budget: {k}, on top of the above")
        else:
            lines.append(f"domain budget: {k}; this node is in no NVLink domain: not held by it")
    return lines


@dataclass(frozen=True, slots=True)
class NodeExplanation:
    """Which policy a node follows (``gpufleet policy explain --node``) and, for a fault,
    what it does there."""

    override: str | None
    """The override that applies (None: the fleet-wide policy)."""
    why: list[str]
    """Each override looked at, in order, and each requirement of its nodeSelector."""
    ladder: list[str]
    """The node's remediation ladder, rung by rung."""
    budgets: list[str]
    """Every disruption budget that covers the node."""
    rules: list[str]
    """The faults whose rule the override replaces or adds, with their actions."""
    fault: Explanation | None = None
    domain_faults: list[str] = field(default_factory=list)
    """How a fabric fault on the node is judged with its NVLink domain (domainFaults); []
    for a node in no domain, or with the rule off."""


def explain_node(
    policy: Policy,
    labels: Mapping[str, str],
    *,
    xid: int | None = None,
    fault: FaultKind | None = None,
    node: str = "",
) -> NodeExplanation:
    """Explain which override applies to a node with ``labels`` and why, its ladder and
    budgets, and (given ``xid`` or ``fault``) what that fault does on it."""
    found = policy_groups.policy_for(policy, labels)
    resolved = found.policy
    own: list[str] = []
    if found.index is not None:
        own = [
            f"{r.match.key}: {r.action}" + (f", repeats -> {r.repeat.then}" if r.repeat else "")
            for r in policy.overrides[found.index].rules
        ]
    ladder = [
        f"{e.step} (timeout {e.timeout_seconds:g}s, attempts {e.attempts})"
        + (f", on failure {e.on_failure}" if e.on_failure else "")
        for e in resolved.ladder
    ]
    one = None
    if xid is not None or fault is not None:
        one = explain(resolved, xid=xid, fault=fault)
        if found.override is not None and one.key in {
            r.match.key for r in policy.overrides[found.index or 0].rules
        }:
            one = replace(one, source=f"override {found.override}")
    domain = policy_groups.domain_of(policy, node, labels)
    budgets = _budgets(resolved, domain)
    judged = domain_faults.explain_node(policy.domain_faults, domain)
    return NodeExplanation(
        found.override, found.why, ladder, budgets, own, one, domain_faults=judged
    )


def _first_text(action: Response) -> str:
    if action in _FIRST_TEXT:
        return _FIRST_TEXT[action]
    if action in (Response.TRIAGE, Response.RMA):
        return f"the node is drained and handed to people ({action})"
    return f"the node is taken out and remediation starts with {action}"


def _repeat_text(rule: Rule) -> str | None:
    rep = rule.repeat
    if rep is None:
        return None
    where = "on the same GPU or port" if rep.scope is Scope.COMPONENT else "anywhere on the node"
    return f"{rep.count} occurrences {where} within {rep.window_seconds:g}s -> {rep.then}"


def _isolation(policy: Policy, rule: Rule) -> list[str]:
    drain = rule.drain or policy.drain.mode
    return [
        f"cordon (annotated {well_known.ANNOTATION_CORDONED})",
        f"taint {well_known.TAINT_UNHEALTHY}:{rule.taint}",
        f"drain: {drain} (timeout {policy.drain.timeout_seconds:g}s)",
        f"Slurm: drain '{well_known.slurm_reason('<fault>')}', jobs requeue {rule.requeue}",
    ]


def _lemon_text(policy: Policy, event: FaultEvent) -> str:
    """What this fault adds to the node's lemon score, and when the score decides."""
    lem = policy.lemon
    cls = lemon.fault_class(event)
    return (
        f"counts as {cls} ({lem.weights.of(cls):g}; application faults that take the node "
        f"out count as hardware); a score of {lem.threshold:g}, or {lem.gpu_threshold:g} on "
        f"one GPU, halving every {lem.half_life_days:g} days, sends the node to {lem.then} "
        "at its next incident"
    )


def _ladder(policy: Policy, rule: Rule) -> list[str]:
    start = rule.action.step
    if start is None and rule.repeat is not None:
        start = rule.repeat.then.step
    if start is None:
        return []
    out: list[str] = []
    for entry in policy.walk(start):
        if isinstance(entry, LadderStep):
            tries = "attempt" if entry.attempts == 1 else "attempts"
            out.append(
                f"{entry.step} (timeout {entry.timeout_seconds:g}s, {entry.attempts} {tries})"
            )
        else:
            out.append(f"{entry}" + (" (a person decides)" if entry is Step.TRIAGE else ""))
    checks = policy.checks
    if start not in (Step.TRIAGE, Step.RMA):
        out.insert(
            len(out) - 1,
            f"after each successful step: verify with '{checks.verification_profile}' checks "
            f"(timeout {checks.verification_timeout_seconds:g}s); pass -> production, "
            "fail -> next step",
        )
    return out


def _safety(policy: Policy) -> list[str]:
    s = policy.safety
    return [
        *_budgets(policy),
        f"circuit breaker: more than {s.breaker.max_nodes} nodes or {s.breaker.max_percent:g}% "
        f"faulting within {s.breaker.window_seconds:g}s stops automatic disruption "
        f"for {s.breaker.cooldown_seconds:g}s after the last",
        f"rate limit: {s.rate_limit.max_actions} disruptive actions per "
        f"{s.rate_limit.window_seconds:g}s",
        f"dryRun: {str(policy.dry_run).lower()}, paused: {str(policy.paused).lower()}",
    ]


def _fleet_budget(b: Budget) -> str:
    """The fleet-wide part of the budget line ('' when the policy sets none)."""
    limits = []
    if b.fleet_max_nodes is not None:
        limits.append(f"{b.fleet_max_nodes} nodes")
    if b.fleet_max_percent is not None:
        limits.append(f"{b.fleet_max_percent:g}%")
    return f"; in the whole fleet at most {' and '.join(limits)}" if limits else ""


@dataclass(frozen=True, slots=True)
class SlurmReasonExplanation:
    """What the policy makes of a drain reason someone else set in Slurm."""

    reason: str
    verdict: str
    source: str
    """Which pattern (or ``slurm.unmatched``) decided."""
    outcome: str
    """What gpufleet does, in words."""
    note: str = ""
    fault: Explanation | None = None
    """For a hardware verdict: how the ``slurm-drain`` fault is handled."""


_VERDICT_TEXT = {
    Verdict.HARDWARE: (
        "a hardware fault: the Slurm syncer raises {condition} on the Node; the lifecycle "
        "controller handles fault slurm-drain like any other (budget, ladder), takes the "
        "drain over once it has taken the node out, and returns the node to Slurm only "
        "after verification passes"
    ),
    Verdict.JOB: (
        "a job or user problem: nothing is done to the node; the drain stays its owner's "
        "and is reported (condition {slurm})"
    ),
    Verdict.ADMIN: (
        "an administrative hold: never touched or cleared by gpufleet; reported (condition {slurm})"
    ),
}


def explain_slurm_reason(policy: Policy, reason: str) -> SlurmReasonExplanation:
    """Explain the verdict on one foreign Slurm drain reason under ``policy``."""
    found = policy.slurm.classify(reason)
    condition = well_known.CONDITIONS[FAULTS[FaultKind.SLURM_DRAIN].subsystem]
    outcome = _VERDICT_TEXT[found.verdict].format(
        condition=condition, slurm=well_known.CONDITION_SLURM
    )
    hardware = found.verdict is Verdict.HARDWARE
    return SlurmReasonExplanation(
        reason=found.reason,
        verdict=found.verdict.value,
        source=found.source,
        outcome=outcome,
        note=found.pattern.note if found.pattern is not None else "",
        fault=explain(policy, fault=FaultKind.SLURM_DRAIN) if hardware else None,
    )
