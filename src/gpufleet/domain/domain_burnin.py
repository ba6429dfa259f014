"""Burn-in of an NVLink domain as a unit: which runs, and the verdict from their results (pure).

A tray passes its own node checks alone, yet the domain it belongs to is one failure
domain: a job spans all of its trays, and a slow or corrupting NVLink port shows only
when they talk to each other. So a domain whose trays are all new or back from a
domain-wide action is burnt in together (docs/decisions/0246):

1. one all-reduce across every tray of the domain (test ``domain``): its bus
   bandwidth at the largest size against the policy's minimum, and its correctness;
2. an all-reduce over each pair of ring neighbours (trays in their sorted order,
   test ``pair:A,B``), run in :func:`pair_phases` (disjoint pairs at once).

The all-reduce across the domain says *whether* the domain is good; the pairs say
*which* tray is not. A pair is bad when its sum was wrong, it gave no result, or its
bandwidth is below ``pair_tolerance`` times the best pair's (timing noise only ever
slows a run, so the best pair is the least disturbed reference; a median would be a
slow tray's own in a domain of three). A tray is named when every pair it is in is
bad: with three trays or more each tray is in two pairs, so one bad tray spoils its
two and its neighbours keep one good pair each. A bad pair whose two trays each have a
good one names no tray (the link between them, or noise): the domain fails, held, and
nobody is named. Two trays form one pair: neither can be told from the other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.domain.nccl_tests import NcclTestsResult
from gpufleet.domain.policy import Policy
from gpufleet.domain.records import FleetView, NodeRecord

DOMAIN_TEST = "domain"
"""The name of the run across the whole domain."""


def pair_test(a: str, b: str) -> str:
    """The name of the run over trays ``a`` and ``b`` (in sorted order)."""
    x, y = sorted((a, b))
    return f"pair:{x},{y}"


def ring_pairs(trays: Sequence[str]) -> list[tuple[str, str]]:
    """Ring neighbours in sorted order: (t0,t1), (t1,t2) ... (t(n-1),t0); one pair for two
    trays, none for fewer."""
    t = sorted(set(trays))
    if len(t) < 2:
        return []
    if len(t) == 2:
        return [(t[0], t[1])]
    return [(t[i], t[(i + 1) % len(t)]) for i in range(len(t))]


def pair_phases(trays: Sequence[str]) -> list[list[tuple[str, str]]]:
    """The ring pairs in phases of disjoint pairs (each tray in at most one pair per
    phase): two phases for an even ring, three for an odd one."""
    phases: list[list[tuple[str, str]]] = []
    for pair in ring_pairs(trays):
        for phase in phases:
            if not any(set(pair) & set(p) for p in phase):
                phase.append(pair)
                break
        else:
            phases.append([pair])
    return phases


def runs(trays: Sequence[str]) -> list[list[tuple[str, list[str]]]]:
    """Every run in its phase, as (test name, trays): the whole domain alone first, then
    the pairs, disjoint ones at once (what the all-reduce program runs)."""
    t = sorted(set(trays))
    return [[(DOMAIN_TEST, t)]] + [
        [(pair_test(a, b), [a, b]) for a, b in phase] for phase in pair_phases(t)
    ]


@dataclass(frozen=True, slots=True)
class Limits:
    """What a good domain measures (``gpufleet burn-in domain --min-busbw --pair-tolerance``)."""

    min_busbw_gbps: float = 0.0
    """The all-reduce across the domain must reach this bus bandwidth (0: no minimum)."""
    pair_tolerance: float = 0.5
    """A pair slower than this fraction of the best pair is bad."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the domain burn-in found."""

    passed: bool
    reason: str
    bad: tuple[str, ...] = ()
    """Trays named bad: they go to the per-node repair path."""
    busbw_gbps: float | None = None
    """The all-reduce across the domain, at its largest size."""
    pairs: dict[str, float | None] = field(default_factory=dict)
    """Each pair's bus bandwidth (None: no result)."""

    def to_json(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "bad": list(self.bad),
            "busbwGbps": self.busbw_gbps,
            "pairs": self.pairs,
        }


def _gbps(v: float | None) -> str:
    return "no result" if v is None else f"{v:.3g} GB/s"


def _bad_pairs(
    pairs: Mapping[tuple[str, str], NcclTestsResult | None], tolerance: float
) -> dict[tuple[str, str], str]:
    """Each bad pair -> why."""
    seen = [r.peak_busbw for r in pairs.values() if r is not None and r.peak_busbw is not None]
    best = max(seen, default=0.0)
    bad: dict[tuple[str, str], str] = {}
    for pair, r in pairs.items():
        bw = None if r is None else r.peak_busbw
        if r is None or bw is None:
            bad[pair] = "no result"
        elif not r.correct:
            bad[pair] = f"wrong sums ({r.wrong} wrong, {r.out_of_bounds} out of bounds)"
        elif bw < tolerance * best:
            bad[pair] = f"{_gbps(bw)}, below {tolerance:g} of the best pair's {_gbps(best)}"
    return bad


def judge(
    domain: str,
    trays: Sequence[str],
    runs: Mapping[str, NcclTestsResult | None],
    limits: Limits,
) -> Verdict:
    """The domain's verdict from its runs (by test name; a missing run is no result)."""
    trays = sorted(set(trays))
    whole = runs.get(DOMAIN_TEST)
    pairs = {p: runs.get(pair_test(*p)) for p in ring_pairs(trays)}
    bw = None if whole is None else whole.peak_busbw
    pair_bw = {pair_test(*p): (None if r is None else r.peak_busbw) for p, r in pairs.items()}
    problems: list[str] = []
    if whole is None or bw is None:
        problems.append(f"the all-reduce across its {len(trays)} trays gave no result")
    else:
        if not whole.correct:
            problems.append(f"the all-reduce across its {len(trays)} trays summed wrong")
        if bw < limits.min_busbw_gbps:
            problems.append(
                f"the all-reduce across its {len(trays)} trays reached {_gbps(bw)}, "
                f"below the minimum {limits.min_busbw_gbps:g} GB/s"
            )
    bad_pairs = _bad_pairs(pairs, limits.pair_tolerance)
    named: list[str] = []
    if len(trays) >= 3:
        named = [t for t in trays if all(p in bad_pairs for p in pairs if t in p)]
    for t in named:
        why = "; ".join(f"{'-'.join(p)} {bad_pairs[p]}" for p in pairs if t in p)
        problems.append(f"tray {t} is bad in every pair it is in ({why})")
    unexplained = [p for p in bad_pairs if not set(p) & set(named)]
    for p in unexplained:
        problems.append(f"pair {'-'.join(p)}: {bad_pairs[p]} (no single tray explains it)")
    if not problems:
        best = [v for v in pair_bw.values() if v is not None]
        span = f"; pairs {min(best):.3g}-{max(best):.3g} GB/s" if best else ""
        reason = (
            f"NVLink domain {domain}: the all-reduce across its {len(trays)} trays reached "
            f"{_gbps(bw)}, every sum correct{span}"
        )
        return Verdict(True, reason, (), bw, pair_bw)
    reason = f"NVLink domain {domain} failed its burn-in: " + "; ".join(problems)
    return Verdict(False, reason, tuple(named), bw, pair_bw)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A verdict as kept on each tray's Node (:data:`well_known.ANNOTATION_DOMAIN_BURN_IN`)."""

    domain: str
    passed: bool
    at: float
    reason: str
    bad: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "domain": self.domain,
                "passed": self.passed,
                "at": self.at,
                "reason": self.reason,
                "bad": list(self.bad),
            },
            separators=(",", ":"),
        )


def read_recorded(text: str | None) -> Recorded | None:
    """The annotation's verdict; None when absent or not one (never acted on)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        return Recorded(
            domain=str(doc["domain"]),
            passed=doc["passed"] is True,
            at=float(doc["at"]),
            reason=str(doc.get("reason") or ""),
            bad=tuple(str(b) for b in doc.get("bad") or ()),
        )
    except (ValueError, KeyError, TypeError):
        return None


def awaits(record: NodeRecord, fleet: FleetView, policy: Policy) -> str | None:
    """The NVLink domain whose burn-in this node must pass before production, or None.

    Only when the policy asks for it (``checks.domainBurnIn.required``), the node is in a
    domain of two trays or more, and every tray of that domain is in burn-in or verifying:
    then the all-reduce across the domain takes no tray from work. A tray repaired alone
    in a domain that keeps working returns on its node checks (its peers are busy).
    """
    d = record.nvlink_domain
    if not policy.checks.domain_burn_in.required or not d:
        return None
    size = fleet.domain(d).size
    if size < 2 or fleet.domains_checking.get(d, 0) < size:
        return None
    return d
