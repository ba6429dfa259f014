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

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.domain.actions import Action, ActionKind
    from gpufleet.domain.decide import Decision, decide
    from gpufleet.domain.events import Event
    from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
    from gpufleet.domain.ladder import Step
    from gpufleet.domain.policy import Policy, PolicyError, default_policy, load_policy
    from gpufleet.domain.records import FleetView, NodeRecord, PoolView
    from gpufleet.domain.safety import BreakerState, Hold
    from gpufleet.domain.states import IllegalTransition, NodeState, Transition

_EXPORTS = {
    "Action": "actions",
    "ActionKind": "actions",
    "Decision": "decide",
    "decide": "decide",
    "Event": "events",
    "Evidence": "faults",
    "FaultEvent": "faults",
    "FaultKind": "faults",
    "Subsystem": "faults",
    "Step": "ladder",
    "Policy": "policy",
    "PolicyError": "policy",
    "default_policy": "policy",
    "load_policy": "policy",
    "FleetView": "records",
    "NodeRecord": "records",
    "PoolView": "records",
    "BreakerState": "safety",
    "Hold": "safety",
    "IllegalTransition": "states",
    "NodeState": "states",
    "Transition": "states",
}
"""Each name this package re-exports, and its module: imported on first use, so that
importing one module of the package (``gpufleet.domain.xids``) does not build every
model of the others (a third of a second of a command's start, docs/cli.md)."""


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


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
