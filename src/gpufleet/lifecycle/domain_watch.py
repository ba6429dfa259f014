"""Fabric faults judged with their NVLink domain, on every tick (docs/decisions/0240).

The judgement is :func:`gpufleet.domain.domain_faults.judge`; this collaborator only gathers
each busy domain's trays (their records and the fabric faults their problem conditions raise
now), feeds each tray the domain's decision (``DomainFaulted``, ``DomainRepaired``) through
the node pass, like any other event, and says it: one Event on the FleetPolicy per domain
decision (the trays get their own from their decisions), and ``status.domainFaults``.

Only domains with a tray the tick looks at anyway (out of service, or a held fault) are
judged: a tray that reports a counted fabric fault is taken out by that fault first, so at
rest the pass costs nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gpufleet.clock import Clock
from gpufleet.domain import conditions, domain_faults
from gpufleet.domain import events as ev
from gpufleet.domain.policy import DomainFaults
from gpufleet.domain.records import NodeRecord
from gpufleet.lifecycle import nodes
from gpufleet.lifecycle.core import log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.nodebook import NodeBook

Feed = Callable[[str, ev.Event], Awaitable[None]]


def active_faults(body: Mapping[str, Any]) -> frozenset[str]:
    """The fault keys the Node's problem conditions raise now (the agent's report)."""
    name = nodes.name_of(body)
    keys: set[str] = set()
    for cond in nodes.node_conditions(body):
        ctype = str(cond.get("type", ""))
        if conditions.subsystem_of(ctype) is None:
            continue
        found = conditions.faults_of(
            name, ctype, str(cond.get("status", "")), str(cond.get("message", ""))
        )
        keys.update(f.key for f in found)
    return frozenset(keys)


def _busy(record: NodeRecord, rule: DomainFaults) -> bool:
    """Whether the tray may make its domain faulty or hold it: held for it, or out (or
    waiting) for a counted fabric fault."""
    inc = record.incident
    if inc is not None and inc.key == domain_faults.KEY:
        return True
    keys = (inc.key if inc is not None else None, record.pending.key if record.pending else None)
    return any(k is not None and rule.counts(k) for k in keys)


class DomainWatch:
    """Judges the busy NVLink domains each tick and feeds their trays the outcome."""

    def __init__(
        self,
        *,
        fleet: Fleet,
        book: NodeBook,
        rule: Callable[[], DomainFaults],
        events: EventSink,
        policy_ref: Callable[[], Mapping[str, Any]],
        feed: Feed,
        clock: Clock,
    ) -> None:
        self.fleet = fleet
        self.book = book
        self.rule = rule
        self.events = events
        self.policy_ref = policy_ref
        """The FleetPolicy's name and uid: what a domain's Event is about."""
        self.feed = feed
        self.clock = clock
        self.verdicts: dict[str, domain_faults.Verdict] = {}
        """The domains faulty or held at the last pass (``status.domainFaults``)."""

    async def run(self) -> None:
        """One pass: judge every busy domain, take out or release its trays."""
        rule = self.rule()
        busy = {
            r.nvlink_domain
            for _name, r in self.fleet.ticking()
            if r.nvlink_domain and _busy(r, rule)
        }
        if not busy and not self.verdicts:
            return
        members: dict[str, list[domain_faults.Tray]] = {d: [] for d in busy}
        for record in list(self.fleet.records.values()):
            trays = members.get(record.nvlink_domain)
            if trays is not None:
                body = self.book.get(record.name)
                active = active_faults(body) if body is not None else frozenset()
                trays.append(domain_faults.Tray(record, active))
        now = self.clock.now()
        verdicts: dict[str, domain_faults.Verdict] = {}
        for domain, trays in sorted(members.items()):
            v = domain_faults.judge(domain, trays, rule, now)
            if v.faulty or v.held:
                verdicts[domain] = v
            await self._act(v, self.verdicts.get(domain))
        self.verdicts = verdicts

    async def _act(self, v: domain_faults.Verdict, before: domain_faults.Verdict | None) -> None:
        if v.faulty and v.take:
            said = before is not None and before.faulty
            what = f"its {v.size} trays are taken out as one, none is repaired alone"
            await self._decide(v, v.take, ev.DomainFaulted(v.domain, v.why), what, said=said)
        elif v.release:
            what = f"{len(v.release)} trays are verified before they take work"
            await self._decide(v, v.release, ev.DomainRepaired(v.domain, v.why), what)

    async def _decide(
        self,
        v: domain_faults.Verdict,
        trays: tuple[str, ...],
        event: ev.DomainFaulted | ev.DomainRepaired,
        what: str,
        *,
        said: bool = False,
    ) -> None:
        """One Event on the FleetPolicy for the domain's decision (unless ``said`` at an
        earlier pass), then the decision fed to each of ``trays``."""
        if not said:
            faulted = isinstance(event, ev.DomainFaulted)
            log.warning("nvlink-domain=%s %s: %s", v.domain, type(event).__name__, v.why)
            self.events.policy(
                self.policy_ref(),
                "Warning" if faulted else "Normal",
                type(event).__name__,
                f"NVLink domain {v.domain}: {v.why}; {what}",
            )
        for name in trays:
            await self.feed(name, event)

    def status(self) -> dict[str, dict[str, Any]]:
        """``status.domainFaults``: per domain faulty or held, its size, the trays that
        report, how many are held and why."""
        return {
            d: {
                "size": v.size,
                "faulty": v.faulty,
                "reporting": list(v.reporting),
                "held": len(v.held),
                "waiting": len(v.take),
                "reason": v.why,
            }
            for d, v in sorted(self.verdicts.items())
        }
