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

from gpufleet.domain import well_known

Json = dict[str, Any]


class NodeBook:
    """Node bodies by name (last seen) and a lock per node."""

    def __init__(self) -> None:
        self._bodies: dict[str, Json] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._marked: dict[str, None] = {}
        """Names whose Node carries a BMC action mark (an ordered set): a mark left by
        an attempt that ended is swept whatever state the node is in now."""

    def get(self, name: str) -> Json | None:
        return self._bodies.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._bodies

    def put(self, name: str, body: Json) -> None:
        self._bodies[name] = body
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        if well_known.ANNOTATION_BMC_ACTION in annotations:
            self._marked[name] = None
        else:
            self._marked.pop(name, None)

    def forget(self, name: str) -> None:
        self._bodies.pop(name, None)
        self._marked.pop(name, None)

    def marked(self) -> list[str]:
        """The nodes whose Node carries a BMC action mark, as last seen."""
        return list(self._marked)

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
