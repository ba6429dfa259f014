"""The remediation policy as validated data.

A policy says, for every fault, what one occurrence does and what repeats
do; how the remediation ladder escalates; when a node is a lemon; and the
safety rails (disruption budget, circuit breaker, rate limit, pause,
dry-run). The same model is the ``spec`` of the ``FleetPolicy`` custom
resource and the file the simulator reads, so field names are camelCase in
YAML (``dryRun``, ``timeoutSeconds``) and snake_case in Python.

:func:`load_policy` parses YAML text and reports *every* problem with its
location (path and line), so that ``gpufleet policy validate`` can show them
all at once.
"""

from __future__ import annotations

import functools
import math
from enum import StrEnum
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpufleet.domain import nvlink5, policy_compat, xids, yamldoc
from gpufleet.domain.bounds import (
    MAX_ACTIONS,
    MAX_ATTEMPTS,
    MAX_GPUS_PER_NODE,
    MAX_HALF_LIFE_DAYS,
    MAX_NODES,
    MAX_REPEAT_COUNT,
    MAX_SCORE,
    MAX_SLOWER_THAN,
    MAX_TIMEOUT_SECONDS,
    MAX_WINDOW_SECONDS,
    MAX_WINDOW_STEPS,
)
from gpufleet.domain.faults import FaultEvent, FaultKind, fault_key
from gpufleet.domain.ladder import NODE_ACTIONS, TERMINAL, Step
from gpufleet.domain.lemon import LemonWeights
from gpufleet.domain.modes import DrainMode as DrainMode
from gpufleet.domain.modes import RequeueMode as RequeueMode
from gpufleet.domain.selectors import LabelSelector
from gpufleet.domain.slurm_reasons import SlurmReasons
from gpufleet.domain.stragglers import StragglerRule


class Response(StrEnum):
    """What a rule does: record only, restart the job, or a ladder step."""

    IGNORE = "ignore"
    LOG = "log"
    RESTART_JOB = "restart-job"
    GPU_RESET = "gpu-reset"
    REBOOT = "reboot"
    POWER_CYCLE = "power-cycle"
    REIMAGE = "reimage"
    TRIAGE = "triage"
    RMA = "rma"

    @property
    def step(self) -> Step | None:
        """The ladder step this response starts, or None if the node stays in."""
        if self in (Response.IGNORE, Response.LOG, Response.RESTART_JOB):
            return None
        return Step(self.value)

    @property
    def takes_node_out(self) -> bool:
        """Whether this response isolates the node."""
        return self.step is not None


class Scope(StrEnum):
    """What repeats are counted on."""

    COMPONENT = "component"
    """The same GPU (or HCA port) — e.g. XID 13 three times on GPU 3."""
    NODE = "node"
    """Anywhere on the node."""


class TaintEffect(StrEnum):
    """Kubernetes taint effect for the fault taint."""

    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class SlurmWait(StrEnum):
    """Which nodes Slurm must confirm empty before they are disrupted (``drain.slurm``)."""

    AUTO = "auto"
    """Nodes marked as Slurm's (operator label, syncer taint or report)."""
    ALWAYS = "always"
    """Every node."""
    NEVER = "never"
    """No node: Kubernetes pods alone decide (fleets without Slurm)."""


class SlurmSilence(StrEnum):
    """What a drain does when Slurm says nothing about a Slurm node (a rule's ``ifSlurmSilent``)."""

    WAIT = "wait"
    """Keep waiting (fail closed): nothing is rebooted without Slurm's word."""
    PROCEED = "proceed"
    """After ``drain.slurmSilentSeconds`` of silence, go on as if Slurm were empty."""


class _Model(BaseModel):
    # Every number finite (``.inf``/``.nan`` are refused) and bounded (domain.bounds).
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        allow_inf_nan=False,
        # A field's docstring is its description in the FleetPolicy CRD (kubectl explain).
        use_attribute_docstrings=True,
    )


class Match(_Model):
    """Which faults a rule applies to: a fault kind, or an XID number."""

    fault: FaultKind | None = None
    """A fault kind, e.g. ecc-uncorrectable or ib-port-down (every name: docs/faults.md); XIDs are
    matched with xid instead."""
    xid: int | None = Field(default=None, gt=0, le=xids.MAX_XID)
    """An XID number (1 to 65535). Any positive XID is accepted: NVIDIA adds XIDs with new drivers,
    and a policy may name one before gpufleet's catalogue does (gpufleet policy validate warns
    about it)."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.fault is None) == (self.xid is None):
            raise ValueError("give exactly one of 'fault' or 'xid'")
        if self.fault is FaultKind.XID:
            raise ValueError("match XIDs with 'xid: <number>', not 'fault: xid'")
        return self

    @property
    def key(self) -> str:
        """The fault key this rule matches (``xid-79``, ``ib-port-down``)."""
        if self.xid is not None:
            return fault_key(FaultKind.XID, self.xid)
        assert self.fault is not None
        return self.fault.value


class Repeat(_Model):
    """Escalate when a fault repeats: ``count`` times within ``window_seconds``."""

    count: int = Field(ge=2, le=MAX_REPEAT_COUNT)
    """Occurrences (at least 2) within windowSeconds, counted on the scope, that make the rule
    escalate to then."""
    window_seconds: float = Field(gt=0, le=MAX_WINDOW_SECONDS)
    """The window, in seconds, over which occurrences are counted; older ones no longer count."""
    scope: Scope = Scope.COMPONENT
    """What repeats are counted on: component (the same GPU or HCA port, e.g. XID 13 three times on
    GPU 3; default) or node (anywhere on the node)."""
    then: Response
    """What the repeat does instead of action; it must be stronger than action (e.g. log, then
    reboot)."""


class Rule(_Model):
    """What one fault does to a node."""

    match: Match
    """Which faults this rule applies to: exactly one of fault (a fault kind) or xid (a number)."""
    action: Response
    """What one occurrence does: ignore or log (the node stays in), restart-job, or a ladder step
    (gpu-reset, reboot, power-cycle, reimage) or hand-off (triage, rma) that takes the node out."""
    repeat: Repeat | None = None
    """Escalation on repeats: count occurrences within windowSeconds do then (stronger than action)
    instead. Absent: every occurrence does action."""
    taint: TaintEffect = TaintEffect.NO_SCHEDULE
    """The effect of the fault taint put on the Node when it is taken out: NoSchedule (running pods
    stay until drained) or NoExecute (pods without a toleration leave at once)."""
    drain: DrainMode | None = None
    """How workloads leave the node for this fault (wait, evict, delete-after-timeout). Absent: the
    policy-wide drain.mode."""
    requeue: RequeueMode = RequeueMode.NOW
    """What happens to the Slurm jobs on the node: now (requeued at once, they resume elsewhere
    from their last checkpoint) or let-finish (drained in Slurm, running jobs finish first)."""
    if_slurm_silent: SlurmSilence = SlurmSilence.WAIT
    """While Slurm says nothing about a draining Slurm node: wait (default, fail closed: nothing is
    disrupted without Slurm's word) or proceed after drain.slurmSilentSeconds."""
    note: str = ""
    """Free text for people (why the rule is there); not used in decisions."""

    @model_validator(mode="after")
    def _repeat_escalates(self) -> Self:
        if self.repeat is not None and _rank(self.repeat.then) <= _rank(self.action):
            raise ValueError(
                f"repeat.then ({self.repeat.then}) must be stronger than action ({self.action})"
            )
        return self


def _rank(response: Response) -> int:
    return list(Response).index(response)


class LadderStep(_Model):
    """One rung: how long it may take, how often to try, where to go on failure."""

    step: Step
    """The rung: gpu-reset, reboot, power-cycle, reimage, or a hand-off to people (triage, rma)."""
    timeout_seconds: float = Field(default=900, gt=0, le=MAX_TIMEOUT_SECONDS)
    """Seconds one attempt of this rung may take before it counts as failed. Default 900."""
    attempts: int = Field(default=1, ge=1, le=MAX_ATTEMPTS)
    """Attempts of this rung before the ladder moves on. Default 1."""
    on_failure: Step | None = None
    """The rung to go to when every attempt failed. Absent: the next entry of the ladder."""


class Lemon(_Model):
    """When a node is a lemon: its decayed, class-weighted score (domain.lemon).

    Every fault that takes a node out of production, or restarts or is logged
    while it serves, adds its class's weight to the node's score (and to its
    GPU's, for a GPU fault); the score halves every ``half_life_days``. When a
    new incident finds the node's score at ``threshold`` (or one GPU's at
    ``gpu_threshold``), the node goes to ``then`` instead of another repair cycle.
    """

    threshold: float = Field(default=2.5, gt=0, le=MAX_SCORE)
    """A node whose decayed score is at least this when a new incident opens is a lemon (three
    hardware faults of weight 1 close together reach the default). Default 2.5."""
    gpu_threshold: float = Field(default=2.0, gt=0, le=MAX_SCORE)
    """The same for one GPU's own score (GPU faults only). Default 2.0."""
    half_life_days: float = Field(default=14, gt=0, le=MAX_HALF_LIFE_DAYS)
    """Days after which a fault's weight in the score has halved. Default 14."""
    weights: LemonWeights = LemonWeights()
    """How much one fault of each class adds to a node's score."""
    then: Response = Response.TRIAGE
    """Where a lemon goes instead of another repair cycle. Default triage."""

    @property
    def half_life_seconds(self) -> float:
        """The half-life in seconds."""
        return self.half_life_days * 86400.0


class Spares(_Model):
    """Hot spares: verified nodes of each pool kept out of training work (domain.spares).

    A pool of ``size`` nodes keeps ``floor(size * percent / 100)`` spares, at least
    ``min_nodes`` and at most ``max_nodes`` (and never the whole pool). A node becomes
    a spare when it enters production (burn-in or verification passed) while its
    pool is short of spares; a spare is promoted as soon as a node of its pool
    leaves production.
    """

    percent: float = Field(default=1.0, ge=0, le=100)
    """Percentage of each pool's nodes kept as spares (rounded down). Default 1."""
    min_nodes: int = Field(default=0, ge=0, le=MAX_NODES)
    """At least this many spares per pool (never the whole pool). Default 0."""
    max_nodes: int = Field(default=50, ge=0, le=MAX_NODES)
    """At most this many spares per pool. Default 50."""

    def wanted(self, pool_size: int) -> int:
        """Spares a pool of ``pool_size`` nodes keeps."""
        by_percent = math.floor(pool_size * self.percent / 100.0 + 1e-9)
        return max(0, min(self.max_nodes, max(self.min_nodes, by_percent), pool_size - 1))


class GpuQuarantine(_Model):
    """One bad GPU, not eight (domain.gpu_quarantine, docs/decisions/0233): a fault that
    allows it (docs/faults.md, "GPU quarantine") takes its GPU out of service and leaves
    the node serving work that fits on the others, until the repair needs the node empty.

    Off by default: turning it on changes what a fault does, so an upgrade changes nothing
    until an operator asks for it.
    """

    enabled: bool = False
    """Quarantine the GPU instead of taking the node, for the faults that allow it. Default
    false (the node is taken, as without this field)."""
    max_gpus_per_node: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE)
    """At most this many GPUs of one node quarantined at once; one more fault that would
    quarantine another takes the node. Default 1."""
    repair_after_seconds: float = Field(default=86400, ge=0, le=MAX_WINDOW_SECONDS)
    """Seconds a node keeps serving with a quarantined GPU before it is taken out for the repair
    (the GPU reset that applies the row remap): then it drains letting its jobs finish, through
    the disruption budget. 0: at once. Default 86400 (a day)."""


class Provisioning(_Model):
    """The Day-0 boot watchdog (domain.boot_watch): when a boot has stalled, how often to retry.

    A boot stage (power-on -> iPXE request -> user-data -> Node Ready) that does not
    advance within ``stall_seconds`` is retried by a power cycle with a network boot,
    up to ``boot_attempts`` power-ons in all; then the Machine's boot has failed.
    """

    stall_seconds: float = Field(default=900, ge=5, le=MAX_TIMEOUT_SECONDS)
    """Seconds a boot stage (power-on, iPXE request, user-data, Node Ready) may take before the
    boot counts as stalled and is retried by a power cycle with a network boot. Default 900."""
    boot_attempts: int = Field(default=3, ge=1, le=10)
    """Power-ons in all, the first included, before the Machine's boot has failed. Default 3."""


class DomainBudget(_Model):
    """The most nodes of one failure domain (an NVLink domain: the trays of one NVL72
    rack) that automation may hold out at once, on top of the pool's, the fleet's and
    the node group's budgets (docs/decisions/0232)."""

    max_nodes: int = Field(default=1, ge=0, le=MAX_NODES)
    """At most this many nodes of one NVLink domain out of service at once; 0 stops
    automatic disruption of every node that has a domain. Default 1."""
    label: str = Field(
        default="network.topology.nvidia.com/accelerator",
        min_length=1,
        max_length=317,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    )
    """The Node label an operator or Topograph names a node's NVLink domain with; the
    clique the node's own GPUs registered with (the agent's label) wins over it, as in
    the Slurm topology (domain.topology). Default: Topograph's key."""

    def allows(self, out_of_service: int) -> bool:
        """Whether one more node of a domain with ``out_of_service`` nodes out may go."""
        return out_of_service + 1 <= self.max_nodes


FABRIC_FAULTS: frozenset[FaultKind] = frozenset(
    {
        FaultKind.NVSWITCH_FATAL,
        FaultKind.NVSWITCH_NONFATAL,
        FaultKind.FABRIC_NOT_READY,
        FaultKind.FABRIC_DEGRADED,
        FaultKind.IMEX_NOT_READY,
    }
)
"""The faults of the NVLink fabric (NVSwitch, Fabric Manager registration, IMEX): the only
ones a domain-scale judgement may name."""


class DomainFaults(_Model):
    """Fabric faults judged at the scale of their NVLink domain (docs/decisions/0240): when
    enough trays of one domain report one at once, or one tray reports a fault of the switch
    side, the domain is taken out as one (its jobs requeued, no tray walked up the ladder)
    and held until the fabric reports healthy on every tray; a fault on one tray alone
    keeps the per-node path, once the window has passed with no other tray reporting."""

    min_trays: int = Field(default=2, ge=0, le=MAX_NODES)
    """Trays of one NVLink domain that must report a fabric fault (one of ``faults``, raised
    within ``windowSeconds``) for the domain to be judged faulty; 0 turns domain-scale
    judgement off (every fabric fault is the tray's own). Default 2."""
    window_seconds: float = Field(default=120, gt=0, le=MAX_WINDOW_SECONDS)
    """How long a tray's fabric fault waits for other trays of its domain before its own
    repair starts (it is drained at once either way), and how close together the reports
    must be. Default 120."""
    faults: tuple[FaultKind, ...] = (
        FaultKind.NVSWITCH_FATAL,
        FaultKind.FABRIC_NOT_READY,
        FaultKind.FABRIC_DEGRADED,
        FaultKind.IMEX_NOT_READY,
    )
    """The fabric faults counted (nvswitch-fatal, nvswitch-nonfatal, fabric-not-ready,
    fabric-degraded, imex-not-ready). Default all but nvswitch-nonfatal, which only logs."""
    switch_faults: tuple[FaultKind, ...] = (FaultKind.NVSWITCH_FATAL,)
    """Faults of the switch side, judged at the domain's scale on one tray's report (the
    NVSwitches of a multi-node NVLink domain serve every tray; none belongs to one).
    Default nvswitch-fatal."""

    @field_validator("faults", "switch_faults")
    @classmethod
    def _fabric_only(cls, value: tuple[FaultKind, ...]) -> tuple[FaultKind, ...]:
        other = sorted(str(k) for k in value if k not in FABRIC_FAULTS)
        if other:
            raise ValueError(
                f"{', '.join(other)} is not a fault of the NVLink fabric (one of "
                f"{', '.join(sorted(FABRIC_FAULTS))})"
            )
        return tuple(dict.fromkeys(value))

    @property
    def enabled(self) -> bool:
        """Whether fabric faults are judged at their domain's scale at all."""
        return self.min_trays > 0 and bool(self.faults or self.switch_faults)

    def counts(self, key: str) -> bool:
        """Whether a fault with ``key`` is one this judgement looks at."""
        return self.enabled and (key in self.faults or key in self.switch_faults)


class Budget(_Model):
    """The most nodes of one pool that automation may hold out at once, and (optional)
    of the whole fleet, every pool together."""

    max_nodes: int = Field(default=50, ge=0, le=MAX_NODES)
    """At most this many nodes of one pool out of service (taken out by automation) at once.
    Default 50."""
    max_percent: float = Field(default=10.0, ge=0, le=100)
    """At most this percentage of a pool out of service at once (rounded down; raised to minNodes).
    Default 10."""
    min_nodes: int = Field(default=1, ge=0, le=MAX_NODES)
    """Small pools (and a small fleet, for fleetMaxPercent) may still have this many nodes out,
    unless maxNodes is lower. Default 1."""
    fleet_max_nodes: int | None = Field(default=None, ge=0, le=MAX_NODES)
    """At most this many nodes out at once in the whole fleet, every pool together; 0 stops all
    automatic disruption. Absent: no fleet-wide limit."""
    fleet_max_percent: float | None = Field(default=None, ge=0, le=100)
    """At most this percentage of the whole fleet out at once (raised to minNodes). Absent: no
    fleet-wide limit."""
    per_domain: DomainBudget | None = None
    """At most maxNodes nodes of one NVLink domain out at once (every pool, every group);
    a node with no known domain is held by no domain budget. Absent: no domain limit."""

    def allowed(self, pool_size: int) -> int:
        """Nodes that may be out of service in a pool of ``pool_size``."""
        by_percent = math.floor(pool_size * self.max_percent / 100.0)
        return min(self.max_nodes, max(self.min_nodes, by_percent), pool_size)

    @property
    def fleet_limited(self) -> bool:
        """Whether a fleet-wide limit is set (``fleetMaxNodes`` or ``fleetMaxPercent``)."""
        return self.fleet_max_nodes is not None or self.fleet_max_percent is not None

    def fleet_allowed(self, fleet_size: int) -> int | None:
        """Nodes that may be out of service in the whole fleet (None: no fleet-wide limit).

        The same rule as a pool's: the percentage is raised to ``minNodes``, then the
        lower of both limits holds (a fleet of 40 nodes with ``fleetMaxPercent: 1``
        may still repair ``minNodes`` at once; ``fleetMaxNodes: 0`` stops everything).
        """
        if not self.fleet_limited:
            return None
        limits = [fleet_size]
        if self.fleet_max_nodes is not None:
            limits.append(self.fleet_max_nodes)
        if self.fleet_max_percent is not None:
            by_percent = math.floor(fleet_size * self.fleet_max_percent / 100.0)
            limits.append(max(self.min_nodes, by_percent))
        return min(limits)


class Breaker(_Model):
    """Stop automatic disruption when too many nodes fault within a window."""

    max_nodes: int = Field(default=20, ge=1, le=MAX_NODES)
    """The breaker opens (all automatic disruption stops) when more distinct nodes than this fault
    within windowSeconds. Default 20."""
    max_percent: float = Field(default=10.0, gt=0, le=100)
    """The same as a percentage of the fleet; the lower of maxNodes and this (raised to minNodes)
    holds. Default 10."""
    min_nodes: int = Field(default=2, ge=1, le=MAX_NODES)
    """Small fleets always tolerate this many faulting nodes per window. Default 2."""
    window_seconds: float = Field(default=600, gt=0, le=MAX_WINDOW_SECONDS)
    """Seconds over which distinct faulting nodes are counted. Default 600."""
    cooldown_seconds: float = Field(default=1800, ge=0, le=MAX_WINDOW_SECONDS)
    """An open breaker closes by itself after this many seconds without a new faulting node
    (gpufleet breaker reset closes it at once). Default 1800."""

    def threshold(self, fleet_size: int) -> int:
        """Distinct faulting nodes in the window that are still tolerated."""
        by_percent = math.floor(fleet_size * self.max_percent / 100.0)
        return max(self.min_nodes, min(self.max_nodes, by_percent))


class RateLimit(_Model):
    """At most ``max_actions`` disruptive actions fleet-wide per window."""

    max_actions: int = Field(default=30, ge=1, le=MAX_ACTIONS)
    """At most this many disruptive actions (reset, reboot, power cycle, reimage) fleet-wide per
    window. Default 30."""
    window_seconds: float = Field(default=600, gt=0, le=MAX_WINDOW_SECONDS)
    """The rate limit's window in seconds. Default 600."""


class Safety(_Model):
    """The safety rails."""

    budget: Budget = Budget()
    """The disruption budget: how many nodes automation may hold out at once, per pool and fleet-
    wide."""
    breaker: Breaker = Breaker()
    """The circuit breaker: stops automatic disruption when too many nodes fault at once (a
    monitoring bug must not drain the fleet)."""
    rate_limit: RateLimit = RateLimit()
    """At most maxActions disruptive actions fleet-wide per windowSeconds."""


class Drain(_Model):
    """Default drain behaviour."""

    mode: DrainMode = DrainMode.EVICT
    """How workloads leave: wait (only interruptible pods are evicted), evict (Eviction API,
    PodDisruptionBudgets respected; default) or delete-after-timeout (evict, then delete what is
    left after timeoutSeconds)."""
    timeout_seconds: float = Field(default=600, gt=0, le=MAX_TIMEOUT_SECONDS)
    """Seconds a drain may take; with mode delete-after-timeout the pods still there are then
    deleted. Default 600."""
    slurm: SlurmWait = SlurmWait.AUTO
    """Which nodes Slurm must confirm empty (drained, no job) before they are disrupted: auto
    (nodes that are Slurm's; default), always, or never (fleets without Slurm)."""
    slurm_silent_seconds: float = Field(default=300, gt=0, le=MAX_TIMEOUT_SECONDS)
    """Seconds of silence from Slurm about a draining node after which a rule with ifSlurmSilent:
    proceed goes on. Default 300."""


class DomainBurnIn(_Model):
    """Whether a tray waits for its NVLink domain's burn-in (``gpufleet burn-in domain``)
    before it returns to production (docs/decisions/0247)."""

    required: bool = False
    """A tray that passed its node checks while no tray of its domain is in production (all
    new, or back from a domain-wide action) waits until the all-reduce across the domain
    passed; a tray the domain burn-in names bad fails its checks. Needs
    safety.budget.perDomain (the label a domain is read from). Default false: nothing
    waits for a run that no one starts."""


class Checks(_Model):
    """Active-check profiles used for verification and burn-in."""

    verification_profile: str = "verify"
    """The agent's check profile run on a repaired node before it returns to production. Default
    verify."""
    verification_timeout_seconds: float = Field(default=1800, gt=0, le=MAX_TIMEOUT_SECONDS)
    """Seconds verification may take before it counts as failed (the ladder moves on). Default
    1800."""
    burn_in_profile: str = "burn-in"
    """The agent's check profile run on a new node before it gets work. Default burn-in."""
    burn_in_timeout_seconds: float = Field(default=4 * 3600, gt=0, le=MAX_TIMEOUT_SECONDS)
    """Seconds burn-in may take before it counts as failed. Default 14400 (4 hours)."""
    domain_burn_in: DomainBurnIn = DomainBurnIn()
    """Burn-in of an NVLink domain as a unit: the trays of a domain with none in production
    return only after its all-reduce passed too (docs/decisions/0247)."""


class Stragglers(_Model):
    """When job telemetry names a node a straggler (docs/agent.md, "Stragglers")."""

    slower_than: float = Field(default=1.08, gt=1, le=MAX_SLOWER_THAN)
    """A node whose compute time per step is at least this many times its peers' median is slow
    (1.08: 8 % slower). Default 1.08."""
    window_steps: int = Field(default=50, ge=3, le=MAX_WINDOW_STEPS)
    """Training steps (reported by every rank) the comparison looks at; medians over them. Default
    50."""
    report_every_seconds: float = Field(default=1800, gt=0, le=MAX_TIMEOUT_SECONDS)
    """While a node stays slow, one straggler occurrence per this many seconds. Default 1800."""

    def rule(self) -> StragglerRule:
        return StragglerRule(slower_than=self.slower_than, window_steps=self.window_steps)


class Detection(_Model):
    """Debounce of problem conditions, and straggler detection (used by the agent)."""

    raise_after_seconds: float = Field(default=0, ge=0, le=MAX_TIMEOUT_SECONDS)
    """A problem must be seen this many seconds before the agent raises its condition (0: at once).
    Default 0."""
    clear_after_seconds: float = Field(default=300, ge=0, le=MAX_TIMEOUT_SECONDS)
    """A raised condition must be healthy this many seconds before the agent clears it. Default
    300."""
    stragglers: Stragglers = Stragglers()
    """When job telemetry names a node a straggler (docs/agent.md)."""


class GroupDomainBudget(_Model):
    """A node group's own k for the NVLink domains of its nodes (docs/decisions/0243):
    only the number; the label a domain is read from and the counting stay fleet-wide
    (``safety.budget.perDomain``, which must be set)."""

    max_nodes: int = Field(ge=0, le=MAX_NODES)
    """At most this many nodes of one NVLink domain out of service at once, for the
    domains of this group's nodes, in place of safety.budget.perDomain.maxNodes (a group
    of 18-tray NVL72 racks beside one of 9-tray NVL36 racks); 0 stops automatic disruption
    of the group's nodes that have a domain."""


class GroupBudget(_Model):
    """A node group's own disruption budget, counted on the group's nodes (every pool).

    A field left out is the fleet's (``safety.budget``). It is a limit added to the
    pool's and the fleet's, never one in their place: a node is held to every budget
    that covers it (docs/decisions/0225).
    """

    max_nodes: int | None = Field(default=None, ge=0, le=MAX_NODES)
    """At most this many nodes of the group out of service at once; 0 stops automatic
    disruption in the group. Absent: safety.budget.maxNodes."""
    max_percent: float | None = Field(default=None, ge=0, le=100)
    """At most this percentage of the group's nodes out at once (rounded down, raised to
    minNodes). Absent: safety.budget.maxPercent."""
    min_nodes: int | None = Field(default=None, ge=0, le=MAX_NODES)
    """A small group may still have this many nodes out, unless maxNodes is lower. Absent:
    safety.budget.minNodes."""
    per_domain: GroupDomainBudget | None = None
    """The group's own k per NVLink domain (maxNodes only), in place of
    safety.budget.perDomain.maxNodes for the domains of its nodes; needs
    safety.budget.perDomain (the domain label and the counting are fleet-wide). Absent:
    the fleet's k."""

    @model_validator(mode="before")
    @classmethod
    def _not_fleet_wide(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in (
                "fleetMaxNodes",
                "fleetMaxPercent",
                "fleet_max_nodes",
                "fleet_max_percent",
            ):
                if key in data:
                    raise ValueError(
                        f"{to_camel(key)} is fleet-wide: set it in safety.budget, not per group"
                    )
        return data

    def over(self, fleet: Budget) -> Budget:
        """The group's limits: these fields, the fleet's where one is left out, and no
        fleet-wide part (the fleet's own limit is checked on its own)."""
        return Budget.model_construct(
            max_nodes=fleet.max_nodes if self.max_nodes is None else self.max_nodes,
            max_percent=fleet.max_percent if self.max_percent is None else self.max_percent,
            min_nodes=fleet.min_nodes if self.min_nodes is None else self.min_nodes,
            fleet_max_nodes=None,
            fleet_max_percent=None,
            per_domain=None
            if self.per_domain is None or fleet.per_domain is None
            else fleet.per_domain.model_copy(update={"max_nodes": self.per_domain.max_nodes}),
        )


OVERRIDABLE = ("budget", "ladder", "rules", "unknownXid", "gpuQuarantine")
"""The fields an override may set for its node group (docs/policy.md, "Node groups")."""


class Override(_Model):
    """Policy for a group of nodes chosen by their labels (a pool, a SKU, a rack, a
    tenant's nodes). The first override whose nodeSelector matches a Node applies to it;
    a Node no override matches follows the fleet-wide fields."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The group's name (lower-case letters, digits and '-'): in Events, metrics and gpufleet
    policy explain."""
    node_selector: LabelSelector
    """Which Nodes belong to the group: matchLabels and matchExpressions, as in Kubernetes."""
    budget: GroupBudget | None = None
    """The group's own disruption budget, counted on its nodes, on top of the pool's and the
    fleet's. Absent: the group has no budget of its own."""
    ladder: tuple[LadderStep, ...] | None = None
    """The group's remediation ladder, in place of the fleet's. Absent: the fleet's ladder."""
    rules: tuple[Rule, ...] = ()
    """Rules that replace the fleet's rule for the same fault (or add one for an XID); every
    other fault keeps the fleet's rule."""
    unknown_xid: Response | None = None
    """What an XID that neither a rule nor the catalogue knows does in this group. Absent: the
    fleet's unknownXid."""
    gpu_quarantine: GpuQuarantine | None = None
    """Per-GPU quarantine in this group, in place of the fleet's (a SKU whose GPUs reset one
    by one, a tenant that runs small jobs). Absent: the fleet's gpuQuarantine."""

    @model_validator(mode="before")
    @classmethod
    def _overridable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            own = {"name", "nodeSelector", *OVERRIDABLE}
            other = sorted(k for k in data if k not in own and to_camel(k) not in own)
            if other:
                raise ValueError(
                    f"{', '.join(map(str, other))} may not be set per node group (fleet-wide "
                    f"only); an override may set {', '.join(OVERRIDABLE)}"
                )
        return data


class Policy(_Model):
    """A whole policy. See docs/policy.md for every field."""

    dry_run: bool = False
    """Decide and report (Events, logs) but change nothing: every plan is held as when paused.
    Default false."""
    paused: bool = False
    """Make no automatic change at all: every plan is held (its facts kept) and carried out once
    the policy is no longer paused. Default false."""
    rules: tuple[Rule, ...] = ()
    """One rule per fault: what one occurrence does and what repeats do. Every fault kind but xid
    needs one (names: docs/faults.md); an XID without a rule follows gpufleet's catalogue, and
    one outside it follows unknownXid."""
    unknown_xid: Response = Response.LOG
    """What an XID that neither a rule nor gpufleet's catalogue knows does. Default log (recorded,
    node stays in)."""
    ladder: tuple[LadderStep, ...] = ()
    """The remediation ladder: the rungs in order, each with its timeout, attempts and where to go
    when every attempt failed; no cycles, and it ends in triage or rma."""
    lemon: Lemon = Lemon()
    """When a node is a lemon (faults too often) and goes to triage instead of another repair
    cycle."""
    spares: Spares = Spares()
    """Hot spares: verified nodes of each pool kept out of training work, promoted when a node of
    their pool leaves production."""
    provisioning: Provisioning = Provisioning()
    """The Day-0 boot watchdog: when a boot has stalled and how often it is retried."""
    gpu_quarantine: GpuQuarantine = GpuQuarantine()
    """Per-GPU quarantine: a fault that allows it takes one GPU out instead of the node (off by
    default; docs/policy.md, "One bad GPU")."""
    safety: Safety = Safety()
    """The safety rails: disruption budget, circuit breaker and rate limit."""
    domain_faults: DomainFaults = DomainFaults()
    """Fabric faults judged at the scale of their NVLink domain: how many trays of one domain
    reporting within which window make the domain faulty (docs/policy.md, "A fabric fault is
    the domain's")."""
    drain: Drain = Drain()
    """How workloads leave a node that is taken out, and what Slurm must confirm first."""
    checks: Checks = Checks()
    """The active-check profiles run for verification after a repair and for burn-in of a new node,
    and their time limits."""
    detection: Detection = Detection()
    """Debounce of the agent's problem conditions, and straggler detection."""
    slurm: SlurmReasons = SlurmReasons()
    """How drain reasons that others set in Slurm are judged: patterns and their verdicts
    (docs/slurm.md, drains set by others)."""
    overrides: tuple[Override, ...] = ()
    """Policy per node group: the first override whose nodeSelector matches a Node sets that
    Node's budget (on top of the fleet's), ladder, rules and unknownXid; a Node none matches
    follows the fields above (docs/policy.md, "Node groups")."""

    _rules: dict[str, Rule] = PrivateAttr(default_factory=dict)
    _ladder: dict[Step, int] = PrivateAttr(default_factory=dict)
    _deprecations: tuple[policy_compat.Deprecation, ...] = PrivateAttr(default=())
    _group: str = PrivateAttr(default="")
    _group_budget: Budget | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _earlier_fields(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """A field an earlier version had is accepted, converted where it maps, and kept
        in :attr:`deprecations` (domain.policy_compat): a policy written for that version
        still loads after an upgrade."""
        if not isinstance(data, dict):
            return handler(data)
        current, found = policy_compat.migrate(data)
        policy = handler(current)
        policy._deprecations = tuple(found)
        return policy

    @property
    def deprecations(self) -> tuple[policy_compat.Deprecation, ...]:
        """The removed fields this policy was written with (empty for a current one)."""
        return self._deprecations

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problems: list[str] = []
        seen: dict[str, int] = {}
        for i, rule in enumerate(self.rules):
            key = rule.match.key
            if key in seen:
                problems.append(
                    f"rules[{i}]: a second rule for {key} (first at rules[{seen[key]}])"
                )
            seen[key] = i
        missing = [k.value for k in FaultKind if k is not FaultKind.XID and k.value not in seen]
        if missing:
            problems.append(
                "rules: no rule for " + ", ".join(missing) + " (add one; 'action: ignore' is fine)"
            )
        problems.extend(_ladder_problems(self.ladder))
        problems.extend(_off_ladder(self.rules, self.ladder, "rules", ""))
        problems.extend(self._override_problems())
        if self.checks.domain_burn_in.required and self.safety.budget.per_domain is None:
            problems.append(
                "checks.domainBurnIn.required: needs safety.budget.perDomain (the label a "
                "tray's NVLink domain is read from)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _override_problems(self) -> list[str]:
        """What makes an override wrong: a name taken twice, an override an earlier one
        hides entirely (first match wins), its own rules twice for one fault, its ladder,
        and a rule (its own or the fleet's) whose step its ladder lacks."""
        problems: list[str] = []
        names: dict[str, int] = {}
        for i, o in enumerate(self.overrides):
            where = f"overrides[{i}] ({o.name})"
            if o.name in names:
                problems.append(f"{where}: the name is taken by overrides[{names[o.name]}]")
            names.setdefault(o.name, i)
            for j, earlier in enumerate(self.overrides[:i]):
                if earlier.node_selector.implied_by(o.node_selector):
                    problems.append(
                        f"{where}: never applies: overrides[{j}] ({earlier.name}) matches every "
                        "node its nodeSelector matches, and the first match wins (put it first, "
                        "or narrow the other)"
                    )
                    break
            seen: dict[str, int] = {}
            for k, rule in enumerate(o.rules):
                if rule.match.key in seen:
                    problems.append(
                        f"{where}.rules[{k}]: a second rule for {rule.match.key} "
                        f"(first at rules[{seen[rule.match.key]}])"
                    )
                seen.setdefault(rule.match.key, k)
            if o.ladder is not None:
                problems.extend(f"{where}.{p}" for p in _ladder_problems(o.ladder))
            if (
                o.budget is not None
                and o.budget.per_domain is not None
                and self.safety.budget.per_domain is None
            ):
                problems.append(
                    f"{where}.budget.perDomain: needs safety.budget.perDomain (the domain "
                    "label and the counting are fleet-wide; the group sets only its k)"
                )
            ladder = self.ladder if o.ladder is None else o.ladder
            own = f" (the ladder of {where})" if o.ladder is not None else ""
            problems.extend(_off_ladder(o.rules, ladder, f"{where}.rules", own))
            if o.ladder is not None:
                kept = tuple(r for r in self.rules if r.match.key not in seen)
                problems.extend(_kept_off_ladder(kept, o.ladder, where))
        return problems

    def model_post_init(self, context: Any, /) -> None:
        self._rules = {rule.match.key: rule for rule in self.rules}
        self._ladder = {entry.step: i for i, entry in enumerate(self.ladder)}

    @property
    def group(self) -> str:
        """The node group this policy was resolved for ("" for the fleet-wide policy)."""
        return self._group

    @property
    def group_budget(self) -> Budget | None:
        """The group's own budget, counted on the group's nodes (None: it has none)."""
        return self._group_budget

    @property
    def domain_budget(self) -> DomainBudget | None:
        """The budget per NVLink domain that holds this policy's nodes: the group's k where
        its override sets one (docs/decisions/0243), else ``safety.budget.perDomain``."""
        group = self._group_budget
        if group is not None and group.per_domain is not None:
            return group.per_domain
        return self.safety.budget.per_domain

    def for_override(self, index: int) -> Policy:
        """This policy as it applies to the nodes of ``overrides[index]``: its rules in
        place of the fleet's for the same fault, its ladder and unknownXid where set, its
        budget as :attr:`group_budget`; every other field (dryRun and paused included) the
        fleet's. Validated as a whole when the policy was loaded."""
        o = self.overrides[index]
        replaced = {r.match.key: r for r in o.rules}
        rules = tuple(replaced.pop(r.match.key, r) for r in self.rules) + tuple(replaced.values())
        resolved = self.model_copy(
            update={
                "rules": rules,
                "ladder": self.ladder if o.ladder is None else o.ladder,
                "unknown_xid": self.unknown_xid if o.unknown_xid is None else o.unknown_xid,
                "gpu_quarantine": (
                    self.gpu_quarantine if o.gpu_quarantine is None else o.gpu_quarantine
                ),
                "overrides": (),
            }
        )
        resolved.model_post_init(None)
        resolved._group = o.name
        resolved._group_budget = None if o.budget is None else o.budget.over(self.safety.budget)
        return resolved

    def rule_for(self, fault: FaultEvent) -> Rule:
        """The rule that applies to a fault (catalogue defaults for other XIDs;
        for XIDs 144-150 the default follows the decoded message)."""
        rule = self._rules.get(fault.key)
        if rule is not None:
            return rule
        if fault.xid is not None:
            found = nvlink5.bucket(fault.xid, fault.evidence.message)
            if found is not None:
                return _nvlink5_rule(fault.xid, found)
            return _catalogue_rule(fault.xid, self.unknown_xid)
        raise KeyError(f"no rule for {fault.key}")  # unreachable: validated above

    def warnings(self) -> list[str]:
        """What is valid but worth a second look: fields an earlier version had (each
        with its replacement), rules for XIDs that gpufleet's catalogue does not know
        (typos, or XIDs newer than this release)."""
        return (
            [d.message() for d in self._deprecations]
            + [
                f"rules[{i}]: XID {rule.match.xid} is not in gpufleet's catalogue; "
                "the rule applies as written"
                for i, rule in enumerate(self.rules)
                if rule.match.xid is not None and rule.match.xid not in xids.XIDS
            ]
            + [
                f"overrides[{i}] ({o.name}).budget: no tighter than safety.budget in any "
                "field; a node is held to both, so it changes nothing"
                for i, o in enumerate(self.overrides)
                if o.budget is not None and _no_tighter(o.budget, self.safety.budget)
            ]
        )

    def ladder_entry(self, step: Step) -> LadderStep | None:
        """The ladder rung for a step, if the ladder has one."""
        i = self._ladder.get(step)
        return None if i is None else self.ladder[i]

    def next_step(self, step: Step) -> Step:
        """Where the ladder goes when ``step`` failed every attempt."""
        i = self._ladder.get(step)
        if i is None:
            return Step.TRIAGE
        entry = self.ladder[i]
        if entry.on_failure is not None:
            return entry.on_failure
        return self.ladder[i + 1].step if i + 1 < len(self.ladder) else Step.TRIAGE

    def first_step(self) -> Step:
        """The least disruptive rung (used when verification fails with no history)."""
        return self.ladder[0].step if self.ladder else Step.TRIAGE

    def walk(self, start: Step) -> list[LadderStep | Step]:
        """The path of escalation from ``start``: rungs, then a terminal step."""
        path: list[LadderStep | Step] = []
        step = start
        while step not in TERMINAL:
            entry = self.ladder_entry(step)
            if entry is None:
                break
            path.append(entry)
            step = self.next_step(step)
        path.append(step if step in TERMINAL else Step.TRIAGE)
        return path


def _no_tighter(group: GroupBudget, fleet: Budget) -> bool:
    """Whether a group's budget allows at least what the pool's does in every field (a
    k of its own per NVLink domain changes something: it replaces the fleet's)."""
    mine = group.over(fleet)
    return (
        group.per_domain is None
        and mine.max_nodes >= fleet.max_nodes
        and mine.max_percent >= fleet.max_percent
        and mine.min_nodes >= fleet.min_nodes
    )


def _then(rule: Rule) -> Response | None:
    return rule.repeat.then if rule.repeat is not None else None


def _steps(rule: Rule) -> list[tuple[str, Step]]:
    """The node steps a rule can start: (where, step) for its action and its repeat."""
    found: list[tuple[str, Step]] = []
    for field, response in (("action", rule.action), ("repeat.then", _then(rule))):
        step = response.step if response is not None else None
        if step is not None and step in NODE_ACTIONS:
            found.append((field, step))
    return found


def _kept_off_ladder(
    rules: tuple[Rule, ...], ladder: tuple[LadderStep, ...], where: str
) -> list[str]:
    """The fleet's rules an override keeps that start a step its own ladder lacks: one
    problem per override, naming the steps and the faults."""
    on_ladder = {entry.step for entry in ladder}
    missing: dict[Step, list[str]] = {}
    for rule in rules:
        for _field, step in _steps(rule):
            if step not in on_ladder and rule.match.key not in missing.setdefault(step, []):
                missing[step].append(rule.match.key)
    missing = {step: keys for step, keys in missing.items() if keys}
    if not missing:
        return []
    faults = sorted({key for keys in missing.values() for key in keys})
    shown = ", ".join(faults[:6]) + (f" and {len(faults) - 6} more" if len(faults) > 6 else "")
    steps = ", ".join(sorted(missing))
    return [
        f"{where}.ladder: lacks {steps}, which the fleet's rules for {shown} start: add the "
        "steps to this ladder, or give the override its own rules for those faults"
    ]


def _off_ladder(
    rules: tuple[Rule, ...], ladder: tuple[LadderStep, ...], where: str, which: str
) -> list[str]:
    """Rules whose action or repeat names a node step ``ladder`` lacks."""
    on_ladder = {entry.step for entry in ladder}
    problems: list[str] = []
    for i, rule in enumerate(rules):
        for field, step in _steps(rule):
            if step not in on_ladder:
                problems.append(f"{where}[{i}].{field}: {step} is not a step of the ladder{which}")
    return problems


def _ladder_problems(ladder: tuple[LadderStep, ...]) -> list[str]:
    problems: list[str] = []
    index: dict[Step, int] = {}
    for i, entry in enumerate(ladder):
        if entry.step is Step.RESTART_JOB:
            problems.append(f"ladder[{i}]: restart-job is a rule action, not a ladder step")
        if entry.step in index:
            problems.append(f"ladder[{i}]: {entry.step} appears twice (a cycle)")
        index.setdefault(entry.step, i)
    for i, entry in enumerate(ladder):
        target = entry.on_failure
        if target is not None and target not in TERMINAL and target not in index:
            problems.append(f"ladder[{i}].onFailure: {target} is not a step of the ladder")
    # Follow on_failure edges from every rung: each walk must reach a terminal step.
    for i, entry in enumerate(ladder):
        visited = [entry.step]
        j: int | None = i
        while j is not None:
            current = ladder[j]
            nxt = current.on_failure or (ladder[j + 1].step if j + 1 < len(ladder) else Step.TRIAGE)
            if nxt in TERMINAL:
                break
            if nxt in visited:
                chain = " -> ".join([*visited, nxt])
                problems.append(f"ladder[{i}]: escalation cycles ({chain})")
                break
            visited.append(nxt)
            j = index.get(nxt)
    return sorted(set(problems))


@functools.lru_cache(maxsize=256)
def _catalogue_rule(xid: int, unknown: Response) -> Rule:
    info = xids.XIDS.get(xid)
    if info is None:
        return Rule.model_construct(match=Match.model_construct(xid=xid), action=unknown)
    if info.start_at is not None:
        action = Response(info.start_at.value)
    elif info.xid_class is xids.XidClass.APPLICATION:
        action = Response.RESTART_JOB
    else:
        action = Response.LOG
    return Rule.model_construct(
        match=Match.model_construct(xid=xid, fault=None),
        action=action,
        repeat=None,
        taint=TaintEffect.NO_SCHEDULE,
        drain=None,
        requeue=RequeueMode.NOW,
        note=f"catalogue default ({info.nvidia_action})",
    )


_NVLINK5_RESPONSE = {
    nvlink5.Bucket.IGNORE: Response.LOG,
    nvlink5.Bucket.RESET_GPU: Response.GPU_RESET,
    nvlink5.Bucket.XID_154_EVAL: Response.RESTART_JOB,
}
"""NVIDIA's per-message bucket for XIDs 144-150 -> the default response. IGNORE is
still logged (an Event, counted for lemons); XID_154_EVAL restarts the job, and
an accompanying XID 154 drives the node action on its own."""


@functools.lru_cache(maxsize=64)
def _nvlink5_rule(xid: int, found: nvlink5.Bucket) -> Rule:
    return Rule.model_construct(
        match=Match.model_construct(xid=xid, fault=None),
        action=_NVLINK5_RESPONSE[found],
        repeat=None,
        taint=TaintEffect.NO_SCHEDULE,
        drain=None,
        requeue=RequeueMode.NOW,
        note=f"catalogue default (WORKFLOW_NVLINK5_ERR: {found})",
    )


PolicyIssue = yamldoc.Issue
"""One problem in a policy file (location, line, message)."""


class PolicyError(ValueError):
    """A policy file is not valid; ``issues`` lists every problem found."""

    def __init__(self, source: str, issues: list[PolicyIssue]) -> None:
        self.source = source
        self.issues = issues
        lines = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"{source}: {len(issues)} problem(s) in the policy\n{lines}")


def load_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and validate a policy from YAML text.

    The text is bounded by :data:`yamldoc.LIMITS` (1 MiB, 32 levels, 100,000
    values): the controller loads whatever a FleetPolicy editor wrote, and a
    file over a bound is refused before it costs time or memory.
    Raises :class:`PolicyError` listing every problem with its path and line.
    """
    try:
        node, data = yamldoc.parse_mapping(text, "a policy")
    except yamldoc.DocumentError as exc:
        raise PolicyError(source, exc.issues) from exc
    if "spec" in data and "kind" in data:  # a FleetPolicy object: validate its spec
        node = yamldoc.child(node, "spec")
        data = dict(data["spec"] or {})
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(source, yamldoc.issues_of(exc, node, root="(policy)")) from None


@functools.lru_cache(maxsize=1)
def default_policy() -> Policy:
    """The built-in policy (docs/policy.md explains each choice)."""
    from gpufleet.domain.defaults import DEFAULT_POLICY_YAML

    return load_policy(DEFAULT_POLICY_YAML, "<default policy>")
