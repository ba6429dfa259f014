"""Silent data corruption found by the job itself: a vote of replica groups.

A GPU that computes a wrong answer without an error (a flipped bit in an ALU,
a bad SRAM cell) logs nothing and trips no counter; the training just goes on
with wrong weights. A job of replica groups (torchft: groups that average their
gradients, so they hold the *same* weights after every step) can tell: each rank
writes a fingerprint of its weights every few steps (the telemetry contract in
:mod:`gpufleet.domain.stragglers`), and at one step every healthy rank of every
group has the same one. This module compares them (:func:`vote`), picks the step
to compare at (:func:`vote_step`), and adds a weaker, second signal: a group whose
loss or gradient norm stands out from the other groups' at the same steps
(:func:`loss_outliers`).

**The vote** at one step:

- a rank whose fingerprint differs from the strict majority of its own group's
  ranks is *named* (its group is the witness);
- across groups (each with the fingerprint of its ranks' strict majority): when
  a strict majority of the groups, at least two, agree, every rank that differs
  from them is *named*;
- when no such majority exists (two groups that disagree, a tie, all different)
  nobody is trusted: the nodes of every group that disagrees are *to be checked*
  (the node agent runs its active SDC check, whose result is the verdict).

Fingerprints are compared for equality, without a threshold: identical weights
hash alike, and a single flipped bit changes the hash.

**The second signal**: over the last ``window_steps`` steps at which at least three
groups reported, a group whose loss (or gradient norm) is more than ``factor`` robust
standard deviations (1.4826 x the median absolute deviation of the groups' values from
their per-step median) and more than ``min_deviation`` of it away from that median at
``min_steps`` of those steps (a non-finite value always) is an outlier: its nodes
are to be checked, never named (a group's batches differ, so its loss differs too;
only the check can say the GPU is wrong).
Decision 0274 says why these settings are not in the FleetPolicy.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.stragglers import StepSample

LIVE_S = 120.0
"""A rank whose newest line is this much older than the run's newest is gone (its group
departed or was replaced): :func:`vote_step` does not wait for it."""

MAD_TO_SIGMA = 1.4826
"""The median absolute deviation of normal data times this is its standard deviation."""


class Outcome(StrEnum):
    AGREE = "agree"
    """Every rank holds the same weights."""
    NAMED = "named"
    """Some ranks differ from a trusted majority: their nodes are named."""
    NO_MAJORITY = "no-majority"
    """Groups disagree and no strict majority of them agrees: check them all."""


@dataclass(frozen=True, slots=True)
class Suspect:
    """A node whose ranks' weights differ from the majority's at one step."""

    node: str
    group: str
    fingerprint: str
    """What the node's differing rank(s) hold."""
    expected: str
    """What the majority (of the groups, or of its own group) holds."""
    gpus: tuple[int, ...]
    """The local GPUs the differing ranks ran on (those the job reported)."""
    agreeing: int
    """How many witnesses hold ``expected`` (groups, or ranks of its own group)."""
    witnesses: int
    """Of how many (groups that voted, or ranks of its own group)."""
    within_group: bool
    """Named by its own group's ranks (not by the vote across groups)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The vote of one training at one step."""

    step: int
    outcome: Outcome
    groups: int
    """Groups that wrote a fingerprint at this step."""
    named: tuple[Suspect, ...] = ()
    to_check: tuple[str, ...] = ()
    """Nodes that no majority vouches for (sorted)."""

    def suspect(self, node: str) -> Suspect | None:
        """``node``'s entry among the named, if it is there."""
        return next((s for s in self.named if s.node == node), None)


@dataclass(frozen=True, slots=True)
class LossRule:
    """When a group's loss or gradient norm stands out from the other groups'."""

    factor: float = 6.0
    """Robust standard deviations (of the groups' spread) from the groups' median."""
    window_steps: int = 20
    """Newest steps (with at least three groups reporting) looked at."""
    min_steps: int = 3
    """Steps of the window at which the group must stand out (one odd batch is not enough)."""
    min_deviation: float = 0.05
    """A value within this fraction of the groups' median never stands out (groups whose
    values hardly differ have a spread near 0, which alone would flag any difference)."""


@dataclass(frozen=True, slots=True)
class Outlier:
    """A group whose loss or gradient norm stood out from the others'."""

    group: str
    nodes: tuple[str, ...]
    metric: str
    """``loss`` or ``grad_norm``."""
    steps: int
    """Steps of the window at which it stood out."""
    last_step: int
    value: float
    """Its value at the newest of those steps."""
    median: float
    """Every group's median there."""


def fingerprint(parameters: Iterable[bytes | memoryview]) -> str:
    """The contract's fingerprint of a model's weights: blake2b (8 bytes, hex) over the
    bytes of every parameter (float32, C order, in ``named_parameters()`` order)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parameters:
        h.update(p)
    return h.hexdigest()


def vote(step: int, samples: Iterable[StepSample]) -> Verdict:
    """The verdict at ``step`` from the fingerprints written then (other samples ignored)."""
    ranks: dict[tuple[str, int], StepSample] = {}
    for s in samples:
        if s.step == step and s.group is not None and s.fingerprint is not None:
            ranks[(s.group, s.rank)] = s  # a rank that wrote the step twice (redone): the last
    by_group: dict[str, list[StepSample]] = {}
    for (group, _), s in sorted(ranks.items()):
        by_group.setdefault(group, []).append(s)
    group_value = {g: _strict_majority([s.fingerprint for s in rs]) for g, rs in by_group.items()}
    voting = {g: v for g, v in group_value.items() if v is not None}
    counts = Counter(voting.values())
    top, top_n = counts.most_common(1)[0] if counts else ("", 0)
    trusted = top if top_n >= 2 and 2 * top_n > len(voting) else None
    named: list[Suspect] = []
    to_check: set[str] = set()
    for group, rs in by_group.items():
        own = group_value[group]
        if trusted is not None:
            expected, within = trusted, own == trusted
            agreeing, witnesses = (_count(rs, own), len(rs)) if within else (top_n, len(voting))
        elif own is not None:
            expected, within, agreeing, witnesses = own, True, _count(rs, own), len(rs)
            if len(counts) > 1:  # groups disagree, no majority: none of them is trusted
                to_check.update(s.node for s in rs if s.fingerprint == own)
        else:  # its own ranks disagree, and no majority of groups says which are right
            to_check.update(s.node for s in rs)
            continue
        odd = [s for s in rs if s.fingerprint != expected]
        named.extend(_suspects(odd, group, expected, agreeing, witnesses, within))
    to_check -= {s.node for s in named}
    if named:
        outcome = Outcome.NAMED
    elif to_check:
        outcome = Outcome.NO_MAJORITY
    else:
        outcome = Outcome.AGREE
    return Verdict(step, outcome, len(by_group), tuple(named), tuple(sorted(to_check)))


def vote_step(samples: Sequence[StepSample], *, live_s: float = LIVE_S) -> int | None:
    """The newest step worth a vote: at least two groups wrote a fingerprint there,
    and every live rank that had started by then has passed it and, if it wrote the
    step, wrote its fingerprint. None: no such step yet.

    A rank gone for ``live_s`` (a departed group) is not waited for; a rank that
    started later (a group that joined and copied the weights at a later step) is
    not asked for older steps.
    """
    grouped = [s for s in samples if s.group is not None]
    if not grouped:
        return None
    newest_at = max(s.at for s in grouped)
    first: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], StepSample] = {}
    at_step: dict[int, dict[tuple[str, int], StepSample]] = {}
    for s in grouped:
        key = (s.group or "", s.rank)
        first[key] = min(first.get(key, s.step), s.step)
        if key not in last or (s.step, s.at) >= (last[key].step, last[key].at):
            last[key] = s
        at_step.setdefault(s.step, {})[key] = s
    live = [k for k, s in last.items() if newest_at - s.at <= live_s]
    for step in sorted(at_step, reverse=True):
        wrote = at_step[step]
        if len({g for (g, _), s in wrote.items() if s.fingerprint is not None}) < 2:
            continue
        started = [k for k in live if first[k] <= step]
        if all(last[k].step >= step for k in started) and all(
            wrote[k].fingerprint is not None for k in started if k in wrote
        ):
            return step
    return None


def loss_outliers(samples: Iterable[StepSample], rule: LossRule) -> list[Outlier]:
    """Groups whose loss or gradient norm stands out from the other groups' (at least
    three groups at a step: with two, neither can be told from the other)."""
    nodes: dict[str, set[str]] = {}
    values: dict[str, dict[int, dict[str, list[float]]]] = {"loss": {}, "grad_norm": {}}
    for s in samples:
        if s.group is None:
            continue
        nodes.setdefault(s.group, set()).add(s.node)
        for metric, value in (("loss", s.loss), ("grad_norm", s.grad_norm)):
            if value is not None:
                values[metric].setdefault(s.step, {}).setdefault(s.group, []).append(value)
    out: list[Outlier] = []
    for metric, by_step in values.items():
        steps = [st for st in sorted(by_step) if len(by_step[st]) >= 3][-rule.window_steps :]
        per_group = {st: {g: _median(vs) for g, vs in by_step[st].items()} for st in steps}
        for group in sorted(nodes):
            found = _stands_out(group, per_group, rule)
            if len(found) >= rule.min_steps:
                last_step, value, median = found[-1]
                out.append(
                    Outlier(
                        group,
                        tuple(sorted(nodes[group])),
                        metric,
                        len(found),
                        last_step,
                        value,
                        median,
                    )
                )
    return out


def _stands_out(
    group: str, per_step: dict[int, dict[str, float]], rule: LossRule
) -> list[tuple[int, float, float]]:
    """(step, the group's value, all groups' median) at each step it stands out.

    The centre is the median of every group's value (with three groups, the middle one:
    one outlier does not move it, as it would move the median of the other two)."""
    deviations: list[float] = []
    centre: dict[int, float] = {}
    for step, vals in per_step.items():
        finite = [v for v in vals.values() if math.isfinite(v)]
        if group not in vals or len(finite) < 2:
            continue
        centre[step] = statistics.median(finite)
        deviations.extend(abs(v - centre[step]) for v in finite)
    if not deviations:
        return []
    scale = MAD_TO_SIGMA * statistics.median(deviations)
    found = []
    for step, mid in sorted(centre.items()):
        value = per_step[step][group]
        off = abs(value - mid)
        if not math.isfinite(value) or (
            off > rule.factor * scale and off > rule.min_deviation * abs(mid)
        ):
            found.append((step, value, mid))
    return found


def _strict_majority(values: Sequence[str | None]) -> str | None:
    """The value more than half of ``values`` hold, if one does."""
    if not values:
        return None
    value, n = Counter(values).most_common(1)[0]
    return value if 2 * n > len(values) else None


def _count(ranks: Sequence[StepSample], value: str | None) -> int:
    return sum(1 for s in ranks if s.fingerprint == value)


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if len(finite) == len(values) else math.nan


def _suspects(
    odd: Sequence[StepSample],
    group: str,
    expected: str,
    agreeing: int,
    witnesses: int,
    within: bool,
) -> list[Suspect]:
    """One suspect per node among the ranks ``odd``."""
    by_node: dict[str, list[StepSample]] = {}
    for s in odd:
        by_node.setdefault(s.node, []).append(s)
    return [
        Suspect(
            node,
            group,
            rs[0].fingerprint or "",
            expected,
            tuple(sorted({s.gpu for s in rs if s.gpu is not None})),
            agreeing,
            witnesses,
            within,
        )
        for node, rs in sorted(by_node.items())
    ]
