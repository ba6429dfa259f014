"""The decision core of gpufleet: pure, typed, shared.

Everything that decides what happens to a node lives here: the lifecycle
state machine (:mod:`states`), the fault catalogue (:mod:`faults`,
:mod:`xids`), the policy (:mod:`policy`), the remediation ladder
(:mod:`ladder`), the safety rails (:mod:`safety`) and the decision function
that ties them together (:mod:`decide`).

The promise of this package: no I/O and no clock reads. Every function takes
the current time as an argument and returns values; nothing here talks to
Kubernetes, Slurm, a BMC, NVML or the file system (policy files are parsed
from text that the caller read). The controllers, the node agent, the Slurm
syncer and the fleet simulator all call the same functions, so a fault is
judged the same way everywhere.
"""

from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.decide import Decision, decide
from gpufleet.domain.events import Event
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, PolicyError, default_policy, load_policy
from gpufleet.domain.records import FleetView, NodeRecord, PoolView
from gpufleet.domain.safety import BreakerState, Hold
from gpufleet.domain.states import IllegalTransition, NodeState, Transition

__all__ = [
    "Action",
    "ActionKind",
    "BreakerState",
    "Decision",
    "Event",
    "Evidence",
    "FaultEvent",
    "FaultKind",
    "FleetView",
    "Hold",
    "IllegalTransition",
    "NodeRecord",
    "NodeState",
    "Policy",
    "PolicyError",
    "PoolView",
    "Step",
    "Subsystem",
    "Transition",
    "decide",
    "default_policy",
    "load_policy",
]
