"""The one gate every act that can disrupt a node passes through (docs/decisions/0139).

A GPU reset or a maintenance command asked of the node's agent, a reboot, a
power cycle, a reimage, a boot-watchdog restart, a step resumed after a restart:
each is asked of :class:`Gate`, which at that moment

1. checks that this replica still holds the controller's lease (a fenced
   replica acts for no more than its lease allows) and that the rails consent
   (the policy is not paused or in dry-run, the circuit breaker is closed);
2. reads the Node and its lifecycle record fresh and trusts the record only if
   the controller's key signed it, and only for the attempt it names;
3. proves the node empty *now*: Kubernetes pods listed from the apiserver, and
   Slurm's word read after the drain took effect (a probe the syncer answers
   with a fresh read);
4. writes the write-ahead mark (or the agent request) by compare-and-swap on the
   Node's ``resourceVersion``, so two writers cannot both go ahead; and only then
5. hands the act to the driver, looking once more for a pod right before a
   Reset POST.

It refuses without any of these, and says why. Nothing else holds a driver that
can act on a BMC: :mod:`gpufleet.remediate.power` may be imported by this
package alone (an import-linter contract), and the callers get the gate, not a
driver.
"""

from gpufleet.gate.drivers import BmcFactory, redfish_bmcs
from gpufleet.gate.fence import Fence, StaticFence
from gpufleet.gate.gate import Gate, GateSettings
from gpufleet.gate.outcomes import Done, Failed, Held, Outcome, Refused, Stale

__all__ = [
    "BmcFactory",
    "Done",
    "Failed",
    "Fence",
    "Gate",
    "GateSettings",
    "Held",
    "Outcome",
    "Refused",
    "Stale",
    "StaticFence",
    "redfish_bmcs",
]
