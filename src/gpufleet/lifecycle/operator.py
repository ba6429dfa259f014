"""Wiring of the lifecycle controller into kopf: watches, the tick daemon, HA, metrics.

kopf provides the watches (Nodes, FleetPolicies), peering between replicas
(only the replica with the highest priority acts; the others pause and take
over when its peering record expires), finite error backoffs, and the daemon
that ticks the fleet. The handlers are thin: all decisions are in
:class:`gpufleet.lifecycle.controller.Controller` (and below it, ``domain``).

Node handlers are ``on.event`` handlers on purpose: they keep no progress in
the Node (kopf writes nothing there), and they run on every change with no
extra round trip, which is what makes sub-second cordons possible.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
from dataclasses import dataclass
from typing import Any

import kopf
from prometheus_client import start_http_server

from gpufleet.api import maintenanceplan
from gpufleet.domain import well_known
from gpufleet.kubeapi import SERVICE_IN_FLIGHT, KubeApi
from gpufleet.lifecycle import crds
from gpufleet.lifecycle.controller import Controller, ControllerSettings
from gpufleet.lifecycle.metrics import Metrics

log = logging.getLogger("gpufleet.controller")

FINALIZER = f"{well_known.GROUP}/controller"
ERROR_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21)
"""Seconds between retries of a failing API connection (finite, as kopf's own default)."""
QUEUE_ERROR_DELAYS = (1, 1, 2, 3, 5, 8, 13, 21, 34, 55)
"""Seconds between retries of a handler that raised (finite)."""


@dataclass(frozen=True)
class RunOptions:
    """How ``gpufleet controller`` runs."""

    kubeconfig: str | None = None
    metrics_port: int = 0
    """0: no metrics endpoint."""
    metrics_address: str = "127.0.0.1"
    """Where /metrics listens: loopback unless asked (the chart passes 0.0.0.0)."""
    peering: str | None = "gpufleet"
    """ClusterKopfPeering object shared by the replicas; None: standalone."""
    priority: int | None = None
    """Peering priority; None: random (two replicas never tie)."""


def build_registry(ctl: Controller, options: RunOptions) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    policy_name = ctl.settings.policy_name

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING
        settings.peering.clusterwide = True
        settings.peering.stealth = True
        settings.peering.mandatory = False
        settings.networking.error_backoffs = ERROR_BACKOFFS
        settings.queueing.error_delays = QUEUE_ERROR_DELAYS
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        await ctl.prime()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await ctl.close()

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            ctl.on_node_deleted(body["metadata"]["name"])
            return
        await ctl.on_node(dict(body))

    @kopf.on.event(
        well_known.GROUP, well_known.VERSION, well_known.MACHINE_PLURAL, registry=registry
    )
    async def machine_event(type: str, body: kopf.Body, **_: Any) -> None:
        ctl.on_machine(type or "", body)

    @kopf.on.event(well_known.GROUP, well_known.VERSION, maintenanceplan.PLURAL, registry=registry)
    async def plan_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            ctl.on_plan_deleted(body["metadata"]["name"])
            return
        ctl.on_plan(dict(body))

    def is_ours(name: str, **_: Any) -> bool:
        return name == policy_name

    @kopf.on.event(
        well_known.GROUP,
        well_known.VERSION,
        crds.FLEET_POLICY_PLURAL,
        registry=registry,
        when=is_ours,
    )
    async def policy_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            log.warning("policy=%s deleted: pausing (fail closed)", policy_name)
            ctl.policy = ctl.policy.model_copy(update={"paused": True})
            return
        await ctl.on_policy(dict(body))

    @kopf.daemon(
        well_known.GROUP,
        well_known.VERSION,
        crds.FLEET_POLICY_PLURAL,
        registry=registry,
        when=is_ours,
        cancellation_timeout=5,
    )
    async def ticker(stopped: kopf.DaemonStopped, **_: Any) -> None:
        while not stopped:
            # The fleet's tick, then the Day-0 boot watchdog (a pass over the booting
            # Machines only); one failing never stops the other.
            for what, work in (("tick", ctl.tick_all), ("boot watch", ctl.watch_boots)):
                try:
                    await work()
                except Exception:
                    log.exception("%s failed", what)
            await asyncio.sleep(ctl.settings.tick_s)

    return registry


async def run(
    settings: ControllerSettings,
    options: RunOptions,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the controller until ``stop_flag`` is set (or the process is signalled)."""
    if options.kubeconfig:
        os.environ["KUBECONFIG"] = options.kubeconfig
    metrics = Metrics()
    if options.metrics_port:
        start_http_server(
            options.metrics_port, addr=options.metrics_address, registry=metrics.registry
        )
    client = await KubeApi.connect(options.kubeconfig, max_in_flight=SERVICE_IN_FLIGHT)
    metrics.count_requests(client.requests)
    ctl = Controller(client, settings, metrics)
    registry = build_registry(ctl, options)
    priority = options.priority if options.priority is not None else random.randint(1, 32767)
    await kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=options.peering is None,
        peering_name=options.peering,
        priority=priority,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
