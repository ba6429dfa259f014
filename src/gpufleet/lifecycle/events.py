"""Events about Nodes, Machines and the FleetPolicy: what the controller did, withheld or refused.

Events are the audit trail a person reads (``kubectl describe node``); they are
posted in the background, after the record is stored, and a failed post is only
logged: an Event never holds up or undoes a decision. The one exception is a
Notice (a held fault let go, dismissed or replaced): it is posted before the record
write that drops the fault, and without it the write waits (:meth:`EventSink.node_first`).
A repeat (same reason, object and message) counts on the first Event
(``kubeapi.events.EventRecorder``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.clock import Clock
from gpufleet.domain import well_known
from gpufleet.kubeapi import ApiError
from gpufleet.kubeapi.events import EventRecorder, event_body
from gpufleet.lifecycle import remediations
from gpufleet.lifecycle.core import Json, log
from gpufleet.lifecycle.tasks import TaskGroup

_MACHINE = ("Machine", f"{well_known.GROUP}/{well_known.VERSION}")
_POLICY = ("FleetPolicy", f"{well_known.GROUP}/{well_known.VERSION}")


class EventSink:
    """Posts core/v1 Events about the objects the controller looks after."""

    def __init__(
        self, recorder: EventRecorder, tasks: TaskGroup, *, namespace: str, clock: Clock
    ) -> None:
        self._recorder = recorder
        self._tasks = tasks
        self._namespace = namespace
        self._clock = clock

    def node(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about a Node."""
        self._post(body, ("Node", "v1"), type_, reason, message)

    async def node_first(
        self, body: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None:
        """An Event about a Node, posted now, before the write it speaks of; raises
        :class:`~gpufleet.kubeapi.ApiError` if it was not. For what must never be lost
        with a process killed after the write (a held fault let go: its Notice)."""
        await self._recorder.record(
            self._namespace, self._event(body, ("Node", "v1"), type_, reason, message)
        )

    def machine(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about a Machine."""
        self._post(body, _MACHINE, type_, reason, message)

    def policy(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about the FleetPolicy."""
        self._post(body, _POLICY, type_, reason, message)

    def _post(
        self,
        body: Mapping[str, Any],
        kind: tuple[str, str],
        type_: str,
        reason: str,
        message: str,
    ) -> None:
        self._tasks.spawn(self._send(self._event(body, kind, type_, reason, message)), "event")

    def _event(
        self,
        body: Mapping[str, Any],
        kind: tuple[str, str],
        type_: str,
        reason: str,
        message: str,
    ) -> Json:
        meta = body.get("metadata", {})
        return event_body(
            involved={
                "apiVersion": kind[1],
                "kind": kind[0],
                "name": meta.get("name"),
                "uid": meta.get("uid"),
            },
            type_=type_,
            reason=reason,
            message=message,
            component=well_known.CONTROLLER,
            instance=well_known.CONTROLLER,
            namespace=self._namespace,
            first=str(remediations.iso(self._clock.now())),
        )

    async def _send(self, event: Json) -> None:
        try:
            await self._recorder.record(self._namespace, event)
        except ApiError as exc:
            log.warning("event not posted: %s", exc)
