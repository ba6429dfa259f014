"""What a Slurm drain reason set by someone else means: hardware, a job, or a person.

Slurm's own health machinery (LBNL NHC as ``HealthCheckProgram``, a failed
prolog or epilog, ``Kill task failed``, a node that stopped answering) drains
nodes with a free-text reason. gpufleet never owned those drains, but a
hardware failure seen by Slurm is the same failure the agent would report, so
the policy classifies the reason into one :class:`Verdict`:

* ``hardware``: a fault (kind ``slurm-drain``): the Slurm syncer raises the
  ``SlurmHealthProblem`` condition and the lifecycle controller handles it like
  any other fault (rule, budget, ladder, verification before return);
* ``job``: a job or user problem: nothing is done to the node;
* ``admin``: an administrative hold: never touched (and never cleared).

The patterns are part of the policy (``slurm.reasons``, first match wins;
:data:`DEFAULT_REASONS`); a reason no pattern matches is ``slurm.unmatched``,
``admin`` by default, because treating an unknown reason as a person's hold is
the choice that cannot disrupt anything.

Pure: no I/O. Patterns are Python regular expressions, searched
case-insensitively, bounded in length (a FleetPolicy editor writes them, a
reason is at most :data:`MAX_REASON_CHARS` characters when matched).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

MAX_PATTERN_CHARS = 200
"""A longer pattern is refused when the policy is loaded."""
MAX_REASON_CHARS = 512
"""Only this much of a reason is matched (Slurm reasons are short; this bounds the work)."""

HEALTH_CHECK_PREFIX = "gpufleet: health"
"""Drain reasons set on the node by ``gpufleet health check --slurm ...`` (as
HealthCheckProgram, prolog or epilog) start with this. They carry gpufleet's
prefix but are not the syncer's drains: the syncer treats them like a foreign
hardware drain (a fault report), never resumes them by itself, and takes them
over only when the lifecycle controller has taken the node out."""

ROLL_REASON = "gpufleet: slurmd upgrade"
"""The drain reason of a node whose slurmd pod the SlurmCluster operator replaces
(:mod:`gpufleet.domain.slurmd_roll`). Not the syncer's either: the syncer never
resumes it and never judges it a fault; when Kubernetes wants the node out, the
syncer takes it over (its own reason), and the roll then never resumes the node."""


class Verdict(StrEnum):
    """What a foreign drain reason means for the node."""

    HARDWARE = "hardware"
    """A fault of the node: repaired through the ladder, verified before it returns."""
    JOB = "job"
    """A job's or user's problem: nothing is done to the node."""
    ADMIN = "admin"
    """A person holds the node: never touched by gpufleet."""


class ReasonPattern(BaseModel):
    """One pattern of ``slurm.reasons``: a regular expression and its verdict."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,  # descriptions in the FleetPolicy CRD
    )

    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)
    """A regular expression searched (not anchored unless it starts with ^) case-insensitively in
    the drain reason."""
    verdict: Verdict
    """What a reason this pattern matches means: hardware (fault slurm-drain: the node is repaired
    and verified), job (a job's or user's problem: nothing is done) or admin (a person holds the
    node: never touched)."""
    note: str = ""
    """Free text for people (what the pattern catches); not used in decisions."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    def matches(self, reason: str) -> bool:
        return _compiled(self.pattern).search(reason[:MAX_REASON_CHARS]) is not None


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def _p(pattern: str, verdict: Verdict, note: str = "") -> ReasonPattern:
    return ReasonPattern(pattern=pattern, verdict=verdict, note=note)


DEFAULT_REASONS: tuple[ReasonPattern, ...] = (
    _p(r"^gpufleet: health\b", Verdict.HARDWARE, "a gpufleet health check failed"),
    _p(r"^NHC:", Verdict.HARDWARE, "LBNL Node Health Check"),
    _p(r"^Prolog error", Verdict.HARDWARE, "the prolog failed on this node"),
    _p(r"^Epilog error", Verdict.HARDWARE, "the epilog failed on this node"),
    _p(r"^Kill task failed", Verdict.HARDWARE, "processes could not be killed"),
    _p(r"^Not responding", Verdict.HARDWARE, "slurmctld lost contact with slurmd"),
    _p(r"^Node unexpectedly rebooted", Verdict.HARDWARE, "an unplanned reboot"),
    _p(r"^Low (RealMemory|TmpDisk|socket)", Verdict.HARDWARE, "missing hardware"),
    _p(r"^gres/gpu count", Verdict.HARDWARE, "fewer GPUs than configured"),
    _p(r"^batch job complete failure", Verdict.JOB, "the batch host failed a job"),
    _p(r"^(job|user)\b", Verdict.JOB, "a reason that names a job or user"),
)
"""The built-in patterns (also in the default policy's ``slurm.reasons``)."""


class SlurmReasons(BaseModel):
    """The policy's ``slurm`` section: how foreign drain reasons are judged."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,  # descriptions in the FleetPolicy CRD
    )

    reasons: tuple[ReasonPattern, ...] = Field(default=DEFAULT_REASONS, max_length=200)
    """Patterns, first match wins. A policy that gives reasons replaces the built-in list (start
    from gpufleet policy show)."""
    unmatched: Verdict = Verdict.ADMIN
    """The verdict on a reason no pattern matches: hardware, job or admin. Default admin."""

    def classify(self, reason: str | None) -> Classification:
        return classify(reason, self.reasons, self.unmatched)


@dataclass(frozen=True, slots=True)
class Classification:
    """The verdict on one reason and what decided it."""

    reason: str
    verdict: Verdict
    pattern: ReasonPattern | None
    """The first matching pattern; None when ``unmatched`` decided."""
    index: int | None = None
    """Its position in ``slurm.reasons``."""

    @property
    def source(self) -> str:
        if self.pattern is None or self.index is None:
            return "slurm.unmatched (no pattern matched)"
        return f"slurm.reasons[{self.index}] ({self.pattern.pattern!r})"


def classify(
    reason: str | None,
    patterns: tuple[ReasonPattern, ...] = DEFAULT_REASONS,
    unmatched: Verdict = Verdict.ADMIN,
) -> Classification:
    """The verdict on a foreign drain reason: the first matching pattern's, else ``unmatched``.

    An empty reason (Slurm shows ``none``) is a person's or Slurm's hold with no
    words: ``unmatched`` decides it too.
    """
    text = (reason or "").strip()
    for i, p in enumerate(patterns):
        if text and p.matches(text):
            return Classification(text, p.verdict, p, i)
    return Classification(text, unmatched, None)


NOT_RESPONDING_SUFFIX = " : Not responding"
"""What Slurm 23.02 and later append to a node's reason when slurmctld marks it down for
not answering past ``SlurmdTimeout`` (``set_node_reason``; 22.05 kept the reason as it
was). A drained node keeps both when its slurmd registers again (``ReturnToService=2``
lifts the DOWN, not the DRAIN)."""


def is_roll_reason(reason: str | None) -> bool:
    """Whether a drain reason is the slurmd roll's own (the operator's to resume).

    The roll's reason with Slurm's :data:`NOT_RESPONDING_SUFFIX` is the roll's too: the
    roll deleted the node's slurmd pod, and a new slurmd that took longer than
    ``SlurmdTimeout`` to register leaves Slurm 24.11 showing ``gpufleet: slurmd upgrade
    : Not responding``; read as someone else's, the node stayed drained for good
    (decision 0218). No other suffix counts: one Slurm adds for a failed epilog or a
    kill that failed is a hold of Slurm's own.
    """
    text = (reason or "").strip()
    return text in (ROLL_REASON, ROLL_REASON + NOT_RESPONDING_SUFFIX)


def is_health_check_reason(reason: str | None) -> bool:
    """Whether a drain reason was set by gpufleet's node-side health check."""
    return bool(reason) and str(reason).startswith(HEALTH_CHECK_PREFIX)
