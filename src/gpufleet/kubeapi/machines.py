"""Machine operations that two products perform: re-arm and token revocation.

The lifecycle controller re-arms a Machine before a reimage; the provisioning
service re-arms on an operator's request. Both arm the Machine's status
(:func:`gpufleet.domain.enrollment.rearm_status`) and delete the previous
boot's join token, so a token is never usable twice.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from gpufleet.domain import enrollment, well_known
from gpufleet.kubeapi.errors import ApiError, NotFound
from gpufleet.kubeapi.events import event_body
from gpufleet.kubeapi.port import KubePort
from gpufleet.kubeapi.resources import SECRETS, Json, custom
from gpufleet.kubeapi.secrets import decode_data

MACHINES = custom(well_known.MACHINE_PLURAL)
EVENT_NAMESPACE = "default"
"""Where Events about Machines (cluster-scoped) go, as the provisioning service's."""
log = logging.getLogger("gpufleet.machines")
TOKEN_NAMESPACE = "kube-system"
"""Where bootstrap-token Secrets live (the apiserver reads them only there)."""


async def revoke_token(kube: KubePort, token_id: str) -> bool:
    """Delete the join token's Secret; False when it was gone already."""
    with contextlib.suppress(NotFound):
        await kube.delete(SECRETS, enrollment.secret_name(token_id), namespace=TOKEN_NAMESPACE)
        return True
    return False


async def rearm(
    kube: KubePort,
    name: str,
    *,
    by: str,
    reason: str,
    now: float,
    extra: Mapping[str, object] | None = None,
) -> Json:
    """Arm the Machine for its next boot and revoke the previous boot's token.

    ``extra`` joins the same status patch (a power-on records its boot with the
    re-arm: one write). Returns the Machine as it was read. Raises the port's
    errors: a Machine that cannot be re-armed must stop the caller (its next boot
    could not join).
    """
    machine = await kube.get(MACHINES, name)
    await kube.patch(
        MACHINES,
        name,
        {"status": {**enrollment.rearm_status(by=by, at=now, reason=reason), **(extra or {})}},
        status=True,
    )
    old = (machine.get("status") or {}).get("tokenId")
    if old:
        await revoke_token(kube, str(old))
    return machine


class MachineStore:
    """Machines and their BMC Secrets through the port, for the power-on sequence
    (:class:`gpufleet.remediate.machine_power.MachineStore`)."""

    def __init__(self, kube: KubePort) -> None:
        self.kube = kube

    async def machine(self, name: str) -> Json:
        return await self.kube.get(MACHINES, name)

    async def secret(self, namespace: str, name: str) -> dict[str, str]:
        return decode_data(await self.kube.get(SECRETS, name, namespace=namespace))

    async def record_boot(
        self, name: str, *, by: str, reason: str, now: float, status: Mapping[str, Any]
    ) -> None:
        await rearm(self.kube, name, by=by, reason=reason, now=now, extra=status)

    async def refused(self, name: str, *, reason: str, message: str, now: float) -> None:
        """A Warning Event on the Machine (best effort: the refusal stands without it)."""
        body = event_body(
            involved={
                "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
                "kind": "Machine",
                "name": name,
            },
            type_="Warning",
            reason=reason,
            message=message,
            component="gpufleet-machines",
            instance="gpufleet-machines",
            namespace=EVENT_NAMESPACE,
            first=enrollment.rfc3339(now),
        )
        try:
            await self.kube.create_event(EVENT_NAMESPACE, body)
        except ApiError as exc:
            log.warning("machine=%s %s Event not posted: %s", name, reason, exc)
