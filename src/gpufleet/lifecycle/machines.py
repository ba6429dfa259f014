"""The lifecycle controller's side of Day 0: a joining Node meets its Machine.

A Node that registers in ``provisioning`` names its Machine (label
``gpufleet.io/machine``, from the cloud-init provisioning served). Once the
Node is Ready and its agent has reported the hardware it sees (annotation
``gpufleet.io/hardware``, :mod:`gpufleet.domain.node_reports`),
:func:`registration` compares that with the Machine's inventory
(:func:`gpufleet.domain.inventory.differences`): a match is ``Registered``
(burn-in next), a difference ``InventoryMismatch`` with the differences in
words (triage). It also revokes the boot's join token (the node has used it;
single use) and records the Node in the Machine's status. A reimaged machine
rejoins its existing Node (past ``provisioning``): :func:`revoke_rejoined_token`
revokes that boot's token once the Node is Ready again.
Until the agent has reported, nothing is decided (fail closed).

A Node without the label joined some other way (an admin's kubeadm token, an
adopted fleet): it is registered as before, unchecked, and the Event says so.

:func:`rearm_for_reimage` is the reimage step's part: the machine's next
(network) boot may get a new token (:func:`gpufleet.kubeapi.machines.rearm`,
the same re-arm the provisioning service does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.api import conditions
from gpufleet.domain import events as ev
from gpufleet.domain import inventory, node_reports, well_known
from gpufleet.kubeapi import ApiError, KubePort, NotFound
from gpufleet.kubeapi import machines as kube_machines
from gpufleet.kubeapi.machines import MACHINES

log = logging.getLogger("gpufleet.controller")


@dataclass(frozen=True)
class Registration:
    """What a joining Node's registration decides, and what to add to its patch."""

    event: ev.Registered | ev.InventoryMismatch
    annotations: dict[str, str] = field(default_factory=dict)


def machine_of(body: Mapping[str, Any]) -> str | None:
    labels = body.get("metadata", {}).get("labels") or {}
    value = labels.get(well_known.LABEL_MACHINE)
    return str(value) if value else None


def expected_of(machine: Mapping[str, Any]) -> inventory.Hardware | None:
    hw = (machine.get("spec") or {}).get("hardware") or {}
    try:
        return inventory.Hardware(str(hw["gpuModel"]), int(hw["gpuCount"]), int(hw["hcaCount"]))
    except (KeyError, TypeError, ValueError):
        return None


async def registration(
    client: KubePort, body: Mapping[str, Any], now: float = 0.0
) -> Registration | None:
    """The registration event for a Ready ``provisioning`` Node, or None to wait.

    ``now`` dates the Machine's ``HardwareMatches`` condition when it changes."""
    node = str(body["metadata"]["name"])
    name = machine_of(body)
    if name is None:
        return Registration(
            ev.Registered(
                detail="the node joined the cluster and is Ready "
                "(no Machine inventory: hardware not checked)"
            )
        )
    try:
        machine = await client.get(MACHINES, name)
    except NotFound:
        return Registration(
            ev.InventoryMismatch(detail=f"no Machine {name} (named by the Node's label)")
        )
    except ApiError as exc:
        log.warning("node=%s Machine %s not read, registration waits: %s", node, name, exc)
        return None
    expected = expected_of(machine)
    if expected is None:
        return Registration(
            ev.InventoryMismatch(detail=f"Machine {name} has no valid expected hardware")
        )
    observed = node_reports.hardware_of(body)
    if observed is None:
        return None  # the agent has not looked yet
    diffs = inventory.differences(expected, observed)
    status = machine.get("status") or {}
    generation = machine.get("metadata", {}).get("generation")
    await _record(client, node, name, status, observed, diffs, now, generation)
    annotations: dict[str, str] = {}
    ann = body.get("metadata", {}).get("annotations") or {}
    secret = ((machine.get("spec") or {}).get("bmc") or {}).get("credentialsSecret")
    if secret and well_known.ANNOTATION_BMC_SECRET not in ann:
        annotations[well_known.ANNOTATION_BMC_SECRET] = str(secret)
    if diffs:
        return Registration(ev.InventoryMismatch(detail=inventory.describe(diffs)), annotations)
    return Registration(
        ev.Registered(detail=f"joined as Machine {name}; hardware matches the inventory"),
        annotations,
    )


async def _record(
    client: KubePort,
    node: str,
    name: str,
    status: Mapping[str, Any],
    observed: inventory.Hardware,
    diffs: tuple[str, ...],
    now: float,
    generation: Any,
) -> None:
    """Machine status: which Node it became and what was found; revoke the used token."""
    patch = {
        "node": node,
        "phase": "Mismatch" if diffs else "Joined",
        "observed": inventory.encode(observed),
        "message": inventory.describe(diffs),
        "conditions": conditions.set_condition(
            status.get("conditions"),
            "HardwareMatches",
            "False" if diffs else "True",
            "Mismatch" if diffs else "Matches",
            inventory.describe(diffs) or "the hardware found is the inventory's",
            now=now,
            observed_generation=generation if isinstance(generation, int) else None,
        ),
    }
    try:
        await client.patch(MACHINES, name, {"status": patch}, status=True)
    except ApiError as exc:
        log.warning("node=%s Machine %s status not written: %s", node, name, exc)
    token = status.get("tokenId")
    if token and not status.get("armed"):
        await _delete_token(client, node, str(token))


async def _delete_token(client: KubePort, node: str, token_id: str) -> None:
    try:
        if await kube_machines.revoke_token(client, token_id):
            log.info("node=%s join token %s revoked (used)", node, token_id)
    except ApiError as exc:
        log.warning("node=%s join token %s not revoked: %s", node, token_id, exc)


def ready_since(body: Mapping[str, Any]) -> str | None:
    """When the Node last became Ready (its Ready condition's lastTransitionTime), if Ready."""
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return str(c.get("lastTransitionTime") or "") or None
    return None


def _instant(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


async def revoke_rejoined_token(client: KubePort, body: Mapping[str, Any]) -> bool:
    """Revoke the join token of a machine that booted again and rejoined under its old Node.

    :func:`registration` revokes the token of a first join (the Node registers in
    ``provisioning``); a reimaged machine rejoins its existing Node, which is past
    ``provisioning``, so nothing else would revoke the new token before it expires.
    The token counts as used when the Node became Ready after it was issued: the
    machine's kubelet could only have rejoined with it (the Machine is disarmed, so no
    later boot got another). Returns whether a token Secret was deleted; any doubt
    (no Machine, times unreadable, the apiserver failing) revokes nothing, and the
    token still expires on its own.
    """
    name = machine_of(body)
    since = _instant(ready_since(body))
    if name is None or since is None:
        return False
    node = str(body["metadata"]["name"])
    try:
        machine = await client.get(MACHINES, name)
    except ApiError as exc:
        log.warning("node=%s Machine %s not read, its join token is kept: %s", node, name, exc)
        return False
    status = machine.get("status") or {}
    token, issued = status.get("tokenId"), _instant(status.get("tokenIssuedAt"))
    if not token or status.get("armed") or issued is None or since < issued:
        return False
    try:
        revoked = await kube_machines.revoke_token(client, str(token))
    except ApiError as exc:
        log.warning("node=%s join token %s not revoked: %s", node, token, exc)
        return False
    if revoked:
        log.info("node=%s join token %s revoked (used by the rejoin)", node, token)
    return revoked


async def rearm_for_reimage(
    client: KubePort, body: Mapping[str, Any], now: float, *, image: str | None = None
) -> None:
    """Arm the Node's Machine so the reimage boot gets a new token (no-op without one).

    ``image``: the version the boot installs (a MaintenancePlan's), recorded in the
    Machine's ``status.image`` with the re-arm, which the provisioning service serves;
    None keeps the version the machine has.

    Raises :class:`~gpufleet.kubeapi.ApiError` if the Machine could not be
    re-armed: the reimage would boot a machine that cannot join, so the step
    fails instead (the ladder retries or escalates).
    """
    name = machine_of(body)
    if name is None:
        return
    node = str(body["metadata"]["name"])
    await kube_machines.rearm(
        client,
        name,
        by=well_known.CONTROLLER,
        reason=f"reimage of {node}" + (f" to image {image}" if image else ""),
        now=now,
        extra={"image": image} if image else None,
    )
    log.info(
        "node=%s Machine %s re-armed for the reimage boot (image %s)",
        node,
        name,
        image or "unchanged",
    )
