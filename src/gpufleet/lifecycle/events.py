"""Events about Nodes and the FleetPolicy: what the controller did, withheld or refused, and why.

Events are the audit trail a person reads (``kubectl describe node``); they are
posted in the background, after the record is stored, and a failed post is only
logged: an Event never holds up or undoes a decision. A repeat (same reason,
object and message) counts on the first Event (``kubeapi.events.EventRecorder``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.domain import well_known
from gpufleet.kubeapi import ApiError
from gpufleet.kubeapi.events import event_body
from gpufleet.lifecycle import remediations
from gpufleet.lifecycle.core import ControllerCore, Json, log


class Events(ControllerCore):
    """Posts core/v1 Events; the other concepts call ``_event`` and ``_policy_event``."""

    def _event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self._post(body, ("Node", "v1"), type_, reason, message)

    def _post(
        self,
        body: Mapping[str, Any],
        kind: tuple[str, str],
        type_: str,
        reason: str,
        message: str,
    ) -> None:
        """A core/v1 Event about ``body`` (Node, Machine, FleetPolicy), posted in the background."""
        meta = body.get("metadata", {})
        event = event_body(
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
            namespace=self.settings.event_namespace,
            first=str(remediations.iso(self.clock.now())),
        )
        self._spawn(self._post_event(event), "event")

    async def _post_event(self, event: Json) -> None:
        try:
            await self.event_recorder.record(self.settings.event_namespace, event)
        except ApiError as exc:
            log.warning("event not posted: %s", exc)

    def _policy_event(self, body: Mapping[str, Any], type_: str, reason: str, msg: str) -> None:
        kind = ("FleetPolicy", f"{well_known.GROUP}/{well_known.VERSION}")
        self._post(body, kind, type_, reason, msg)

    def _machine_event(self, body: Mapping[str, Any], type_: str, reason: str, msg: str) -> None:
        kind = ("Machine", f"{well_known.GROUP}/{well_known.VERSION}")
        self._post(body, kind, type_, reason, msg)
