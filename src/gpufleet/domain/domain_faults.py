"""Fabric faults judged at the scale of their NVLink domain (docs/decisions/0240).

The trays of a GB200/GB300 NVL72 rack share NVSwitch trays and one IMEX domain: when the
switch side fails, every tray sees it at about the same time, and rebooting the trays one by
one repairs nothing (and walks each up the ladder to triage). So a fabric fault is judged
with the rest of its domain:

* **domain-scale**: ``minTrays`` trays of one domain report a counted fabric fault raised
  within ``windowSeconds`` of now, or one tray reports a switch-side fault
  (``switchFaults``): the domain is faulty. Every tray of it is taken out as one
  (:data:`KEY` incident: cordoned, tainted, drained, its jobs requeued) and *held*: no ladder
  step starts on it for that fault;
* **the tray's own**: one tray reports, the others stay healthy: the tray is drained at once
  (as before) and its own ladder starts once ``windowSeconds`` passed with no other report;
* **repaired**: a held domain returns when no tray of it reports a counted fabric fault any
  more (the switch tray replaced, Fabric Manager and IMEX healthy again): every held tray is
  verified (active checks) before it takes work again, and a tray that fails verification
  walks its own ladder from then on.

The controller gathers each domain's trays (record and the fabric faults its conditions
raise now) and calls :func:`judge`; the decisions themselves stay in
:func:`gpufleet.domain.decide.decide` (``DomainFaulted``, ``DomainRepaired``), through the
same rails as every other: pause, dry-run, the breaker and the pool's, the fleet's and the
group's budgets (the domain's own budget does not hold a domain already judged faulty:
its trays are out of work either way, and it is counted).

Pure: no I/O, no clock (``now`` is an argument).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.domain.policy import DomainFaults
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.domain.states import NodeState

KEY = "nvlink-domain"
"""The incident key of a tray taken out with its NVLink domain (also its taint's value)."""

_TAKEN = frozenset(
    {NodeState.PRODUCTION, NodeState.DRAINING, NodeState.REMEDIATING, NodeState.VERIFYING}
)
"""States a faulty domain takes a tray from (provisioning, burn-in, maintenance, triage and
RMA trays serve no job and belong to their own path or to people)."""


def held(incident: Incident | None) -> bool:
    """Whether ``incident`` holds its tray for a faulty NVLink domain (no ladder step)."""
    return incident is not None and incident.key == KEY and incident.plan is None


def description(domain: str, why: str) -> str:
    """A held tray's incident description: the domain first, as the Slurm reason and the
    Events show it."""
    return f"NVLink domain {domain} faulty: {why}"


@dataclass(frozen=True, slots=True)
class Tray:
    """One node of a domain as the judgement sees it."""

    record: NodeRecord
    active: frozenset[str] = frozenset()
    """The fault keys the node's problem conditions raise now (the agent's report)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One domain judged."""

    domain: str
    faulty: bool
    reporting: tuple[str, ...]
    """Trays reporting a counted fabric fault raised within the window (or still, once the
    domain is held), by name."""
    switch: tuple[str, ...]
    """Of them, those reporting a fault of the switch side."""
    held: tuple[str, ...]
    """Trays held for the domain now."""
    take: tuple[str, ...]
    """Trays to take out with the domain (faulty, not held yet)."""
    release: tuple[str, ...]
    """Held trays to verify again (the domain reports healthy)."""
    size: int
    why: str
    """One sentence: what made the domain faulty (or repaired); "" when neither."""


def judge(domain: str, trays: Iterable[Tray], rule: DomainFaults, now: float) -> Verdict:
    """The domain's state from its trays: faulty or not, which trays to take out, which
    to release. A domain with no tray held and no report is neither (``why`` "")."""
    listed = sorted(trays, key=lambda t: t.record.name)
    counted = [t for t in listed if _counted(t, rule)]
    recent = [t for t in counted if _recent(t, rule, now)]
    switch = tuple(t.record.name for t in counted if t.active & set(rule.switch_faults))
    held_now = tuple(t.record.name for t in listed if held(t.record.incident))
    names = tuple(t.record.name for t in recent)
    if held_now:
        reporting = tuple(t.record.name for t in counted)
        faulty = bool(reporting) and rule.enabled
    else:
        reporting = names
        faulty = rule.enabled and (len(recent) >= rule.min_trays or bool(switch))
    why = ""
    if faulty:
        why = _why(domain, reporting, switch, rule, len(listed))
    elif held_now:
        why = f"no tray of NVLink domain {domain} reports a fabric fault any more"
    take = tuple(
        t.record.name
        for t in listed
        if faulty and t.record.state in _TAKEN and not held(t.record.incident)
    )
    return Verdict(
        domain=domain,
        faulty=faulty,
        reporting=reporting,
        switch=switch,
        held=held_now,
        take=take,
        release=() if faulty else held_now,
        size=len(listed),
        why=why,
    )


def _counted(tray: Tray, rule: DomainFaults) -> bool:
    return any(rule.counts(k) for k in tray.active)


def _recent(tray: Tray, rule: DomainFaults, now: float) -> bool:
    """Whether a counted fault the tray reports was raised (recorded) within the window."""
    return any(
        o.key in tray.active and rule.counts(o.key) and now - o.at < rule.window_seconds
        for o in tray.record.occurrences
    )


def _why(
    domain: str, reporting: tuple[str, ...], switch: tuple[str, ...], rule: DomainFaults, size: int
) -> str:
    if switch:
        return (
            f"a fault of the switch side on {', '.join(switch)} affects every tray of NVLink "
            f"domain {domain} ({size} trays)"
        )
    return (
        f"{len(reporting)} of {size} trays report a fabric fault within "
        f"{rule.window_seconds:g}s ({', '.join(reporting)}; at least {rule.min_trays} make "
        "it the domain's)"
    )


def waits(record: NodeRecord, rule: DomainFaults, now: float) -> float:
    """Seconds the tray's own ladder still waits for other trays of its domain to report
    (0: it may start): only for a counted fabric fault on a tray of a domain, before its
    first rung. A switch-side fault waits too: its domain's judgement takes the tray over
    (its ladder starts only if that never comes, the domain being unknown to the judge)."""
    inc = record.incident
    if inc is None or inc.tried or not record.nvlink_domain or not rule.counts(inc.key):
        return 0.0
    return max(0.0, inc.opened_at + rule.window_seconds - now)


def explain_node(rule: DomainFaults, domain: str) -> list[str]:
    """How fabric faults on a node of ``domain`` ("" none) are judged (``gpufleet policy
    explain --node``)."""
    if not domain or not rule.enabled:
        return []
    faults = ", ".join(rule.faults)
    switch = ", ".join(rule.switch_faults) or "none"
    return [
        f"NVLink domain {domain}: {rule.min_trays} trays reporting {faults} within "
        f"{rule.window_seconds:g}s, or one tray's {switch}, take the whole domain out and "
        "hold it with no ladder step until its fabric reports healthy (domainFaults)",
        f"a fabric fault on this tray alone: drained at once, its own ladder after "
        f"{rule.window_seconds:g}s",
    ]


def explain(rule: DomainFaults, key: str) -> list[str]:
    """What the rule does with a fault ``key`` (``gpufleet policy explain``); [] when it
    does not count it."""
    if not rule.counts(key):
        return []
    if key in rule.switch_faults:
        scale = "a fault of the switch side: one tray's report makes its NVLink domain faulty"
    else:
        scale = (
            f"with {rule.min_trays - 1} more tray(s) of its NVLink domain within "
            f"{rule.window_seconds:g}s it is the domain's"
        )
    return [
        f"domainFaults: {scale}; then every tray of the domain is taken out and held, no "
        "ladder step, until no tray reports a fabric fault (then each is verified)",
        f"domainFaults: a tray of a domain reporting it alone is drained at once and its own "
        f"ladder waits {rule.window_seconds:g}s for the others",
    ]
