"""Asking for a node's RMA ticket to be closed: the ``gpufleet machines rearm`` side.

The CLI does not call the ticket webhook itself (it may not reach it, and a call
lost with the CLI's process would leave the ticket open for good): it writes the
request ``gpufleet.io/rma-close`` on the Machine's Node, and the lifecycle
controller closes the ticket, retrying until the receiver acknowledges it, and
removes the request (``gpufleet.lifecycle.tickets``; docs/decisions/0109).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.domain import rma, well_known
from gpufleet.kubeapi.errors import NotFound
from gpufleet.kubeapi.port import KubePort
from gpufleet.kubeapi.resources import NODES, Json


async def node_of_machine(kube: KubePort, machine: Mapping[str, Any]) -> Json | None:
    """The Node the Machine became: its label ``gpufleet.io/machine``, else the Machine's
    ``status.node``; None when it has not joined (or its Node is gone)."""
    name = str(machine.get("metadata", {}).get("name", ""))
    found = await kube.list(NODES, label_selector=f"{well_known.LABEL_MACHINE}={name}")
    if len(found.items) == 1:
        return found.items[0]
    node = (machine.get("status") or {}).get("node")
    if not node:
        return None
    try:
        return await kube.get(NODES, str(node))
    except NotFound:
        return None


async def request_close(
    kube: KubePort, machine: Mapping[str, Any], *, by: str, reason: str, now: float
) -> tuple[str, str] | None:
    """Ask for the ticket of the Machine's Node to be closed: ``(node, ticket key)``, or
    None when there is no ticket to close (no Node, no ticket, closed already)."""
    node = await node_of_machine(kube, machine)
    if node is None:
        return None
    ann = node.get("metadata", {}).get("annotations") or {}
    ticket = rma.decode_ticket(ann.get(well_known.ANNOTATION_RMA_TICKET))
    if ticket is None or ticket.state in (rma.TicketState.CLOSING, rma.TicketState.CLOSED):
        return None
    name = str(node["metadata"]["name"])
    request = rma.encode_close(rma.CloseRequest(by=by, reason=reason, at=now))
    patch = {"metadata": {"annotations": {well_known.ANNOTATION_RMA_CLOSE: request}}}
    await kube.patch(NODES, name, patch)
    return name, ticket.key
