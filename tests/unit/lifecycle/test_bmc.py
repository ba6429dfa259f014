"""The controller's side of BMC steps: which attempt is in progress, one task per attempt,
what the Node's Machine says the BMC must be."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import Incident, NodeRecord, Outcome, StepAttempt
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle import bmc
from gpufleet.remediate import steps

from .fakes import FakeKube


def _record(state: NodeState, current: Step | None, *tried: StepAttempt) -> NodeRecord:
    inc = Incident(
        key="xid-79", description="x", opened_at=1.0, plan=Step.REBOOT, current=current, tried=tried
    )
    return NodeRecord(name="n1", state=state, since=1.0, reason="r", incident=inc)


def test_the_attempt_in_progress_is_the_last_one_without_a_result() -> None:
    att = StepAttempt(Step.POWER_CYCLE, 2, 50.0)
    rec = _record(NodeState.REMEDIATING, Step.POWER_CYCLE, StepAttempt(Step.REBOOT, 1, 10.0), att)
    assert bmc.current_attempt(rec) == steps.Attempt(Step.POWER_CYCLE, 2, 50.0)
    done = StepAttempt(Step.POWER_CYCLE, 2, 50.0, ended_at=60.0, outcome=Outcome.SUCCEEDED)
    assert bmc.current_attempt(_record(NodeState.REMEDIATING, Step.POWER_CYCLE, done)) is None
    gpu = StepAttempt(Step.GPU_RESET, 1, 5.0)
    assert bmc.current_attempt(_record(NodeState.REMEDIATING, Step.GPU_RESET, gpu)) is None
    assert bmc.current_attempt(_record(NodeState.VERIFYING, None, att)) is None


def test_an_attempt_is_claimed_once() -> None:
    runs = bmc.Runs()
    a = steps.Attempt(Step.REBOOT, 1, 10.0)
    b = steps.Attempt(Step.POWER_CYCLE, 1, 10.0)  # same instant, another attempt
    assert runs.claim("n1", a) and not runs.claim("n1", a)
    assert runs.claim("n1", b)
    runs.release("n1", a)
    assert runs.claim("n1", a)


def _machines(machines: dict[str, Any]) -> FakeKube:
    kube = FakeKube()
    for name, body in machines.items():
        kube.custom[(well_known.MACHINE_PLURAL, name)] = body
    return kube


def _node(machine: str | None = None, uuid: str = "") -> dict[str, Any]:
    labels = {well_known.LABEL_MACHINE: machine} if machine else {}
    return {
        "metadata": {"name": "n1", "labels": labels},
        "status": {"nodeInfo": {"systemUUID": uuid}},
    }


def test_expected_identity_comes_from_the_machine_and_the_kubelet() -> None:
    machine = {"spec": {"serial": "SN-9", "bmc": {"endpoint": "https://bmc-9"}}}
    client = _machines({"m9": machine})
    got = asyncio.run(bmc.expected_identity(client, _node("m9", "u-1"), "https://bmc-9"))
    assert (got.machine, got.serial, got.machine_endpoint, got.system_uuid) == (
        "m9",
        "SN-9",
        "https://bmc-9",
        "u-1",
    )
    missing = asyncio.run(bmc.expected_identity(client, _node("gone"), "https://x"))
    assert missing.machine_error is not None and "gone" in missing.machine_error
    plain = asyncio.run(bmc.expected_identity(client, _node(), "https://x"))
    assert plain.machine is None and plain.system_uuid is None
