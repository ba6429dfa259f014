"""The fleet model: what fails, how it is found, what repairs cost.

The model is data (``models/default.yaml``), validated here with pydantic so
that a bad file is rejected at the edge with the path and line of every bad
field. Durations are seconds; failure rates are per 1000 node-days, the unit
of the published tables (docs/simulator.md lists each default and its
source). What the fleet *does* about a fault is not here: that is the policy
(:class:`gpufleet.domain.policy.Policy`), the same file the controller uses.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from gpufleet.domain import xids, yamldoc
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.ladder import Step


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class Effect(StrEnum):
    """What a fault does to the training job running on the node."""

    CRASH = "crash"
    """The job fails at once (a CUDA error, a lost GPU, a dead link)."""
    HANG = "hang"
    """The job stops making progress; only the collective watchdog ends it."""
    SDC = "sdc"
    """Silent data corruption: the job runs on, on wrong numbers."""
    SLOW = "slow"
    """The node is slower than its peers, so the synchronous job is too."""

    @property
    def silent(self) -> bool:
        """Whether nothing fails: only checks, monitoring or symptoms find it."""
        return self in (Effect.SDC, Effect.SLOW)


class Scope(StrEnum):
    """Which component fails; decides the fault's evidence (and repeat counting)."""

    GPU = "gpu"
    NODE = "node"
    LINK = "link"


CURES: tuple[Step, ...] = (
    Step.RESTART_JOB,
    Step.GPU_RESET,
    Step.REBOOT,
    Step.POWER_CYCLE,
    Step.REIMAGE,
    Step.RMA,
)
"""What can truly fix a fault, weakest first. A ladder step fixes a fault whose
cure is the same step or a weaker one; ``rma`` only new hardware fixes."""


class Category(_Model):
    """One failure category: its rate, its effect and what really fixes it."""

    name: str = Field(min_length=1)
    rate: float = Field(ge=0)
    """Events per 1000 node-days (a node-day is one node for 24 h)."""
    effect: Effect = Effect.CRASH
    scope: Scope = Scope.GPU
    fault: FaultKind | None = None
    """The fault a monitor reports; give this or ``xid`` (neither: the cause
    is never attributed to a node, e.g. an unexplained NCCL timeout)."""
    xid: int | None = None
    cure: dict[Step, float] = Field(default_factory=lambda: {Step.RESTART_JOB: 1.0})
    """Probability of each true cure (weakest step that fixes it); sums to 1."""
    lemon: bool = True
    """Whether lemon nodes have this fault more often (hardware categories)."""
    slowdown: float = Field(default=0.0, ge=0, lt=1)
    """For ``slow``: the fraction of speed the job loses while the node is in it."""
    check_coverage: float = Field(default=0.0, ge=0, le=1)
    """Chance that one active-check run finds this fault (silent faults)."""
    check_fault: FaultKind | None = None
    """What an active check reports for it (default: ``fault``)."""
    symptom_mean_seconds: float = Field(default=86400.0, gt=0)
    """For silent faults: mean time until the job's own symptoms (NaN loss,
    an MFU drop someone notices) reveal it, when nothing else finds it first."""

    @model_validator(mode="after")
    def _valid(self) -> Self:
        if self.fault is not None and self.xid is not None:
            raise ValueError("give at most one of 'fault' or 'xid'")
        if self.fault is FaultKind.XID:
            raise ValueError("name XIDs with 'xid: <number>', not 'fault: xid'")
        if self.xid is not None and self.xid not in xids.XIDS:
            raise ValueError(f"unknown XID {self.xid}")
        bad = [str(s) for s in self.cure if s not in CURES]
        if bad:
            allowed = ", ".join(CURES)
            raise ValueError(f"cure: {', '.join(bad)} cannot cure a fault (use {allowed})")
        total = sum(self.cure.values())
        if abs(total - 1.0) > 1e-6 or any(p < 0 for p in self.cure.values()):
            raise ValueError(
                f"cure: probabilities must be >= 0 and sum to 1 (they sum to {total:g})"
            )
        if self.effect is Effect.SLOW and self.slowdown <= 0:
            raise ValueError("a 'slow' category needs a slowdown > 0")
        if self.effect.silent and self.fault is None and self.xid is None:
            raise ValueError("a silent category needs the fault its detectors report")
        lasting = any(step is not Step.RESTART_JOB and p > 0 for step, p in self.cure.items())
        if lasting and self.fault is None and self.xid is None:
            raise ValueError("a fault that outlasts a job restart needs 'fault' or 'xid'")
        if self.effect.silent and self.cure.get(Step.RESTART_JOB, 0) > 0:
            raise ValueError("a silent fault is not cured by a job restart; give node cures")
        return self

    @property
    def attributed(self) -> bool:
        """Whether a monitor can name the node (and so the policy can act)."""
        return self.fault is not None or self.xid is not None


class Lemons(_Model):
    """Heavy-tailed per-node rates: a few nodes fail far more often than the rest."""

    fraction: float = Field(default=0.015, ge=0, le=1)
    multiplier: float = Field(default=8.0, ge=1)
    """A lemon's rate relative to an ordinary node's, for ``lemon`` categories."""
    spread: float = Field(default=0.5, ge=0)
    """Log-normal sigma of every node's own rate factor (0: all alike)."""
    found_by_triage: float = Field(default=0.85, ge=0, le=1)
    """Chance that a person who triages a lemon sends it to RMA [KOK: > 85%]."""


class Planned(_Model):
    """Planned maintenance: the node is drained gracefully (checkpoint first)."""

    rate: float = Field(default=0.42, ge=0)
    """Per 1000 node-days [L3: 47 planned interruptions in 54 days on 2,048 nodes]."""
    duration_seconds: float = Field(default=3600.0, gt=0)


class Failures(_Model):
    """The failure model."""

    categories: tuple[Category, ...]
    planned: Planned = Planned()
    lemons: Lemons = Lemons()

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [c.name for c in self.categories]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"categories: duplicate name(s) {', '.join(dup)}")
        return self


class ActiveChecks(_Model):
    """Active checks (GEMM, SDC, HBM, NCCL) on nodes that are not training."""

    enabled: bool = True
    idle_interval_seconds: float = Field(default=3600.0, gt=0)
    """How often an idle node (a spare, a node waiting for work) is checked."""
    preflight: bool = True
    """Check every node of the job while it restarts (costs no extra time)."""


class Detection(_Model):
    """How faults are found."""

    passive: bool = True
    """Node monitors (XID, ECC, links) report faults to the policy. Off: a person
    finds the bad node after a job failure (``human.diagnosisSeconds``)."""
    passive_seconds: float = Field(default=30.0, ge=0)
    """From a fault to its report [BR: 10-30 s; KOK: 5-min health checks]."""
    hang_timeout_seconds: float = Field(default=600.0, gt=0)
    """Collective watchdog for hangs [PTPR: PyTorch NCCL default 10 min]."""
    performance_monitoring: bool = True
    """Job telemetry names stragglers (reported as ``straggler`` faults, every
    ``detection.stragglers.reportEverySeconds`` of the policy)."""
    active_checks: ActiveChecks = ActiveChecks()


class StepCost(_Model):
    """One remediation step: duration and the chance that it runs to completion."""

    seconds: float = Field(gt=0)
    success: float = Field(default=0.95, ge=0, le=1)
    """Chance the step executes (a BMC or agent error fails it)."""


def _default_steps() -> dict[Step, StepCost]:
    return {
        Step.GPU_RESET: StepCost(seconds=180),
        Step.REBOOT: StepCost(seconds=600),
        Step.POWER_CYCLE: StepCost(seconds=900),
        Step.REIMAGE: StepCost(seconds=2100),
    }


class Human(_Model):
    """People: triage, manual repair, diagnosis without monitors."""

    response_seconds: float = Field(default=4 * 3600.0, gt=0)
    """Mean time from triage to a person acting (exponential)."""
    repair_seconds: float = Field(default=2 * 3600.0, gt=0)
    """Mean hands-on repair of a node that needs no new hardware."""
    diagnosis_seconds: float = Field(default=3600.0, gt=0)
    """Mean time for a person to find the bad node after a job failure when no
    monitor named it (the job waits) [C4, Minder: > 30 min manual diagnosis]."""
    after_crashes: int = Field(default=3, ge=1)
    """Crashes of the job on one unrepaired node before a person steps in."""


class Remediation(_Model):
    """Remediation costs."""

    drain_seconds: float = Field(default=30.0, ge=0)
    steps: dict[Step, StepCost] = Field(default_factory=_default_steps)
    verify_seconds: float = Field(default=600.0, gt=0)
    """Active-check profile after a repair [DCGM level 2 ~2 min + NCCL + GEMM]."""
    burn_in_seconds: float = Field(default=4 * 3600.0, gt=0)
    provisioning_seconds: float = Field(default=1800.0, gt=0)
    rma_seconds: float = Field(default=2 * 86400.0, gt=0)
    """Mean RMA turnaround with a spare part on site [(A) 1-3 days]."""
    retry_seconds: float = Field(default=60.0, gt=0)
    """How soon a decision held by a safety rail is retried (a Tick)."""
    recrash_seconds: float = Field(default=900.0, gt=0)
    """Mean time for a job to fail again on a node whose fault was not repaired."""
    human: Human = Human()

    @model_validator(mode="after")
    def _steps(self) -> Self:
        missing = [
            s.value
            for s in (Step.GPU_RESET, Step.REBOOT, Step.POWER_CYCLE, Step.REIMAGE)
            if s not in self.steps
        ]
        if missing:
            raise ValueError(f"steps: no cost for {', '.join(missing)}")
        extra = [s.value for s in self.steps if s in (Step.RESTART_JOB, Step.TRIAGE, Step.RMA)]
        if extra:
            raise ValueError(f"steps: {', '.join(extra)} is not a node step")
        return self


class Checkpoint(_Model):
    """Checkpointing of the training job."""

    interval_seconds: float | None = Field(default=None, gt=0)
    """None: the Daly optimum for the model's expected job MTBF."""
    blocking_seconds: float = Field(default=10.0, ge=0)
    """Training stall per save [PTDCP async: 6-14 s; KOK sync: 5 min]."""


class ReplicaGroups(_Model):
    """The job as torchft replica groups that recover by themselves (decision 0269).

    A node fault costs the surviving groups at most one step; the job never stops. The
    group on the node is out of the training from the fault; gpufleet reports it,
    the group leaves (or is drained), and a replacement group on a spare rejoins by
    copying the weights from a live peer. Silent corruption is found by the groups'
    fingerprint vote within ``sdcDetectSeconds`` and costs the bad group's steps since
    it began, not a rollback."""

    enabled: bool = False
    nodes_per_group: int = Field(default=1, ge=1)
    """Nodes of one replica group (a node lost takes its whole group out)."""
    step_seconds: float = Field(default=5.0, gt=0)
    """One training step: what a group lost costs the survivors, at most."""
    depart_seconds: float = Field(default=5.0, ge=0)
    """Departure notice to the group out of the quorum (it finishes its step)."""
    rejoin_seconds: float = Field(default=120.0, ge=0)
    """The group out to its replacement training again (requeue, start, weight copy)."""
    sdc_detect_seconds: float = Field(default=300.0, gt=0)
    """Silent corruption to the fingerprint vote naming the group's node."""


class Job(_Model):
    """The large synchronous training job."""

    checkpoint: Checkpoint = Checkpoint()
    replica_groups: ReplicaGroups = ReplicaGroups()
    restart_seconds: float = Field(default=300.0, ge=0)
    """Scheduling, NCCL init and checkpoint load [KOK u0 5-20 min; MS < 30 s init]."""
    requeue_seconds: float = Field(default=60.0, ge=0)
    min_fraction: float = Field(default=1.0, gt=0, le=1)
    """The job may restart on this fraction of its nodes (data-parallel shrink),
    running proportionally slower; below it, it waits for nodes."""


class Fleet(_Model):
    """The machines."""

    gpus_per_node: int = Field(default=8, ge=1)
    spare_percent: float = Field(default=1.0, ge=0, le=100)
    """Spare nodes beyond the job's, as a percentage of the job's nodes (rounded up)."""
    spare_nodes: int | None = Field(default=None, ge=0)
    """An exact number of spares (overrides ``sparePercent``)."""
    nvlink_domain_nodes: int | None = Field(default=None, ge=1)
    """Nodes per NVLink domain (18 trays for a GB200 NVL72): consecutive nodes share a
    domain, which a policy's safety.budget.perDomain counts them under. Absent: no node
    is in a domain."""

    def spares(self, job_nodes: int) -> int:
        """Spare nodes for a job of ``job_nodes`` nodes."""
        if self.spare_nodes is not None:
            return self.spare_nodes
        return math.ceil(job_nodes * self.spare_percent / 100.0 - 1e-9)


class Model(_Model):
    """A whole fleet model."""

    description: str = ""
    fleet: Fleet = Fleet()
    job: Job = Job()
    failures: Failures
    detection: Detection = Detection()
    remediation: Remediation = Remediation()

    def job_rate_per_node_second(self) -> float:
        """Mean rate of job interruptions per node-second (all categories + planned)."""
        total = sum(c.rate for c in self.failures.categories) + self.failures.planned.rate
        return total / 1000.0 / 86400.0


class ModelError(ValueError):
    """A model file is not valid; ``issues`` lists every problem as ``line N: path: text``."""

    def __init__(self, source: str, issues: list[str]) -> None:
        self.source = source
        self.issues = issues
        lines = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"{source}: {len(issues)} problem(s) in the model\n{lines}")


def load_model(text: str, source: str = "<model>") -> Model:
    """Parse and validate a model from YAML text; raise :class:`ModelError`."""
    try:
        node, data = yamldoc.parse_mapping(text, "a model")
    except yamldoc.DocumentError as exc:
        raise ModelError(source, [str(i) for i in exc.issues]) from exc
    try:
        return Model.model_validate(data)
    except ValidationError as exc:
        issues = yamldoc.issues_of(exc, node, root="(model)")
        raise ModelError(source, [str(i) for i in issues]) from None


@functools.lru_cache(maxsize=1)
def default_model_text() -> str:
    """The built-in model file (Llama 3 mix, documented defaults)."""
    return (
        importlib.resources.files("gpufleet.sim")
        .joinpath("models/default.yaml")
        .read_text(encoding="utf-8")
    )


@functools.lru_cache(maxsize=1)
def default_model() -> Model:
    """The built-in model."""
    return load_model(default_model_text(), "<default model>")
