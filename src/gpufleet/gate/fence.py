"""Whether this process may act now: the controller's lease, as the gate sees it.

The lifecycle controller holds a Kubernetes Lease (:mod:`gpufleet.lifecycle.leadership`)
and acts only while it does. The gate asks the fence right before each write
and each POST, with a margin: a replica whose lease could run out while its
request is in flight does not send it, so a replica that takes over after the
lease expired never overlaps with an act of the one before (docs/decisions/0141).
"""

from __future__ import annotations

from typing import Protocol


class Fence(Protocol):
    """This process's right to act."""

    @property
    def holder(self) -> str:
        """Who acts (the lease holder's identity, or a person for an operator's command)."""
        ...

    @property
    def epoch(self) -> int:
        """Changes with every new holder (the Lease's ``leaseTransitions``)."""
        ...

    def holds(self, margin_s: float) -> bool:
        """Whether this process may act now and will still for ``margin_s`` seconds."""
        ...


class StaticFence:
    """A fence that always holds (or never): an operator's own command, and tests."""

    def __init__(self, holder: str, *, holding: bool = True, epoch: int = 0) -> None:
        self._holder = holder
        self._holding = holding
        self._epoch = epoch

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def epoch(self) -> int:
        return self._epoch

    def holds(self, margin_s: float) -> bool:
        return self._holding
