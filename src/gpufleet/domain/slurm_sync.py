"""What the Slurm syncer does with one node, and which nodes it lends to Kubernetes.

The syncer sees each node twice: as Kubernetes knows it (the lifecycle label,
cordon, gpufleet problem conditions, a lend lock) and as Slurm knows it (base
state, flags, drain reason). :func:`sync_node` turns the pair into one
:class:`SyncDecision`; the syncer only carries it out. The rules, in order:

1. **Fail closed.** If either view is unknown (a lookup failed, the node is
   missing on one side, slurmctld has not heard from it since it restarted),
   nothing is drained or resumed.
2. **Own what you touch.** Only drains whose reason starts with
   ``gpufleet:`` are ours. We resume only ours (``UNDRAIN``, which leaves a
   DOWN base state alone), never anyone else's; a foreign drain or DOWN state
   is reported to Kubernetes (condition + annotation) and otherwise left alone.
3. **Kubernetes out => Slurm drained.** A node not in ``production``,
   cordoned, with a gpufleet problem condition, lent to a Kubernetes Pod, or
   kept as a hot spare is drained with reason ``gpufleet: <why>``. Where the lifecycle controller
   runs (the Node carries its record), a problem condition on a node still in
   ``production`` does not drain it by itself: the controller may be holding
   it back (disruption budget, circuit breaker, pause, dry-run), and Slurm
   follows the controller's decision, so the safety rails hold in Slurm too.
   If someone resumes a node early, the next pass drains it again. A foreign
   drain already holds the node out, so it is kept as it is (its owner's
   reason stays visible). The slurmd roll's drain (``gpufleet: slurmd upgrade``,
   :mod:`slurmd_roll`) is the exception: the operator resumes it once the node's new
   slurmd registered, so the syncer takes it over (its own reason) and the node stays
   out until Kubernetes lets it back; in service, the syncer leaves it alone.
4. **Foreign hardware drains join the repair loop.** The policy's
   ``slurm.reasons`` judge a foreign drain's reason (:mod:`slurm_reasons`):
   a hardware verdict is reported as fault ``slurm-drain`` (condition
   ``SlurmHealthProblem``, :func:`health_report`) and the lifecycle controller
   decides it like any fault. Once the controller has taken the node out, the
   syncer takes that drain over (its reason becomes ``gpufleet: ...``), so the
   node goes back to Slurm only when the controller returns it to production,
   after verification: whoever drained it. A ``job`` or ``admin`` verdict
   changes nothing: such drains are never taken over or cleared. A drain set
   by gpufleet's own node-side health check (``gpufleet: health ...``) is not
   the syncer's: it is judged like a foreign one.

Pure: no I/O, no clock. The preemption choice (:func:`choose_lendable`) is
here for the same reason: the simulator and the tests can run it without a
cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.domain import well_known
from gpufleet.domain.policy import RequeueMode
from gpufleet.domain.slurm_reasons import (
    SlurmReasons,
    Verdict,
    is_health_check_reason,
    is_roll_reason,
)
from gpufleet.domain.states import NodeState

LENT_REASON = "lent to kubernetes"
"""Drain reason text (after the prefix) of a node lent to a Kubernetes Pod."""

SPARE_REASON = "spare"
"""Drain reason text (after the prefix) of a hot spare (domain.spares): idle and
verified, out of every partition's work until promoted, when the syncer resumes it."""

MAX_REASON_LEN = 120
"""Slurm keeps reasons as free text; long ones are cut so ``sinfo -R`` stays readable."""

UNKNOWN_SLURM_STATES = frozenset({"unknown", "future", ""})
"""Base states in which Slurm does not yet know the node (slurmctld just
restarted, or the node was never registered): nothing is decided on them."""

DOWN_FLAGS = frozenset({"NOT_RESPONDING", "FAIL"})
"""Flags that, like base state ``down``, mean Slurm holds the node out by itself."""

DEFAULT_REASONS = SlurmReasons()
"""The built-in judgement of foreign drain reasons (the default policy's ``slurm``)."""


@dataclass(frozen=True, slots=True)
class KubeView:
    """The part of a Kubernetes Node the syncer decides on.

    ``state`` is None when the ``gpufleet.io/state`` label is missing or not a
    known state: then the view is unknown and the syncer does nothing.
    """

    state: NodeState | None
    cordoned: bool = False
    cordoned_by_us: bool = False
    problems: tuple[tuple[str, str], ...] = ()
    """gpufleet problem conditions with status True: (type, reason)."""
    lent: bool = False
    """The node is locked for a Kubernetes Pod (preemption)."""
    requeue: RequeueMode | None = None
    """The open incident's requeue policy, from the lifecycle record (None: no record)."""
    incident_opened_at: float | None = None
    """When the open incident opened, from the lifecycle record: binds the syncer's
    Slurm work report to that incident (domain.emptiness)."""
    managed: bool = False
    """The lifecycle controller keeps a record on this Node: its state decides."""
    spare: bool = False
    """A hot spare (label ``gpufleet.io/spare=true``): kept out of Slurm's work until
    the controller promotes it (domain.spares)."""
    domain_held: str = ""
    """The NVLink domain the node is held with (judged faulty, domain.domain_faults); ""
    for none. The drain reason names it first."""

    @property
    def known(self) -> bool:
        return self.state is not None


@dataclass(frozen=True, slots=True)
class SlurmView:
    """The part of a Slurm node the syncer decides on (REST ``/nodes`` fields)."""

    state: str
    """Base state, lowercase: idle, mixed, allocated, down, unknown, future..."""
    flags: frozenset[str] = frozenset()
    """Upper-case flags: DRAIN, NOT_RESPONDING, COMPLETING, ..."""
    reason: str | None = None
    addresses: frozenset[str] = frozenset()
    """The node's ``NodeAddr`` and ``NodeHostname`` (to find a Slurm node whose name is
    not its Kubernetes Node's; empty when not read)."""
    slurmd_started: float | None = field(default=None, compare=False)
    """When its slurmd started, as slurmctld last heard (epoch seconds; None: not read).
    The slurmd roll waits for a new one; not compared, so a restart alone is no change
    for the syncer."""

    @property
    def known(self) -> bool:
        return self.state.lower() not in UNKNOWN_SLURM_STATES

    @property
    def drained(self) -> bool:
        """DRAIN flag set (draining or drained)."""
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return self.state.lower() == "down" or bool(self.flags & DOWN_FLAGS)

    @property
    def ours(self) -> bool:
        """Drained by the syncer (a ``gpufleet: health ...`` drain set on the node is not,
        nor the slurmd roll's ``gpufleet: slurmd upgrade``)."""
        return (
            self.drained
            and well_known.is_owned_slurm_reason(self.reason)
            and not is_health_check_reason(self.reason)
            and not is_roll_reason(self.reason)
        )

    @property
    def label(self) -> str:
        """``idle+DRAIN``-style text for annotations and logs."""
        flags = "+".join(sorted(self.flags))
        return f"{self.state}+{flags}" if flags else self.state


@dataclass(frozen=True, slots=True)
class ForeignHold:
    """Slurm holds the node out for a reason gpufleet does not own."""

    state: str
    reason: str


class Verb(StrEnum):
    NOTHING = "nothing"
    DRAIN = "drain"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class SyncDecision:
    """What to do with one node. ``drain_reason`` is set exactly when ``verb`` is DRAIN."""

    verb: Verb
    why: str
    drain_reason: str | None = None
    foreign: ForeignHold | None = None
    """What to report on the Node (None: clear our report). Only meaningful
    when ``report_known`` is True."""
    report_known: bool = True
    """False when the Slurm view is unknown: leave the Node's report as it is."""


def out_reason(view: KubeView) -> str | None:
    """Why Kubernetes wants the node out of Slurm (the text after ``gpufleet:``), or None.

    Problems come first because they carry the most useful evidence for a
    person reading ``sinfo -R``.
    """
    if view.lent:
        return LENT_REASON
    counts = view.problems and not (view.managed and view.state is NodeState.PRODUCTION)
    held = f"nvlink domain {view.domain_held} faulty" if view.domain_held else ""
    if counts:
        text = ", ".join(f"{t} {r}".strip() for t, r in sorted(view.problems))
        return f"{held}: {text}" if held else text
    if held:
        return held
    if view.state is not None and view.state is not NodeState.PRODUCTION:
        return f"state {view.state.value}"
    if view.spare:
        return SPARE_REASON
    if view.cordoned:
        return "cordoned by gpufleet" if view.cordoned_by_us else "cordoned"
    return None


def owned_reason(text: str) -> str:
    """``gpufleet: <text>`` cut to :data:`MAX_REASON_LEN`."""
    return well_known.slurm_reason(text)[:MAX_REASON_LEN]


def foreign_hold(slurm: SlurmView) -> ForeignHold | None:
    """The foreign drain or DOWN state to report on the Node, if any."""
    if slurm.drained and not slurm.ours:
        return ForeignHold(slurm.label, slurm.reason or "drained without a reason")
    if slurm.down and not slurm.drained:
        return ForeignHold(slurm.label, slurm.reason or "not responding")
    if slurm.down and slurm.ours:
        # Our drain on top of a DOWN that Slurm set (e.g. not responding):
        # the DOWN is still someone else's.
        return ForeignHold(slurm.label, "down (drain reason is gpufleet's)")
    return None


def hardware_reason(slurm: SlurmView, reasons: SlurmReasons = DEFAULT_REASONS) -> str | None:
    """The reason of a foreign drain or DOWN the policy calls hardware, or None.

    Only Slurm's own words count: a bare NOT_RESPONDING flag (no reason, the
    node is only late for a ping) is never a fault; a DOWN with ``Not
    responding`` (SlurmdTimeout passed) is judged like any reason.
    """
    held = (slurm.drained and not slurm.ours) or (slurm.down and not slurm.drained)
    if not held or not slurm.reason or is_roll_reason(slurm.reason):
        return None
    if reasons.classify(slurm.reason).verdict is not Verdict.HARDWARE:
        return None
    return slurm.reason


def health_report(
    slurm: SlurmView, reported: bool, reasons: SlurmReasons = DEFAULT_REASONS
) -> str | bool | None:
    """What the ``SlurmHealthProblem`` condition should say, given what it says now.

    Returns the hardware reason to report (a new or changed report), True to
    keep the current report as it is, or None for no problem. ``reported``:
    the condition is True now. A report stays while the node is drained by
    the syncer (it took the hardware drain over) and ends when Slurm no longer
    holds the node for a hardware reason.
    """
    found = hardware_reason(slurm, reasons)
    if found is not None:
        return found
    if reported and slurm.ours:
        return True
    return None


def sync_node(
    kube: KubeView | None,
    slurm: SlurmView | None,
    reasons: SlurmReasons = DEFAULT_REASONS,
) -> SyncDecision:
    """The one decision for a node; see the module docstring for the rules."""
    if slurm is None or not slurm.known:
        return SyncDecision(Verb.NOTHING, "slurm view unknown", report_known=False)
    foreign = foreign_hold(slurm)
    if kube is None or not kube.known:
        return SyncDecision(Verb.NOTHING, "kubernetes view unknown", foreign=foreign)
    want = out_reason(kube)
    if want is not None:
        reason = owned_reason(want)
        if slurm.drained and is_roll_reason(slurm.reason):
            # The slurmd roll's drain would be resumed by the operator once the new
            # slurmd registered: ours instead keeps the node out (no resume in between).
            why = f"take over the slurmd upgrade drain: {want}"
            return SyncDecision(Verb.DRAIN, why, drain_reason=reason, foreign=foreign)
        if slurm.drained and not slurm.ours:
            if kube.managed and hardware_reason(slurm, reasons) is not None:
                why = f"take over the hardware drain {slurm.reason!r} until verified"
                return SyncDecision(Verb.DRAIN, why, drain_reason=reason, foreign=foreign)
            return SyncDecision(Verb.NOTHING, "held out by a foreign drain", foreign=foreign)
        if slurm.ours and slurm.reason == reason:
            return SyncDecision(Verb.NOTHING, "already drained by us", foreign=foreign)
        why = "update our drain reason" if slurm.ours else f"kubernetes wants it out: {want}"
        return SyncDecision(Verb.DRAIN, why, drain_reason=reason, foreign=foreign)
    if slurm.ours:
        return SyncDecision(Verb.RESUME, "back in production", foreign=foreign)
    return SyncDecision(Verb.NOTHING, "in service on both sides", foreign=foreign)


# -- jobs on a drained node ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobView:
    """A running Slurm job as far as requeue and preemption care."""

    job_id: int
    priority: int
    requeueable: bool
    nodes: frozenset[str]
    wants_notice: bool = False
    """Its comment asks for a departure notice before its node is taken
    (``gpufleet.io/notice``, :mod:`gpufleet.domain.departure`)."""


def requeue_mode(view: KubeView) -> RequeueMode:
    """How to treat running jobs on a node Kubernetes wants out.

    A lent node is always emptied at once (the Pod is waiting). Otherwise the
    open incident's policy decides; a problem condition without a record means
    a fault, so requeue now; anything else (maintenance, an admin's cordon)
    lets jobs finish, which is the least disruptive choice.
    """
    if view.lent:
        return RequeueMode.NOW
    if view.requeue is not None:
        return view.requeue
    if view.problems:
        return RequeueMode.NOW
    return RequeueMode.LET_FINISH


# -- preemption: which Slurm nodes to lend ------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node Kubernetes could borrow from Slurm."""

    name: str
    kube: KubeView
    slurm: SlurmView
    jobs: tuple[JobView, ...] = ()
    fits: bool = True
    """The Pod's node selector and GPU request fit this node."""


def lendable(c: Candidate) -> bool:
    """Healthy on both sides, in service in Slurm, and nothing on it that would be lost."""
    return (
        c.fits
        and c.kube.known
        and out_reason(c.kube) is None
        and c.slurm.known
        and not c.slurm.drained
        and not c.slurm.down
        and all(j.requeueable for j in c.jobs)
    )


def lend_cost(c: Candidate) -> tuple[int, int, int]:
    """Sort key: idle first, then the lowest highest-priority job, then fewest jobs."""
    if not c.jobs:
        return (0, 0, 0)
    return (1, max(j.priority for j in c.jobs), len(c.jobs))


def choose_lendable(candidates: Sequence[Candidate], count: int) -> tuple[str, ...]:
    """Up to ``count`` node names to lend, cheapest first (ties by name, so it is stable)."""
    if count <= 0:
        return ()
    ok = sorted((c for c in candidates if lendable(c)), key=lambda c: (lend_cost(c), c.name))
    return tuple(c.name for c in ok[:count])
