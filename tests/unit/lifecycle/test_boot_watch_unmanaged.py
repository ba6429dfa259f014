"""A controller that manages only some Nodes (``--node-selector``) still sees a machine
outside them join: the system machine it runs on must never look like a stalled boot and
be power-cycled (found running the chart on machines: the controller rebooted its own
node 15 minutes after it joined)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api.machine import MachineSpec, manifest
from gpufleet.clock import ManualClock
from gpufleet.domain import boot_watch, well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.kubeapi.machines import MACHINES
from gpufleet.lifecycle.controller import ControllerSettings

from .fakes import FakeKube, controller, k8s_policy, node

SYSTEM = "vm-node-0000"


def _system_node(ready_at: float) -> dict[str, Any]:
    body = node(SYSTEM, pool="system")
    body["metadata"]["labels"][well_known.LABEL_MACHINE] = SYSTEM
    body["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(ready_at)}
    ]
    return body


def test_a_ready_node_outside_the_selector_ends_its_machines_boot_as_joined() -> None:
    async def go() -> None:
        clock = ManualClock()
        kube = FakeKube()
        kube.add_node(_system_node(clock.now() + 60))
        spec = MachineSpec.model_validate(
            {
                "macs": ["52:54:00:67:00:00"],
                "serial": f"SN-{SYSTEM}",
                "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": "ns/bmc"},
                "pool": "system",
                "hardware": {"gpuModel": "none", "gpuCount": 0, "hcaCount": 0},
            }
        )
        machine = manifest(SYSTEM, spec)
        machine["status"] = boot_watch.requested_status(by="test", at=clock.now(), attempt=1)
        kube.custom[(MACHINES.plural, SYSTEM)] = machine
        settings = ControllerSettings(
            status_save_delay_s=0.0, node_selector={well_known.LABEL_POOL: "machines"}
        )
        ctl = controller(kube, settings, clock=clock)
        ctl.policies.use(k8s_policy())
        await ctl.prime()
        assert SYSTEM not in ctl.book  # not managed: not in the Node cache
        ctl.on_machine("ADDED", machine)
        clock.advance(ctl.policies.policy.provisioning.stall_seconds + 60)
        await ctl.watch_boots()
        status = kube.custom[(MACHINES.plural, SYSTEM)]["status"]
        assert status["boot"]["outcome"] == "Joined", status["boot"]
        assert SYSTEM not in ctl.boots.booting
        await ctl.close()

    asyncio.run(go())
