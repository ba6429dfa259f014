"""What the gate answers: done, failed, refused (work found), held (ask later), stale."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Done:
    """The act was carried out (or its earlier POST was confirmed)."""

    detail: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The act was tried and failed; ``identity``: the BMC is not the node's machine."""

    detail: str
    identity: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """The node is not proven empty (a pod, a Slurm job, Slurm silent): nothing was done,
    and the node must be drained again before the act is asked for again."""

    detail: str


@dataclass(frozen=True, slots=True)
class Held:
    """Nothing was done for a reason that is not the node's work (the lease, the rails, a
    record the controller cannot trust, a concurrent writer): ask again later."""

    detail: str


@dataclass(frozen=True, slots=True)
class Stale:
    """The record no longer asks for this act (the ladder moved on): nothing was done."""

    detail: str


Outcome = Done | Failed | Refused | Held | Stale
