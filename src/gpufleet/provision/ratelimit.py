"""Token buckets per requester and per MAC: a flood from one address or for one
machine is refused (HTTP 429) before it costs an apiserver request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    rate: float
    """Requests per second, sustained."""
    burst: int
    """Requests allowed at once."""


class Buckets:
    """One token bucket per key; keys unused for a while are forgotten."""

    def __init__(self, limit: Limit, clock: Callable[[], float], max_keys: int = 100_000) -> None:
        self.limit = limit
        self._clock = clock
        self._state: dict[str, tuple[float, float]] = {}
        self._max_keys = max_keys

    def allow(self, key: str) -> bool:
        now = self._clock()
        tokens, last = self._state.get(key, (float(self.limit.burst), now))
        tokens = min(float(self.limit.burst), tokens + (now - last) * self.limit.rate)
        if len(self._state) >= self._max_keys and key not in self._state:
            self._forget_full(now)
        if tokens < 1.0:
            self._state[key] = (tokens, now)
            return False
        self._state[key] = (tokens - 1.0, now)
        return True

    def _forget_full(self, now: float) -> None:
        refill = self.limit.burst / self.limit.rate if self.limit.rate > 0 else float("inf")
        self._state = {k: v for k, v in self._state.items() if now - v[1] < refill}
