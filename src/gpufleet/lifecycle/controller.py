"""The lifecycle controller: Node events in, ``decide()``, record first, act second.

One pass for a node (``_process``), always in this order:

1. read the Node: its record, the faults its agent reports that the record
   has not seen, the agent's answer to the request the record waits for;
2. ``decide`` each event, under the fleet lock (budget, breaker, rate limit
   see every other node's latest decision);
3. write the record, the state label, gpufleet's cordon and taints and the
   next agent request in *one* merge patch guarded by ``resourceVersion``
   (a 409 re-reads the Node and starts again);
4. only then act outside the Node: drain, BMC steps, Events, metrics,
   the NodeRemediation object.

A decision held by a rail writes its bookkeeping and an Event saying what
was withheld and why; the periodic tick (``tick_all``) retries it. A BMC step
is carried out by one task per node, with a write-ahead mark on the Node
before its one Reset POST; a restarted controller's tick takes an unfinished
step up again and reads the mark and the BMC to learn whether the reset
already happened (docs/decisions/0072).

Where each part lives (one concept per module, combined here; docs/decisions/0085):

- :mod:`~gpufleet.lifecycle.core`: the state of one process, task and lock plumbing;
- :mod:`~gpufleet.lifecycle.reconcile`: steps 1 to 3 (the node pass);
- :mod:`~gpufleet.lifecycle.acting`: step 4 (what follows a stored decision);
- :mod:`~gpufleet.lifecycle.drain_loop`: the drain task of a draining node;
- :mod:`~gpufleet.lifecycle.bmc_tasks`: the BMC step tasks and their results;
- :mod:`~gpufleet.lifecycle.remediation_sync`: the NodeRemediation object;
- :mod:`~gpufleet.lifecycle.ticks`: the periodic retry;
- :mod:`~gpufleet.lifecycle.spare_pool`: hot spares promoted when a node leaves production;
- :mod:`~gpufleet.lifecycle.maintenance`: MaintenancePlans rolled out in batches (each tick);
- :mod:`~gpufleet.lifecycle.tickets`: the RMA hand-off (evidence bundle, ticket webhook);
- :mod:`~gpufleet.lifecycle.boot_watchdog`: Machines powered on to join: joined, retried or failed;
- :mod:`~gpufleet.lifecycle.policy`: the FleetPolicy, its status, the breaker reset;
- :mod:`~gpufleet.lifecycle.events`: the Events people read.
"""

from __future__ import annotations

from gpufleet.lifecycle.acting import Acting
from gpufleet.lifecycle.bmc_tasks import BmcTasks
from gpufleet.lifecycle.boot_watchdog import BootWatch
from gpufleet.lifecycle.core import ControllerCore, ControllerSettings
from gpufleet.lifecycle.drain_loop import Drains
from gpufleet.lifecycle.events import Events
from gpufleet.lifecycle.maintenance import MaintenancePlans
from gpufleet.lifecycle.policy import PolicyKeeping
from gpufleet.lifecycle.reconcile import NodePass
from gpufleet.lifecycle.remediation_sync import RemediationSync
from gpufleet.lifecycle.spare_pool import SparePool
from gpufleet.lifecycle.tickets import Tickets
from gpufleet.lifecycle.ticks import Ticks

__all__ = ["Controller", "ControllerSettings"]


class Controller(
    NodePass,
    Acting,
    Drains,
    BmcTasks,
    RemediationSync,
    Ticks,
    SparePool,
    Tickets,
    MaintenancePlans,
    BootWatch,
    PolicyKeeping,
    Events,
    ControllerCore,
):
    """The lifecycle controller of one process: the concepts combined, state in ControllerCore.

    Each base is one concept (its own module); they call each other only through the
    methods :class:`~gpufleet.lifecycle.core.ControllerCore` declares, and every one
    of those is implemented by exactly one base.
    """
