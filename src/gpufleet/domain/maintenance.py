"""Rolling maintenance: which nodes of a MaintenancePlan start next, and how far each got.

A MaintenancePlan rolls a change (reimage to an image version, a reboot, or
only drain-verify-return) across the nodes its selector picks. The controller
asks two things of this module, and the answers are the same whoever asks:

* :func:`node_phase`: where one node of the plan is, read from its record
  (the ``maintenance-requested`` transition that names the plan, then the way
  back to production, or a failed verification, triage or rma). Nothing about
  progress is kept in the controller, so a restarted one carries on.
* :func:`next_batch`: which nodes start now. Strict batches: nothing starts
  while a node of the plan is still in progress, so every node of a batch is
  verified before the next batch; a batch never exceeds ``max_unavailable``,
  the budget room of a node's pool, nor ``max_per_domain`` nodes of one
  failure domain (rack or leaf label). A paused, aborted or stopped plan
  (failed nodes reached ``max_failures``) starts nothing.

Each started node is then asked for through ``decide`` (:func:`request`), so
the rails (pause, dry-run, breaker, budget, rate limit) gate it as they gate
every change (docs/decisions/0110).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.domain import events as ev
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.ladder import Step
from gpufleet.domain.modes import DEFAULT_COMMAND_TIMEOUT_S as DEFAULT_COMMAND_TIMEOUT_S
from gpufleet.domain.modes import Action as Action
from gpufleet.domain.modes import Scope as Scope
from gpufleet.domain.policy import Budget, DrainMode, RequeueMode
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState, Trigger

S = NodeState

KEY_PREFIX = "maintenance:"
"""Incident key of a plan's node: ``maintenance:<plan>``."""
REASON_PREFIX = "maintenance plan "
"""Every request of a plan says ``maintenance plan <plan>: ...``: the transition that
starts a node names its plan."""
START_SLACK_S = 1.0
"""A node's start transition is looked for from this long before the time the plan
recorded for it (the decision's clock reads after the plan's)."""


STEP_OF: Mapping[Action, Step | None] = {
    Action.REIMAGE: Step.REIMAGE,
    Action.REBOOT: Step.REBOOT,
    Action.NOOP: None,
    Action.COMMAND: None,
}

COMMAND_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
"""A maintenance command's name: a file name in the agent's commands directory, never
a path (no ``/``, no leading dot)."""
RUN_PREFIX = "run "
"""A command plan's request reason ends ``: run <command>``."""
COMMAND_ANSWER_GRACE_S = 120.0
"""How long past the command's own timeout the controller waits for the agent's answer
before it counts the command as failed (the agent may be restarting)."""


DOMAIN_ACTIONS = frozenset({Action.COMMAND, Action.NOOP})
"""The actions a domain-scope plan runs: a command on every tray once all are empty, or
none (drain the domain, verify, return). A reboot or reimage of trays needs no empty
domain: a node-scope plan runs it."""


class NodePhase(StrEnum):
    """One node's place in a plan (``status.nodes[].phase``)."""

    PENDING = "Pending"
    """Not started."""
    REQUESTED = "Requested"
    """Asked for; the controller has not taken it out yet (a rail may hold it)."""
    DRAINING = "Draining"
    UPDATING = "Updating"
    """The change is being made (BMC step, or the node waits in maintenance)."""
    VERIFYING = "Verifying"
    SUCCEEDED = "Succeeded"
    """Verified and back in production."""
    FAILED = "Failed"
    """Verification failed, or the node went to triage or rma: the ladder has it."""


IN_PROGRESS = frozenset(
    {NodePhase.REQUESTED, NodePhase.DRAINING, NodePhase.UPDATING, NodePhase.VERIFYING}
)
FINISHED = frozenset({NodePhase.SUCCEEDED, NodePhase.FAILED})


class PlanPhase(StrEnum):
    """The plan as a whole (``status.phase``)."""

    SCHEDULED = "Scheduled"
    """Its start time has not come; nothing started."""
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    STOPPED = "Stopped"
    """``max_failures`` nodes failed: nothing more starts."""
    ABORTED = "Aborted"
    COMPLETED = "Completed"


@dataclass(frozen=True, slots=True)
class Rollout:
    """How fast a plan goes and when it stops (the plan's spec, as the domain needs it)."""

    max_unavailable: int = 1
    """Nodes of the plan in progress at once (a batch)."""
    max_per_domain: int = 1
    """Nodes of one failure domain in one batch."""
    max_failures: int = 1
    """The plan stops once this many nodes failed."""
    paused: bool = False
    aborted: bool = False
    start_at: float | None = None
    """No node starts before this time (seconds since the epoch): a maintenance window."""
    scope: Scope = Scope.NODE
    max_domains: int = 1
    """For scope nvlinkDomain: whole domains out at once (a batch)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node the selector picked, as the batch choice sees it."""

    name: str
    pool: str
    domain: str
    """Value of the failure-domain label ("" without one: all such nodes share a domain)."""
    state: NodeState
    phase: NodePhase
    group: str = ""
    """Its node group (the override its labels match; "" none)."""
    nvlink: str = ""
    """Its NVLink domain as the per-domain budget counts it ("" none)."""


@dataclass(frozen=True, slots=True)
class Room:
    """How many more nodes may go out, per budget that covers them (docs/decisions/0243).

    A pool not in ``pools`` has no room; a group or an NVLink domain not in ``groups`` or
    ``domains`` has no budget of its own (no limit from it); ``fleet`` None: no
    fleet-wide limit."""

    pools: Mapping[str, int]
    groups: Mapping[str, int] = field(default_factory=dict)
    domains: Mapping[str, int] = field(default_factory=dict)
    fleet: int | None = None

    def short(self, c: Candidate, taken: Counter[str], *, whole_domain: bool = False) -> str:
        """Which budget has no room for one more of ``c`` after ``taken`` ('' none); an
        NVLink domain's is not asked when the plan empties ``c``'s whole domain (its
        explicit scope is the operator's consent to exceed k there: decision 0244)."""
        if self.pools.get(c.pool, 0) - taken["pool " + c.pool] <= 0:
            return f"pool {c.pool}"
        if c.group in self.groups and self.groups[c.group] - taken["group " + c.group] <= 0:
            return f"group {c.group}"
        if (
            not whole_domain
            and c.nvlink in self.domains
            and self.domains[c.nvlink] - taken["domain " + c.nvlink] <= 0
        ):
            return f"NVLink domain {c.nvlink}"
        if self.fleet is not None and self.fleet - taken["fleet"] <= 0:
            return "the fleet"
        return ""


def _take(taken: Counter[str], c: Candidate) -> None:
    taken.update(("pool " + c.pool, "group " + c.group, "domain " + c.nvlink, "fleet"))


@dataclass(frozen=True, slots=True)
class Batch:
    """The nodes to start now, and a sentence saying why not more."""

    start: tuple[str, ...]
    why: str
    blocked: str = ""
    """Why the plan can never go on as the budgets stand (a whole NVLink domain more than
    a budget ever allows out at once); "" when it can."""
    domains: Mapping[str, str] = field(default_factory=dict)
    """For scope nvlinkDomain: each started node's NVLink domain."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Where one node is: its phase and a sentence (the record's reason)."""

    phase: NodePhase
    message: str = ""


def incident_key(plan: str) -> str:
    return KEY_PREFIX + plan


def reason(
    plan: str,
    action: Action,
    image: str | None,
    command: str | None = None,
    *,
    whole_domain: str = "",
) -> str:
    """The text of the plan's request (and of the node's transition to draining; for a
    command plan, the incident's description names the command: :func:`command_of`).
    A domain-scope plan's request names the domain and no command: the command is asked
    for only once every tray is empty (:func:`domain_moves`)."""
    if whole_domain:
        then = f" for {RUN_PREFIX}{command}" if action is Action.COMMAND and command else ""
        return f"{REASON_PREFIX}{plan}: empty NVLink domain {whole_domain}{then}"
    if action is Action.REIMAGE and image:
        what = f"reimage to {image}"
    elif action is Action.COMMAND:
        if command is None or not COMMAND_NAME.match(command):
            raise ValueError(f"a command plan needs a command name, not {command!r}")
        what = RUN_PREFIX + command
    else:
        what = str(action)
    return f"{REASON_PREFIX}{plan}: {what}"


def request(
    plan: str,
    action: Action,
    *,
    image: str | None = None,
    command: str | None = None,
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    requeue: RequeueMode = RequeueMode.LET_FINISH,
    drain_mode: DrainMode = DrainMode.EVICT,
    whole_domain: str = "",
) -> ev.MaintenanceRequested:
    """The event that takes one node of the plan out (decided like any other); with
    ``whole_domain``, one tray of a domain-scope plan: drained and held in
    ``maintenance``, nothing run yet."""
    if whole_domain and action not in DOMAIN_ACTIONS:
        raise ValueError(f"a domain-scope plan runs a command or noop, not {action}")
    return ev.MaintenanceRequested(
        reason(plan, action, image, command, whole_domain=whole_domain),
        step=STEP_OF[action],
        key=incident_key(plan),
        requeue=requeue,
        drain_mode=drain_mode,
        command_timeout_s=command_timeout_s if action is Action.COMMAND else None,
        whole_domain=whole_domain,
    )


def completion(plan: str) -> ev.MaintenanceCompleted:
    """The event that ends a ``noop`` node's stay in maintenance (verification next)."""
    return ev.MaintenanceCompleted(f"{REASON_PREFIX}{plan}: done")


def awaits_completion(record: NodeRecord, plan: str) -> bool:
    """Whether the node waits in ``maintenance`` for this plan's completion."""
    inc = record.incident
    return record.state is S.MAINTENANCE and inc is not None and inc.key == incident_key(plan)


def plan_of(record: NodeRecord) -> str | None:
    """The plan whose incident the node is in (None: no plan's)."""
    inc = record.incident
    if inc is None or not inc.key.startswith(KEY_PREFIX):
        return None
    return inc.key[len(KEY_PREFIX) :] or None


def command_of(record: NodeRecord) -> str | None:
    """The maintenance command this node's incident runs, read from the record only.

    A command plan's incident description is its request reason, ``maintenance
    plan <plan>: run <command>``; the controller asks the agent for that command and
    the agent runs only that one (:mod:`gpufleet.domain.agent_requests`), so an
    annotation edited by hand cannot make the agent run another.
    """
    plan = plan_of(record)
    inc = record.incident
    if plan is None or inc is None or not inc.maintenance:
        return None
    prefix = f"{REASON_PREFIX}{plan}: {RUN_PREFIX}"
    if not inc.description.startswith(prefix):
        return None
    name = inc.description[len(prefix) :]
    return name if COMMAND_NAME.match(name) else None


def command_answered(record: NodeRecord, passed: bool, detail: str) -> ev.Event | None:
    """The event for the agent's answer to the node's maintenance command: completed
    (verification next) or failed (the node goes to triage: a person looks at what a
    half-applied firmware or driver change left). None for a tray of a domain-scope plan
    whose command passed: it waits for the other trays, and the plan returns them
    together (:func:`domain_moves`)."""
    if passed:
        inc = record.incident
        if inc is not None and inc.whole_domain:
            return None
        return ev.MaintenanceCompleted(_command_said(record, "done", detail))
    return ev.MaintenanceFailed(_command_said(record, "failed", detail))


def _command_said(record: NodeRecord, outcome: str, detail: str) -> str:
    """``maintenance plan <plan>: <command> <outcome>: <detail>`` (bounded)."""
    plan, name = plan_of(record) or "?", command_of(record) or "?"
    return f"{REASON_PREFIX}{plan}: {name} {outcome}: {detail}"[:512]


def command_overdue(record: NodeRecord, now: float) -> ev.MaintenanceFailed | None:
    """The failure to feed when the node's command has had no answer for its timeout
    plus :data:`COMMAND_ANSWER_GRACE_S` (None: not overdue, or no command runs)."""
    if record.state is not S.MAINTENANCE or command_of(record) is None:
        return None
    inc = record.incident
    timeout_s = (inc.command_timeout_s if inc else None) or DEFAULT_COMMAND_TIMEOUT_S
    asked = inc.acting_since if inc is not None and inc.acting_since is not None else None
    waited = now - (record.since if asked is None else asked)
    if waited < timeout_s + COMMAND_ANSWER_GRACE_S:
        return None
    return ev.MaintenanceFailed(
        _command_said(
            record,
            "failed",
            f"no answer from the node's agent in {waited:.0f} s"
            f" (command timeout {timeout_s:.0f} s)",
        )
    )


def node_phase(
    record: NodeRecord | None, plan: str, stored: NodePhase, started_at: float | None
) -> Progress:
    """Where a node of ``plan`` is now.

    ``stored`` and ``started_at`` are what the plan's status says (a finished
    phase never changes again). ``record`` is the node's record (None: the Node
    is gone or has no record: it cannot be maintained, which fails it if it was
    started and leaves it pending otherwise).
    """
    if stored in FINISHED:
        return Progress(stored)
    if record is None:
        if started_at is None:
            return Progress(NodePhase.PENDING, "the Node has no gpufleet record")
        return Progress(NodePhase.FAILED, "the Node is gone")
    ours = record.incident is not None and record.incident.key == incident_key(plan)
    start = _start_index(record, plan, started_at, ours=ours)
    if start is None:
        if started_at is None:
            waits = "" if record.state is S.PRODUCTION else f"waits: the node is in {record.state}"
            return Progress(NodePhase.PENDING, waits)
        return Progress(NodePhase.REQUESTED, "asked for; not taken out yet")
    after = record.history[start + 1 :]
    for t in after:
        if t.trigger is Trigger.VERIFICATION_FAILED:
            return Progress(
                NodePhase.FAILED, f"verification failed; the ladder goes on: {t.reason}"
            )
        if t.target in (S.TRIAGE, S.RMA):
            return Progress(NodePhase.FAILED, f"{t.target}: {t.reason}")
    if record.state in (S.TRIAGE, S.RMA):
        return Progress(NodePhase.FAILED, record.reason)
    if record.state is S.PRODUCTION and after:
        return Progress(NodePhase.SUCCEEDED, record.reason)
    return Progress(_PHASE_OF.get(record.state, NodePhase.UPDATING), record.reason)


_PHASE_OF: Mapping[NodeState, NodePhase] = {
    S.DRAINING: NodePhase.DRAINING,
    S.REMEDIATING: NodePhase.UPDATING,
    S.MAINTENANCE: NodePhase.UPDATING,
    S.VERIFYING: NodePhase.VERIFYING,
}


def _start_index(
    record: NodeRecord, plan: str, started_at: float | None, *, ours: bool
) -> int | None:
    """Index in the history of the transition that took the node out for this plan.

    The latest such transition counts; one before ``started_at`` is another run of
    a plan of the same name, unless the node is still in our incident (a start
    made before the plan's status recorded it: a crash between the two).
    """
    prefix = f"{REASON_PREFIX}{plan}:"
    for i in range(len(record.history) - 1, -1, -1):
        t = record.history[i]
        if t.trigger is Trigger.MAINTENANCE_REQUESTED and t.reason.startswith(prefix):
            if ours or (started_at is not None and t.at >= started_at - START_SLACK_S):
                return i
            return None
    return None


def plan_phase(rollout: Rollout, phases: Iterable[NodePhase], *, now: float) -> PlanPhase:
    """The plan's phase from its nodes' phases (``now``: for the start time)."""
    counts = Counter(phases)
    if counts[NodePhase.FAILED] >= rollout.max_failures:
        return PlanPhase.STOPPED
    if rollout.aborted:
        return PlanPhase.ABORTED
    if all(p in FINISHED for p in counts.elements()):
        return PlanPhase.COMPLETED
    if rollout.paused:
        return PlanPhase.PAUSED
    untouched = all(p is NodePhase.PENDING for p in counts.elements())
    if rollout.start_at is not None and now < rollout.start_at and untouched:
        return PlanPhase.SCHEDULED
    return PlanPhase.PROGRESSING


def budget_room(
    budget: Budget, pool_size: int, out_of_service: int, in_maintenance: int = 0
) -> int:
    """How many more nodes of a pool may go out: the budget's allowance less the nodes
    out of service and those held in ``maintenance`` (not counted by the budget, but
    out all the same)."""
    return max(0, budget.allowed(pool_size) - out_of_service - in_maintenance)


def fleet_budget_room(
    budget: Budget, fleet_size: int, out_of_service: int, in_maintenance: int = 0
) -> int | None:
    """How many more nodes of the whole fleet may go out (None: the policy sets no
    fleet-wide limit): the fleet's allowance (decision 0174) less every pool's nodes out
    of service and in maintenance."""
    allowed = budget.fleet_allowed(fleet_size)
    if allowed is None:
        return None
    return max(0, allowed - out_of_service - in_maintenance)


def next_batch(
    rollout: Rollout,
    candidates: Sequence[Candidate],
    room: Mapping[str, int] | Room,
    *,
    now: float,
    fleet_room: int | None = None,
) -> Batch:
    """The nodes to start at ``now`` (none while a batch is in progress, none before the
    plan's start time).

    ``room`` is what every budget that covers the nodes still allows (:class:`Room`: each
    pool's :func:`budget_room`, each node group's and NVLink domain's with a budget of its
    own, the fleet's :func:`fleet_budget_room`; a plain mapping is the pools' alone, with
    ``fleet_room``): a batch never takes more of a pool, a group, a domain or the fleet
    than its budget allows, so a plan never starts a node a budget would then hold back
    from the repair ladder (docs/decisions/0243).
    Nodes are taken by name; a node not in production waits (automation or a person
    has it) and is taken once it is back.
    """
    rooms = room if isinstance(room, Room) else Room(pools=room, fleet=fleet_room)
    held = _held(rollout, candidates, now=now)
    if held is not None:
        return held
    pending = sorted((c for c in candidates if c.phase is NodePhase.PENDING), key=lambda c: c.name)
    ready = [c for c in pending if c.state is S.PRODUCTION]
    if not ready:
        return Batch((), f"waiting: {len(pending)} node(s) not in production")
    per_domain: Counter[str] = Counter()
    taken: Counter[str] = Counter()
    chosen: list[str] = []
    short: list[str] = []
    for c in ready:
        if len(chosen) >= rollout.max_unavailable:
            break
        if per_domain[c.domain] >= rollout.max_per_domain:
            continue
        full = rooms.short(c, taken)
        if full:
            short.append(full)
            continue
        chosen.append(c.name)
        _take(taken, c)
        per_domain[c.domain] += 1
    if not chosen:
        return Batch((), _no_room(short))
    return Batch(tuple(chosen), f"starting {len(chosen)} node(s)")


def _held(rollout: Rollout, candidates: Sequence[Candidate], *, now: float) -> Batch | None:
    """The empty batch of a plan that starts nothing now, whatever the budgets (None: it
    may start something): stopped, aborted, completed, paused, before its start time, or
    with a batch still in progress."""
    phases = [c.phase for c in candidates]
    stage = plan_phase(rollout, phases, now=now)
    if stage is PlanPhase.STOPPED:
        failed = sum(1 for p in phases if p is NodePhase.FAILED)
        return Batch((), f"stopped: {failed} node(s) failed (maxFailures {rollout.max_failures})")
    if stage is PlanPhase.ABORTED:
        return Batch((), "aborted: nothing more starts")
    if stage is PlanPhase.COMPLETED:
        return Batch((), "completed")
    if stage is PlanPhase.PAUSED:
        return Batch((), "paused: nothing more starts")
    if rollout.start_at is not None and now < rollout.start_at:
        return Batch((), f"waits for its start time ({rfc3339(rollout.start_at)})")
    busy = [c for c in candidates if c.phase in IN_PROGRESS]
    if busy:
        return Batch((), f"batch in progress: {len(busy)} node(s) not verified yet")
    return None


def _no_room(short: Sequence[str]) -> str:
    """Why nothing started: the budgets that had no room, most often first."""
    if not short:
        return "waiting: no budget room"
    named = [name for name, _ in Counter(short).most_common()]
    return (
        "waiting: no budget room in "
        + ", ".join(named[:3])
        + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    )


# ------------------------------------------------------ whole NVLink domains


def next_domains(
    rollout: Rollout,
    candidates: Sequence[Candidate],
    room: Room,
    *,
    now: float,
    sizes: Mapping[str, int],
    capacity: Room,
) -> Batch:
    """The trays to start at ``now`` for a domain-scope plan: every tray of up to
    ``max_domains`` whole NVLink domains (docs/decisions/0244).

    A domain starts only when every Node the topology places in it (``sizes``) is selected,
    pending and in production, and when the pool's, the fleet's and the groups' ``room``
    takes all its trays at once; its own per-domain budget does not hold it (the plan's
    scope is the operator's consent to exceed it there). ``capacity`` is what those budgets
    allow with nothing out: a domain larger than that can never start, and the batch says
    so (``blocked``) instead of waiting for ever. A selected node in no domain is never
    started by such a plan.
    """
    held = _held(rollout, candidates, now=now)
    if held is not None:
        return held
    units: dict[str, list[Candidate]] = {}
    for c in candidates:
        units.setdefault(c.nvlink, []).append(c)
    loose = len(units.pop("", []))
    taken: Counter[str] = Counter()
    chosen: dict[str, str] = {}
    short: list[str] = []
    waits: list[str] = []
    blocked = ""
    started = 0
    for domain in sorted(units):
        trays = sorted(units[domain], key=lambda c: c.name)
        if any(c.phase is not NodePhase.PENDING for c in trays):
            continue  # done (or partly: a failed tray is the ladder's)
        if started >= rollout.max_domains:
            break
        if len(trays) != sizes.get(domain, 0):
            waits.append(
                f"NVLink domain {domain}: {len(trays)} of its {sizes.get(domain, 0)} trays "
                "selected (a domain-scope plan empties whole domains)"
            )
            continue
        if any(c.state is not S.PRODUCTION for c in trays):
            waits.append(f"NVLink domain {domain}: not every tray in production")
            continue
        never = _room_for(capacity, trays, Counter())
        if never:
            blocked = blocked or (
                f"NVLink domain {domain}: its {len(trays)} trays can never be out at once "
                f"(the budget of {never} allows fewer)"
            )
            continue
        full = _room_for(room, trays, taken)
        if full:
            short.append(full)
            continue
        for c in trays:
            _take(taken, c)
            chosen[c.name] = domain
        started += 1
    if chosen:
        why = f"starting NVLink domain(s) {', '.join(sorted(set(chosen.values())))}"
        return Batch(tuple(sorted(chosen)), why, blocked, chosen)
    if blocked:
        return Batch((), f"blocked: {blocked}", blocked)
    if short:
        return Batch((), _no_room(short))
    if waits:
        return Batch((), "waiting: " + "; ".join(waits[:3]))
    if loose:
        return Batch((), f"{loose} selected node(s) in no NVLink domain: not maintained")
    return Batch((), "waiting")


def _room_for(room: Room, trays: Sequence[Candidate], taken: Counter[str]) -> str:
    """Which budget has no room for all of ``trays`` at once ('' none)."""
    mine = Counter(taken)
    for c in trays:
        full = room.short(c, mine, whole_domain=True)
        if full:
            return full
        _take(mine, c)
    return ""


@dataclass(frozen=True, slots=True)
class Tray:
    """One node of a domain-scope plan's domain, as :func:`domain_moves` sees it."""

    name: str
    record: NodeRecord
    phase: NodePhase
    answered: bool
    """The agent answered the command the record asks for, and it passed."""


def domain_moves(
    plan: str,
    action: Action,
    trays: Sequence[Tray],
    *,
    command: str | None = None,
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    stopped: bool = False,
) -> list[tuple[str, ev.Event]]:
    """What a domain-scope plan feeds the trays of one domain (``trays``: every node of the
    plan in that domain) now (pure).

    Nothing is run while a tray of the domain is not empty (on its way out, or back in
    production because the plan held it): the command is asked of the trays only once
    every one waits in ``maintenance`` (or is held by people in triage or rma); and none
    returns while a tray's command has not answered: once every tray passed (a failed one
    went to triage), all are completed together (verification next). A ``noop`` plan
    completes them together once all are empty, and so does a plan ``stopped`` (aborted,
    or ``maxFailures`` reached) before its command was asked of any tray. A move a rail
    held is fed again on the next tick.
    """
    ours = [t for t in trays if awaits_completion(t.record, plan)]
    if not ours:
        return []
    done = ev.MaintenanceCompleted(f"{REASON_PREFIX}{plan}: every tray of its domain done")
    completed: list[tuple[str, ev.Event]] = [(t.name, done) for t in ours]
    fresh = [t for t in ours if not _acting(t.record)]
    if any(t.phase is NodePhase.VERIFYING for t in trays):
        return completed  # the return began: the trays a rail held follow
    if stopped and len(fresh) == len(ours):
        return completed
    if not all(t.record.state in EMPTY for t in trays):
        return []  # a tray is not empty: nothing runs, nothing returns
    if action is Action.NOOP:
        return completed
    if fresh and not stopped:
        go = ev.DomainEmptied(
            reason(plan, Action.COMMAND, None, command),
            key=incident_key(plan),
            command_timeout_s=command_timeout_s,
        )
        return [(t.name, go) for t in fresh]
    if all(t.answered or not _acting(t.record) for t in ours):
        return completed
    return []


EMPTY = frozenset({S.MAINTENANCE, S.TRIAGE, S.RMA})
"""States in which a tray carries no work and none comes (drained, held by gpufleet or
people): a domain-scope plan's command runs only when every tray is in one."""


def _acting(record: NodeRecord) -> bool:
    inc = record.incident
    return inc is not None and inc.acting_since is not None


# ------------------------------------------------------ the Slurm reservation

RESERVATION_PREFIX = "gpufleet-maint-"
"""Slurm reservations whose name starts so are the syncer's: it creates, shrinks and
deletes them, and never touches any other reservation."""
FINAL_PHASES = frozenset({PlanPhase.COMPLETED, PlanPhase.STOPPED, PlanPhase.ABORTED})


@dataclass(frozen=True, slots=True)
class Reservation:
    """A Slurm maintenance reservation: from ``start`` (seconds since the epoch), on ``nodes``."""

    name: str
    start: float
    nodes: frozenset[str]
    accounts: frozenset[str] = frozenset()
    """The accounts it admits (``Accounts=``; a tenant's reservation, domain.tenant_nodes)."""


@dataclass(frozen=True, slots=True)
class ReservationChange:
    """One write: ``create``, ``update`` (nodes, or a start that has not come yet) or ``delete``."""

    op: str
    reservation: Reservation
    why: str
    move_start: bool = False
    """For ``update``: set the start too (it has not come yet, and the plan's moved)."""


def reservation_name(plan: str) -> str:
    return RESERVATION_PREFIX + plan


def wanted_reservation(
    plan: str,
    *,
    start_at: float | None,
    reserve: bool,
    phase: PlanPhase | None,
    nodes: Mapping[str, NodePhase],
) -> Reservation | None:
    """The reservation a plan wants now (None: none).

    A plan with a start time holds its unfinished nodes in Slurm from that time, so that
    Slurm starts no job on them that would still run when the window opens (a job whose
    time limit ends before it still runs there). Each node leaves the reservation once
    it is finished (verified, or failed and held by the ladder); the reservation goes
    when the plan is completed, stopped, aborted or deleted, or has no node left.
    """
    if start_at is None or not reserve or phase in FINAL_PHASES:
        return None
    left = frozenset(n for n, p in nodes.items() if p not in FINISHED)
    if not left:
        return None
    return Reservation(reservation_name(plan), start_at, left)


def reservation_changes(
    wanted: Iterable[Reservation], existing: Iterable[Reservation], *, now: float
) -> list[ReservationChange]:
    """The writes that make Slurm's reservations of gpufleet (``existing``, ours only)
    the ``wanted`` ones. A start that has come is never moved (Slurm keeps an active
    reservation's start); one still to come follows the plan's (to ``now`` at the
    earliest: a plan whose window was brought forward into the past starts now)."""
    have = {r.name: r for r in existing if r.name.startswith(RESERVATION_PREFIX)}
    want = {r.name: r for r in wanted}
    out: list[ReservationChange] = []
    for name, r in sorted(want.items()):
        old = have.get(name)
        if old is None:
            out.append(ReservationChange("create", r, f"{len(r.nodes)} node(s) to maintain"))
            continue
        target = max(r.start, now)
        moved = old.start > now and abs(old.start - target) >= 1.0
        if old.nodes != r.nodes or moved:
            start = target if moved else old.start
            done, added = len(old.nodes - r.nodes), len(r.nodes - old.nodes)
            said = [
                *(["the plan's start time changed"] if moved else []),
                *([f"{done} node(s) done"] if done else []),
                *([f"{added} node(s) added"] if added else []),
            ]
            out.append(
                ReservationChange(
                    "update", Reservation(name, start, r.nodes), "; ".join(said), moved
                )
            )
    for name, r in sorted(have.items()):
        if name not in want:
            out.append(ReservationChange("delete", r, "the plan is finished or gone"))
    return out
