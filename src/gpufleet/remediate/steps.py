"""Carry out the machine-level ladder steps through a BMC.

``reboot`` restarts the machine (for a stateless node, whose root file system
comes from the network image, a reboot *is* a reimage); ``power-cycle`` cuts
power, which clears what a warm reboot keeps (a hung GPU, a wedged NIC);
``reimage`` forces a one-time network boot first. GPU resets are not here:
they run on the node, asked of its agent.
"""

from __future__ import annotations

from gpufleet.domain.ladder import Step
from gpufleet.remediate.redfish import RedfishClient

BMC_STEPS = frozenset({Step.REBOOT, Step.POWER_CYCLE, Step.REIMAGE})
"""Steps that go through the node's BMC."""


async def run_bmc_step(step: Step, bmc: RedfishClient) -> str:
    """Run one BMC step and wait until the machine is powered on again.

    Returns a sentence for the record and the Event. Raises
    :class:`~gpufleet.remediate.redfish.RedfishError` if the BMC failed.
    """
    if step is Step.REBOOT:
        done = await bmc.reboot()
    elif step is Step.POWER_CYCLE:
        done = await bmc.power_cycle()
    elif step is Step.REIMAGE:
        done = await bmc.reimage()
    else:
        raise ValueError(f"{step} is not a BMC step")
    await bmc.wait_power("On")
    return f"{step} via {bmc.name}: {done}"
