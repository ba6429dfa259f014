"""What can happen to a node: the inputs of :func:`gpufleet.domain.decide`.

Monitors report faults; executors report the outcome of what they were asked
to do (drain done, step done, checks passed); operators ask for maintenance,
return a node from triage, hold one for triage, drop a held fault, or say
hardware was replaced (``gpufleet node VERB``, :mod:`gpufleet.domain.operator`); a periodic ``Tick``
lets timeouts and withheld actions be re-examined.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain.faults import FaultEvent
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import DrainMode, RequeueMode


@dataclass(frozen=True, slots=True)
class FaultObserved:
    """A monitor or check reported a fault (the same one again is harmless)."""

    fault: FaultEvent


@dataclass(frozen=True, slots=True)
class FaultCleared:
    """A problem condition with this fault key went back to healthy."""

    key: str


@dataclass(frozen=True, slots=True)
class DrainCompleted:
    """Every workload left the node (or the drain timeout forced them)."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class StepCompleted:
    """A remediation step finished. ``succeeded`` false means it failed."""

    step: Step
    succeeded: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class WorkFound:
    """An act was about to start and the node was found not empty (a pod, a Slurm job,
    Slurm silent, a GPU process the agent saw): nothing was done. The node is drained
    again before the act is asked for again; a refusal never escalates the ladder
    (decision 0074, docs/decisions/0139)."""

    step: Step | None
    """The step that was refused (None: a maintenance command)."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ChecksCompleted:
    """A verification or burn-in run finished."""

    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Registered:
    """A provisioning node joined the cluster and matches its inventory."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class InventoryMismatch:
    """A joining node's hardware differs from its inventory record."""

    detail: str


@dataclass(frozen=True, slots=True)
class MaintenanceRequested:
    """An operator, or a MaintenancePlan, wants the node out (drained first).

    A plan's request (:mod:`gpufleet.domain.maintenance`) names its incident
    (``key``), how jobs leave (``requeue``, ``drain_mode``) and the BMC ``step``
    that carries the change out once the node is drained (``reboot``,
    ``reimage``); without a step the node waits in ``maintenance``.
    """

    reason: str
    step: Step | None = None
    key: str = "maintenance"
    requeue: RequeueMode | None = None
    drain_mode: DrainMode | None = None
    command_timeout_s: float | None = None
    """For a plan's command (named in ``reason``): how long the agent lets it run."""
    whole_domain: str = ""
    """A domain-scope plan's request: the NVLink domain emptied as one (its budget does not
    hold this node; docs/decisions/0244)."""


@dataclass(frozen=True, slots=True)
class DomainEmptied:
    """Every tray of the node's NVLink domain waits empty in ``maintenance`` for a
    domain-scope plan: run the plan's command (named in ``reason``) now."""

    reason: str
    key: str
    """The plan's incident key: a node in another incident ignores it."""
    command_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class MaintenanceCompleted:
    """An operator is done; the node is verified before it returns."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class MaintenanceFailed:
    """The change made in maintenance failed (a plan's command exited non-zero or never
    answered): the node goes to triage, not back through verification."""

    reason: str


@dataclass(frozen=True, slots=True)
class OperatorReturn:
    """An operator sends a triaged node back through verification."""

    reason: str


@dataclass(frozen=True, slots=True)
class OperatorRMA:
    """An operator sends a triaged node to the vendor."""

    reason: str


@dataclass(frozen=True, slots=True)
class OperatorTriage:
    """An operator wants the node held for a person: drained first if it is in
    production, at once if automation is repairing or verifying it."""

    reason: str


@dataclass(frozen=True, slots=True)
class OperatorDismiss:
    """An operator drops the fault a safety rail holds on the node (it is never
    dropped otherwise: a held fault waits until it is acted on)."""

    reason: str


@dataclass(frozen=True, slots=True)
class HardwareReplaced:
    """The vendor replaced the hardware: the only way out of ``rma``."""

    reason: str


@dataclass(frozen=True, slots=True)
class SparePromoted:
    """A node left production elsewhere in the pool: this hot spare takes its place
    (chosen by :func:`gpufleet.domain.spares.promotions`)."""

    reason: str


@dataclass(frozen=True, slots=True)
class DomainFaulted:
    """The node's NVLink domain is judged faulty (:func:`gpufleet.domain.domain_faults.judge`):
    the node is taken out with it and held, no ladder step for the fabric fault."""

    domain: str
    reason: str


@dataclass(frozen=True, slots=True)
class DomainRepaired:
    """The node's held NVLink domain reports healthy again: verify the node."""

    domain: str
    reason: str


@dataclass(frozen=True, slots=True)
class DomainBurnInJudged:
    """The burn-in of the node's NVLink domain was judged (``gpufleet burn-in domain``;
    domain.domain_burnin): it counts for a node waiting for it since before ``at``."""

    domain: str
    passed: bool
    at: float
    reason: str
    bad: tuple[str, ...] = ()
    """Trays named bad (each fails its own checks)."""


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: check timeouts and retry withheld actions."""


Event = (
    FaultObserved
    | FaultCleared
    | DrainCompleted
    | StepCompleted
    | WorkFound
    | ChecksCompleted
    | DomainBurnInJudged
    | Registered
    | InventoryMismatch
    | MaintenanceRequested
    | DomainEmptied
    | MaintenanceCompleted
    | MaintenanceFailed
    | OperatorReturn
    | OperatorRMA
    | OperatorTriage
    | OperatorDismiss
    | HardwareReplaced
    | SparePromoted
    | DomainFaulted
    | DomainRepaired
    | Tick
)
"""Everything :func:`gpufleet.domain.decide` accepts."""
