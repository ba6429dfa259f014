"""The NodeRemediation object: a read-only copy of a node's incident for people and tools.

It is written after the Node (the record on the Node is the truth); a failed
write is logged and made again by the next decision that changes the incident.
An object this process created (or found) is not created again, and a status
equal to the one it last wrote is not written again: an incident costs one
create and one status write per change people can see.
Objects are built by :mod:`gpufleet.lifecycle.remediations`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpufleet.domain import policy_groups
from gpufleet.domain.policy import Policy
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.kubeapi import ApiError, Conflict, NotFound, custom
from gpufleet.lifecycle import crds, remediations
from gpufleet.lifecycle.core import Json, S, log
from gpufleet.lifecycle.ports import WritePort

_REMEDIATIONS = custom(crds.NODE_REMEDIATION_PLURAL)


class RemediationSync:
    """Creates and updates one NodeRemediation per incident."""

    def __init__(self, client: WritePort, *, policy: Callable[[], Policy]) -> None:
        self.client = client
        self.current_policy = policy
        self._nrem_locks: dict[str, asyncio.Lock] = {}
        self._nrem_written: dict[str, Json] = {}
        """Per open NodeRemediation: the status last written (it exists; an equal status
        is not written again)."""

    async def sync(self, record: NodeRecord, incident: Incident, now: float) -> None:
        name = remediations.name_for(record.name, incident)
        lock = self._nrem_locks.setdefault(name, asyncio.Lock())
        async with lock:
            current = record.incident if record.incident is not None else incident
            written = self._nrem_written.get(name)
            if written is None:
                try:
                    await self.client.create(
                        _REMEDIATIONS,
                        remediations.manifest(
                            record.name,
                            current,
                            policy_groups.for_group(self.current_policy(), record.group),
                        ),
                    )
                except Conflict:
                    pass
                except ApiError as exc:
                    log.warning(
                        "node=%s NodeRemediation %s not created: %s", record.name, name, exc
                    )
                    return
            status = remediations.status(record, current, now)
            if status != written:
                try:
                    await self.client.patch(_REMEDIATIONS, name, {"status": status}, status=True)
                    self._nrem_written[name] = status
                except NotFound:
                    self._nrem_written.pop(name, None)  # deleted meanwhile: created again
                except ApiError as exc:
                    self._nrem_written[name] = {}  # it exists; the status is written again
                    log.warning(
                        "node=%s NodeRemediation %s status not written: %s", record.name, name, exc
                    )
            if record.state in (S.PRODUCTION, S.TRIAGE, S.RMA):
                self._nrem_locks.pop(name, None)
                self._nrem_written.pop(name, None)
