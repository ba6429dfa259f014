"""The controller holds a node group's budget: Nodes grouped by their labels from the first
load (prime), a burst on the group takes out only its budget though the pool has room; a
node's NodeRemediation shows its group's ladder."""

from __future__ import annotations

import asyncio
import json

from gpufleet.clock import ManualClock
from gpufleet.domain import conditions
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.policy import Policy, load_policy
from gpufleet.lifecycle.controller import ControllerSettings

from .fakes import FakeKube, controller, k8s_policy, node, set_condition

RACK = "example.com/rack"


def _policy() -> Policy:
    spec = k8s_policy().model_dump(by_alias=True, mode="json")
    spec["safety"]["budget"] = {"maxNodes": 10, "maxPercent": 100, "minNodes": 1}
    spec["safety"]["breaker"].update(minNodes=10)
    spec["overrides"] = [
        {
            "name": "rack-a",
            "nodeSelector": {"matchLabels": {RACK: "a"}},
            "budget": {"maxNodes": 1},
            "ladder": [{"step": "gpu-reset"}, {"step": "reboot"}, {"step": "reimage"}],
        }
    ]
    return load_policy(json.dumps(spec))


def test_a_burst_on_a_group_takes_out_only_its_budget() -> None:
    async def go() -> dict[str, str]:
        kube = FakeKube()
        for name, rack in {"n0": "a", "n1": "a", "n2": "b", "n3": "b"}.items():
            body = node(name)
            body["metadata"]["labels"][RACK] = rack
            kube.add_node(body)
        clock = ManualClock()
        ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=clock)
        ctl.policies.use(_policy())
        await ctl.prime()
        assert ctl.fleet.view().group("rack-a").size == 2
        for body in list(kube.nodes.values()):
            await ctl.on_node(body)
        for name in ("n0", "n1", "n2"):
            fault = FaultEvent(
                FaultKind.XID, name, at=clock.now(), xid=79, evidence=Evidence(gpu_index=0)
            )
            set_condition(kube.nodes[name], conditions.problem(Subsystem.GPU, [fault]))
            await ctl.on_node(kube.nodes[name])
        records = {n: ctl.fleet.records[n] for n in ("n0", "n1", "n2")}
        assert records["n1"].pending is not None and records["n1"].group == "rack-a"

        # The NodeRemediation (written after the record) shows each node's own ladder:
        # rack a's has no power-cycle.
        def ladders() -> dict[str, list[str]]:
            return {
                obj["spec"]["node"]: obj["spec"]["ladder"]
                for (plural, _), obj in kube.custom.items()
                if plural == "noderemediations"
            }

        for _ in range(200):
            if len(ladders()) == 2:
                break
            await asyncio.sleep(0.01)
        assert ladders() == {
            "n0": ["reboot", "reimage", "triage"],
            "n2": ["reboot", "power-cycle", "reimage", "triage"],
        }
        for task in list(ctl.tasks.pending):
            task.cancel()
        return {n: r.state.value for n, r in records.items()}

    assert asyncio.run(go()) == {"n0": "draining", "n1": "production", "n2": "draining"}
