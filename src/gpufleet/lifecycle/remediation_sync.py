"""The NodeRemediation object: a read-only copy of a node's incident for people and tools.

It is written after the Node (the record on the Node is the truth); a failed
write is logged and made again by the next decision that changes the incident.
Objects are built by :mod:`gpufleet.lifecycle.remediations`.
"""

from __future__ import annotations

import asyncio

from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.kubeapi import ApiError, Conflict, custom
from gpufleet.lifecycle import crds, remediations
from gpufleet.lifecycle.core import ControllerCore, S, log

_REMEDIATIONS = custom(crds.NODE_REMEDIATION_PLURAL)


class RemediationSync(ControllerCore):
    """Creates and updates one NodeRemediation per incident."""

    async def _sync_remediation(self, record: NodeRecord, incident: Incident, now: float) -> None:
        name = remediations.name_for(record.name, incident)
        lock = self._nrem_locks.setdefault(name, asyncio.Lock())
        async with lock:
            current = record.incident if record.incident is not None else incident
            try:
                await self.client.create(
                    _REMEDIATIONS,
                    remediations.manifest(record.name, current, self.policy),
                )
            except Conflict:
                pass
            except ApiError as exc:
                log.warning("node=%s NodeRemediation %s not created: %s", record.name, name, exc)
                return
            status = remediations.status(record, current, now)
            try:
                await self.client.patch(_REMEDIATIONS, name, {"status": status}, status=True)
            except ApiError as exc:
                log.warning(
                    "node=%s NodeRemediation %s status not written: %s", record.name, name, exc
                )
            if record.state in (S.PRODUCTION, S.TRIAGE, S.RMA):
                self._nrem_locks.pop(name, None)
