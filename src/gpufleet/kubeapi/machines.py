"""Machine operations that two products perform: re-arm and token revocation.

The lifecycle controller re-arms a Machine before a reimage; the provisioning
service re-arms on an operator's request. Both arm the Machine's status
(:func:`gpufleet.domain.enrollment.rearm_status`) and delete the previous
boot's join token, so a token is never usable twice.
"""

from __future__ import annotations

import contextlib

from gpufleet.domain import enrollment, well_known
from gpufleet.kubeapi.errors import NotFound
from gpufleet.kubeapi.port import KubePort
from gpufleet.kubeapi.resources import SECRETS, Json, custom

MACHINES = custom(well_known.MACHINE_PLURAL)
TOKEN_NAMESPACE = "kube-system"
"""Where bootstrap-token Secrets live (the apiserver reads them only there)."""


async def revoke_token(kube: KubePort, token_id: str) -> bool:
    """Delete the join token's Secret; False when it was gone already."""
    with contextlib.suppress(NotFound):
        await kube.delete(SECRETS, enrollment.secret_name(token_id), namespace=TOKEN_NAMESPACE)
        return True
    return False


async def rearm(kube: KubePort, name: str, *, by: str, reason: str, now: float) -> Json:
    """Arm the Machine for its next boot and revoke the previous boot's token.

    Returns the Machine as it was read. Raises the port's errors: a Machine that
    cannot be re-armed must stop the caller (its next boot could not join).
    """
    machine = await kube.get(MACHINES, name)
    await kube.patch(
        MACHINES,
        name,
        {"status": enrollment.rearm_status(by=by, at=now, reason=reason)},
        status=True,
    )
    old = (machine.get("status") or {}).get("tokenId")
    if old:
        await revoke_token(kube, str(old))
    return machine
