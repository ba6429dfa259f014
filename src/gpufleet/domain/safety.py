"""Safety rails: disruption budget, circuit breaker, rate limit.

Each rail is a small pure function over explicit state, so the controller
can keep that state in Kubernetes (FleetPolicy status) and the simulator in
memory, and both get the same answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from gpufleet.domain.policy import Breaker, Budget, RateLimit


class Hold(StrEnum):
    """Why a decision was not carried out."""

    PAUSED = "paused"
    DRY_RUN = "dry-run"
    BREAKER_OPEN = "breaker-open"
    BUDGET_EXHAUSTED = "budget-exhausted"
    RATE_LIMITED = "rate-limited"


@dataclass(frozen=True, slots=True)
class BreakerState:
    """The circuit breaker: recent faulting nodes and whether it is open."""

    recent: tuple[tuple[float, str], ...] = ()
    """(time, node) of the latest node-isolating fault of each node in the window."""
    tripped_at: float | None = None
    last_fault_at: float | None = None

    @property
    def is_open(self) -> bool:
        """Open means: no new automatic disruption."""
        return self.tripped_at is not None

    def faulting_nodes(self) -> int:
        """Distinct nodes in the window."""
        return len(self.recent)


def _prune(
    recent: Iterable[tuple[float, str]], now: float, window: float
) -> tuple[tuple[float, str], ...]:
    return tuple((t, n) for t, n in recent if now - t < window)


def breaker_observe(
    state: BreakerState, *, node: str, now: float, config: Breaker, fleet_size: int
) -> BreakerState:
    """Record a node-isolating fault; trip when the window holds too many nodes."""
    recent = tuple((t, n) for t, n in _prune(state.recent, now, config.window_seconds) if n != node)
    recent = (*recent, (now, node))
    tripped = state.tripped_at
    if tripped is None and len(recent) > config.threshold(fleet_size):
        tripped = now
    return BreakerState(recent=recent, tripped_at=tripped, last_fault_at=now)


def breaker_refresh(
    state: BreakerState, *, now: float, config: Breaker, fleet_size: int
) -> BreakerState:
    """Forget old faults; close an open breaker after a quiet cooldown."""
    recent = _prune(state.recent, now, config.window_seconds)
    tripped = state.tripped_at
    if (
        tripped is not None
        and state.last_fault_at is not None
        and now - state.last_fault_at >= config.cooldown_seconds
        and len(recent) <= config.threshold(fleet_size)
    ):
        tripped = None
    if recent == state.recent and tripped == state.tripped_at:
        return state
    return replace(state, recent=recent, tripped_at=tripped)


def breaker_reset(state: BreakerState) -> BreakerState:
    """Close the breaker by hand (an operator looked and it was a monitoring bug).

    The window is emptied too: kept, the next fault would trip it again at once.
    """
    return BreakerState(last_fault_at=state.last_fault_at)


def breaker_reset_refusal(state: BreakerState, *, requested_at: float) -> str | None:
    """Why an operator's reset, asked at ``requested_at``, must not be applied (or None).

    A reset answers the trip the operator looked at. One that tripped after the
    request (a request left behind by a controller restart, say) has not been
    looked at, so it stays open until someone resets it again.
    """
    if not state.is_open:
        return None
    assert state.tripped_at is not None
    if state.tripped_at > requested_at:
        return (
            f"the breaker tripped again at {state.tripped_at:.0f}, after this reset was asked "
            f"({requested_at:.0f}): look again and reset it again"
        )
    return None


def budget_allows(
    *,
    out_of_service: int,
    pool_size: int,
    config: Budget,
    fleet_out_of_service: int = 0,
    fleet_size: int = 0,
) -> bool:
    """Whether one more node of this pool may be taken out: within the pool's budget and,
    when the policy sets one, within the fleet's (every pool's nodes out, together)."""
    if out_of_service + 1 > config.allowed(pool_size):
        return False
    fleet = config.fleet_allowed(fleet_size)
    return fleet is None or fleet_out_of_service + 1 <= fleet


def rate_allows(recent_actions: Iterable[float], *, now: float, config: RateLimit) -> bool:
    """Whether one more disruptive action fits in the rate limit."""
    in_window = sum(1 for t in recent_actions if now - t < config.window_seconds)
    return in_window < config.max_actions


def prune_actions(
    recent_actions: Iterable[float], *, now: float, config: RateLimit
) -> tuple[float, ...]:
    """Drop action times that fell out of the rate-limit window."""
    return tuple(t for t in recent_actions if now - t < config.window_seconds)
