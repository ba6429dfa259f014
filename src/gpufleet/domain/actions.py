"""What a decision asks the world to do.

Actions are plain values. The executors (the lifecycle controller, the Slurm
syncer, the simulator) interpret them; the order inside a decision is the
order to carry them out (cordon before drain, drain before reboot).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.ladder import DISRUPTIVE, Step
from gpufleet.domain.policy import DrainMode, RequeueMode, TaintEffect


class ActionKind(StrEnum):
    """The kinds of action."""

    CORDON = "cordon"
    """Mark unschedulable, with gpufleet's ownership annotation."""
    UNCORDON = "uncordon"
    """Clear a cordon gpufleet set (never someone else's)."""
    TAINT = "taint"
    """Add gpufleet's taint with ``taint`` (key from well_known)."""
    UNTAINT = "untaint"
    """Remove gpufleet's taints."""
    DRAIN = "drain"
    """Make workloads leave (``drain_mode``); Slurm drain + requeue (``requeue``)."""
    RESTART_JOB = "restart-job"
    """The job on this node failed for its own reasons; requeue it, keep the node."""
    RUN_STEP = "run-step"
    """Run a remediation step (``step``) on the node."""
    RUN_CHECKS = "run-checks"
    """Run an active-check profile (``profile``) and report the result."""
    RUN_COMMAND = "run-command"
    """Have the node's agent run a maintenance command (``detail``: its name) and report."""
    QUARANTINE_GPU = "quarantine-gpu"
    """One GPU (``gpu``) is out of service, the node stays in it (the record names the GPU;
    Slurm and Kubernetes keep new work off it)."""
    RELEASE_GPU = "release-gpu"
    """A quarantined GPU (``gpu``) is back in service: the repair was verified."""
    NOTIFY = "notify"
    """Tell people (Event, log, alert); nothing on the node changes."""


@dataclass(frozen=True, slots=True)
class Action:
    """One thing to do. Fields other than ``kind`` apply to some kinds only."""

    kind: ActionKind
    detail: str = ""
    step: Step | None = None
    taint: TaintEffect | None = None
    drain_mode: DrainMode | None = None
    requeue: RequeueMode | None = None
    profile: str | None = None
    timeout_seconds: float | None = None
    gpu: int | None = None
    """The GPU's index (quarantine-gpu, release-gpu)."""

    @property
    def disruptive(self) -> bool:
        """Whether this counts against the rate limit: isolation or a machine restart."""
        if self.kind is ActionKind.DRAIN:
            return True
        return self.kind is ActionKind.RUN_STEP and self.step in DISRUPTIVE

    def __str__(self) -> str:
        extra = next(
            (
                str(v)
                for v in (self.step, self.taint, self.drain_mode, self.profile)
                if v is not None
            ),
            "",
        )
        text = f"{self.kind}" + (f"({extra})" if extra else "")
        return text + (f": {self.detail}" if self.detail else "")
