"""The processes of the simulated cluster: how each product is started and driven.

* **controller replica**: a :class:`~gpufleet.lifecycle.controller.Controller` driven
  the way :mod:`gpufleet.lifecycle.operator` wires it into kopf: ``prime()`` at
  start-up, ``on_node``/``on_node_deleted`` from a Node watch, ``on_policy`` and
  ``on_policy_deleted`` from the FleetPolicy watch, the ticker daemon (``tick_all``
  then ``watch_boots`` every ``tick_s``), and the real
  :class:`~gpufleet.lifecycle.leadership.Leadership` holding the Lease, which calls
  ``activate``/``deactivate``. :class:`KopfModel` stands in for kopf: one worker per
  object that handles the latest event after a short batching window, list-then-watch
  streams that list again when a watch ends. Every replica watches; only the Lease's
  holder acts (the controller's fence, as in production). Its BMCs are opened by
  :func:`~gpufleet.dst.bmc.bmc_factory`, handed to the gate alone.
* **Slurm syncer**: :class:`~gpufleet.slurm.syncer.Syncer` ``run()``.
* **agent**: the real agent (:class:`~gpufleet.dst.node.DstAgent`) ``run()``, with
  the Kubernetes reporter of production on this process's client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.api import maintenanceplan
from gpufleet.domain import well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.policy import Policy
from gpufleet.dst.bmc import bmc_factory
from gpufleet.dst.kube import KubeClient
from gpufleet.dst.node import DstAgent, FaultFeed
from gpufleet.dst.slurm import Scontrol, SlurmRest
from gpufleet.dst.world import Proc, ProcSpec, World
from gpufleet.gate import GateSettings
from gpufleet.health import skus
from gpufleet.health.agent import AgentSettings
from gpufleet.health.kube_report import KubeReporter
from gpufleet.kubeapi import NODES, Resource, custom
from gpufleet.lifecycle import crds
from gpufleet.lifecycle.controller import Controller, ControllerSettings
from gpufleet.lifecycle.leadership import Leadership
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.slurm.syncer import Syncer, SyncSettings

log = logging.getLogger("gpufleet.dst")

POLICIES = custom(crds.FLEET_POLICY_PLURAL)
PLANS = custom(maintenanceplan.PLURAL)
POLICY_NAME = "default"

CONTROLLER_SETTINGS = ControllerSettings(
    tick_s=2.0,
    drain_poll_s=1.0,
    status_save_delay_s=0.5,
    bmc_retry_delays=(0.5, 1.0, 2.0),
    event_namespace="gpufleet-system",
    lease_duration_s=15.0,
    graceful_settle_s=60.0,
)
"""Production's, with times a run reaches: a 15 s Lease (renewed every 2.5 s), a
graceful restart's settle time of 60 s (the models' OS shuts down in at most 30 s)."""
LEASE_NAMESPACE = CONTROLLER_SETTINGS.event_namespace
SYNC_SETTINGS = SyncSettings(poll_interval_s=1.0, reservation_interval_s=0, work_heartbeat_s=30.0)
AGENT_SETTINGS = AgentSettings(interval_s=2.0, resync_s=60.0, request_retry_s=15.0)


class KopfModel:
    """What kopf and ``operator.build_registry`` do for the controller: streams,
    per-object workers, the ticker, the Lease."""

    BATCH_S = 0.1
    """kopf's batching window: events of one object that arrive within it are handled once."""

    def __init__(
        self,
        world: World,
        proc: Proc,
        ctl: Controller,
        client: KubeClient,
        leadership: Leadership,
    ):
        self.world = world
        self.proc = proc
        self.ctl = ctl
        self.client = client
        self.leadership = leadership
        self._latest: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._workers: set[tuple[str, str]] = set()

    async def run(self) -> None:
        await self.ctl.prime()  # kopf's startup handler; a failure ends the process
        await asyncio.gather(
            self._stream(NODES, "node"),
            self._stream(POLICIES, "policy"),
            self._stream(PLANS, "plan"),
            self._ticker(),
            self._lease(),
        )

    # --------------------------------------------------------------- streams

    async def _stream(self, resource: Resource, kind: str) -> None:
        while True:
            try:
                listing = await self.client.list(resource)
                for obj in listing.items:
                    self._enqueue(kind, "", obj)
                stream = self.client.watch(resource, listing.resource_version, timeout_s=300)
                async for event in stream:
                    self._enqueue(kind, event.type, event.object)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("%s %s stream: %s", self.proc.label, kind, exc)
                await asyncio.sleep(1.0)

    def _enqueue(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        key = (kind, str(obj["metadata"]["name"]))
        self._latest[key] = (type_, obj)
        if key not in self._workers:
            self._workers.add(key)
            asyncio.get_running_loop().create_task(self._worker(key))

    async def _worker(self, key: tuple[str, str]) -> None:
        try:
            while key in self._latest:
                await asyncio.sleep(self.BATCH_S)
                type_, obj = self._latest.pop(key)
                try:
                    await self._handle(key[0], type_, obj)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # kopf logs a failed event handler and goes on
                    log.debug("%s handler %s failed: %s", self.proc.label, key, exc)
        finally:
            self._workers.discard(key)

    async def _handle(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        if kind == "node":
            if type_ == "DELETED":
                self.ctl.on_node_deleted(name)
            else:
                await self.ctl.on_node(obj)
        elif kind == "plan":
            if type_ == "DELETED":
                self.ctl.on_plan_deleted(name)
            else:
                self.ctl.on_plan(obj)
        elif name == self.ctl.settings.policy_name:
            if type_ == "DELETED":
                self.ctl.on_policy_deleted()
            else:
                await self.ctl.on_policy(obj)

    # ---------------------------------------------------------------- ticker

    async def _ticker(self) -> None:
        works: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
            ("tick", self.ctl.tick_all),
            ("boot watch", self.ctl.watch_boots),
        )
        while True:
            if self.world.api.find(POLICIES, POLICY_NAME) is not None:  # kopf's daemon
                for what, work in works:
                    try:
                        await work()
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        log.debug("%s %s failed: %s", self.proc.label, what, exc)
            await asyncio.sleep(self.ctl.settings.tick_s)

    # ----------------------------------------------------------------- lease

    async def _lease(self) -> None:
        """``operator._hold_lease``: act only while holding the Lease."""

        async def lead() -> None:
            self.world.trace.add(
                self.proc.label, "lease", f"held (epoch {self.leadership.epoch})", key=True
            )
            await self.ctl.activate()

        def lose(why: str) -> None:
            self.world.trace.add(self.proc.label, "lease", f"not acting: {why}", key=True)
            self.ctl.deactivate(why)

        await self.leadership.run(lead, lose)


def controller_spec(settings: ControllerSettings = CONTROLLER_SETTINGS) -> ProcSpec:
    """A controller replica; ``settings``: :data:`CONTROLLER_SETTINGS` unless a scenario
    turns something on (``Config(device_taints=True)``)."""

    async def main(world: World, proc: Proc) -> None:
        client = KubeClient(world, proc)
        s = settings
        leadership = Leadership(
            client,
            namespace=LEASE_NAMESPACE,
            name=s.lease,
            identity=proc.label,  # a new pod, a new identity (the pod name and a suffix)
            duration_s=s.lease_duration_s,
            renew_s=s.lease_duration_s / 6,
            clock=world.clock,
        )
        ctl = Controller(
            client,
            s,
            Metrics(),
            clock=world.clock,
            fence=leadership,
            bmcs=bmc_factory(world),
            gate_settings=GateSettings(
                lease_margin_s=s.lease_duration_s / 2, graceful_settle_s=s.graceful_settle_s
            ),
        )
        proc.obj = ctl
        await KopfModel(world, proc, ctl, client, leadership).run()

    return ProcSpec(identity=well_known.CONTROLLER, main=main, restart_s=5.0)


def syncer_spec() -> ProcSpec:
    async def main(world: World, proc: Proc) -> None:
        syncer = Syncer(
            kube=KubeClient(world, proc),
            rest=SlurmRest(world, proc),
            scontrol=Scontrol(world, proc),
            settings=SYNC_SETTINGS,
            clock=world.clock,
        )
        proc.obj = syncer
        await syncer.run()

    return ProcSpec(identity="gpufleet-slurm-syncer", main=main, restart_s=5.0)


def agent_spec(node: str, policy: Policy) -> ProcSpec:
    profile = skus.choose(skus.bundled(), sku="h100-sxm", gpu_names=[])

    async def main(world: World, proc: Proc) -> None:
        hw = world.hw[node]
        reporter = KubeReporter(node, api=KubeClient(world, proc))
        agent = DstAgent(
            hw,
            profile,
            policy,
            node=node,
            reporter=reporter,
            settings=AGENT_SETTINGS,
            clock=world.clock.now,
        )
        agent.monitors = FaultFeed(hw)  # type: ignore[assignment]
        proc.obj = agent
        await agent.run(asyncio.Event())

    return ProcSpec(identity=f"{well_known.AGENT}:{node}", main=main, restart_s=3.0)


__all__ = [
    "LEASE_NAMESPACE",
    "PLANS",
    "POLICIES",
    "KopfModel",
    "agent_spec",
    "controller_spec",
    "rfc3339",
    "syncer_spec",
]
