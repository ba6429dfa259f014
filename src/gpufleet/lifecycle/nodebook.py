"""The Nodes as this controller last saw them, and one lock per node.

The book is a cache of the Node watch and of the controller's own writes; it
decides nothing. A node's lock serialises its passes (a watch event, a fed
result, a tick), so two decisions about one node never interleave. Who writes
a node's record is not decided here: only the node pass holds the signer
(:mod:`gpufleet.lifecycle.reconcile`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

Json = dict[str, Any]


class NodeBook:
    """Node bodies by name (last seen) and a lock per node."""

    def __init__(self) -> None:
        self._bodies: dict[str, Json] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def get(self, name: str) -> Json | None:
        return self._bodies.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._bodies

    def put(self, name: str, body: Json) -> None:
        self._bodies[name] = body

    def forget(self, name: str) -> None:
        self._bodies.pop(name, None)

    def items(self) -> Iterator[tuple[str, Json]]:
        return iter(list(self._bodies.items()))

    def labels(self, name: str) -> Mapping[str, str]:
        return ((self._bodies.get(name) or {}).get("metadata") or {}).get("labels") or {}

    def annotations(self, name: str) -> Mapping[str, str]:
        return ((self._bodies.get(name) or {}).get("metadata") or {}).get("annotations") or {}

    def lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock
