"""The controller's side of BMC steps: identity inputs, the write-ahead mark, one run per node.

:mod:`gpufleet.remediate.steps` carries a step out; what it needs from
Kubernetes is here:

- :func:`expected_identity`: what the cluster knows about the node's machine
  (its Machine's serial and BMC endpoint, the kubelet's system UUID);
- :class:`NodeJournal`: the write-ahead mark stored on the Node
  (``gpufleet.io/bmc-action``) before each reset POST;
- :func:`current_attempt`: the BMC attempt a record says is in progress;
- :class:`Runs`: which attempts this process is running, so one node's step
  never has two tasks, and a result the apiserver did not take is kept until
  it is recorded;
- :func:`mismatch_condition`: the ``GpufleetBmcMismatch`` Node condition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain import events as ev
from gpufleet.domain import well_known
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.kubeapi import NODES, ApiError, KubePort, NotFound, Patch
from gpufleet.kubeapi.machines import MACHINES
from gpufleet.lifecycle import remediations
from gpufleet.remediate import steps
from gpufleet.remediate.evidence import ActionMark
from gpufleet.remediate.identity import ExpectedIdentity

log = logging.getLogger("gpufleet.controller")

Json = dict[str, Any]


def current_attempt(record: NodeRecord) -> steps.Attempt | None:
    """The BMC step attempt in progress on this record, or None."""
    inc = record.incident
    if record.state is not NodeState.REMEDIATING or inc is None or not inc.tried:
        return None
    last = inc.tried[-1]
    if inc.current not in steps.BMC_STEPS or last.step != inc.current or last.ended_at is not None:
        return None
    return steps.Attempt(last.step, last.attempt, last.started_at)


def mark_text(body: Mapping[str, Any]) -> str | None:
    """The raw write-ahead mark on a Node, if any."""
    ann = body.get("metadata", {}).get("annotations") or {}
    text = ann.get(well_known.ANNOTATION_BMC_ACTION)
    return str(text) if text else None


@dataclass
class NodeJournal:
    """Stores the write-ahead mark on the Node; raises if the apiserver did not take it."""

    client: KubePort
    node: str

    async def write(self, mark: ActionMark) -> None:
        patch = {"metadata": {"annotations": {well_known.ANNOTATION_BMC_ACTION: mark.to_json()}}}
        await self.client.patch(NODES, self.node, patch)
        log.info(
            "node=%s bmc-action %s attempt %d: %s posting",
            self.node,
            mark.step,
            mark.attempt,
            mark.reset_type,
        )

    async def clear(self, attempt: steps.Attempt) -> None:
        """Remove the mark once the attempt's result is recorded (best effort)."""
        try:
            body = await self.client.get(NODES, self.node)
        except ApiError:
            return
        mark = ActionMark.from_json(mark_text(body))
        if mark is None or not mark.binds(attempt.step.value, attempt.attempt, attempt.started_at):
            return
        patch = {
            "metadata": {
                "resourceVersion": body["metadata"].get("resourceVersion"),
                "annotations": {well_known.ANNOTATION_BMC_ACTION: None},
            }
        }
        try:
            await self.client.patch(NODES, self.node, patch)
        except ApiError as exc:
            log.debug("node=%s bmc-action mark kept: %s", self.node, exc)


async def expected_identity(
    client: KubePort, body: Mapping[str, Any], endpoint: str
) -> ExpectedIdentity:
    """What the node's BMC must say about itself. A Machine that cannot be read
    makes the identity unverifiable (``machine_error``): no power action."""
    node = str(body["metadata"]["name"])
    labels = body.get("metadata", {}).get("labels") or {}
    machine = labels.get(well_known.LABEL_MACHINE)
    system_uuid = str((body.get("status", {}).get("nodeInfo") or {}).get("systemUUID") or "")
    base = ExpectedIdentity(node=node, endpoint=endpoint, system_uuid=system_uuid or None)
    if not machine:
        return base
    try:
        obj = await client.get(MACHINES, str(machine))
    except NotFound:
        return _with(base, machine, error=f"the Node names Machine {machine}, which does not exist")
    except ApiError as exc:
        return _with(base, machine, error=f"Machine {machine} could not be read: {exc}")
    spec = obj.get("spec") or {}
    return ExpectedIdentity(
        node=node,
        machine=str(machine),
        serial=str(spec.get("serial") or "") or None,
        machine_endpoint=str((spec.get("bmc") or {}).get("endpoint") or "") or None,
        endpoint=endpoint,
        system_uuid=system_uuid or None,
    )


def _with(base: ExpectedIdentity, machine: str, *, error: str) -> ExpectedIdentity:
    return ExpectedIdentity(
        node=base.node,
        machine=machine,
        machine_error=error,
        endpoint=base.endpoint,
        system_uuid=base.system_uuid,
    )


async def mismatch_condition(
    client: KubePort, body: Mapping[str, Any], *, mismatch: bool, message: str, now: float
) -> None:
    """Set ``GpufleetBmcMismatch`` (True: not verified, False: verified again).

    Written only when it changes, so a verified BMC costs no write per step.
    """
    node = str(body["metadata"]["name"])
    conds = body.get("status", {}).get("conditions") or []
    current = next((c for c in conds if c.get("type") == well_known.CONDITION_BMC_MISMATCH), None)
    status = "True" if mismatch else "False"
    if current is None and not mismatch:
        return
    if current is not None and current.get("status") == status and not mismatch:
        return
    stamp = remediations.iso(now)
    cond = {
        "type": well_known.CONDITION_BMC_MISMATCH,
        "status": status,
        "reason": "IdentityMismatch" if mismatch else "IdentityVerified",
        "message": message[:1000],
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": (
            current.get("lastTransitionTime", stamp)
            if current is not None and current.get("status") == status
            else stamp
        ),
    }
    try:
        await client.patch(
            NODES, node, {"status": {"conditions": [cond]}}, status=True, kind=Patch.STRATEGIC
        )
    except ApiError as exc:
        log.warning("node=%s %s not written: %s", node, well_known.CONDITION_BMC_MISMATCH, exc)


@dataclass
class Runs:
    """BMC work of this process: one task per node at a time, each attempt claimed once.

    ``claimed`` holds ``(node, attempt)`` of every attempt a task was
    started for; ``results`` the outcome of an attempt whose result the
    apiserver has not taken yet (fed again by the tick, never re-run).
    """

    claimed: set[tuple[str, steps.Attempt]] = field(default_factory=set)
    results: dict[tuple[str, steps.Attempt], ev.StepCompleted] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def claim(self, node: str, attempt: steps.Attempt) -> bool:
        """Claim an attempt for a task; False if a task of this process has it already."""
        key = (node, attempt)
        if key in self.claimed:
            return False
        self.claimed.add(key)
        return True

    def release(self, node: str, attempt: steps.Attempt) -> None:
        self.claimed.discard((node, attempt))

    def lock(self, node: str) -> asyncio.Lock:
        """Held while a node's BMC is being driven: a second attempt waits for the first."""
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock

    def forget(self, node: str) -> None:
        """A deleted Node: nothing of its attempts is kept."""
        for key in [k for k in self.results if k[0] == node]:
            del self.results[key]
