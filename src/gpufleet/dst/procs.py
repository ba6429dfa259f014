"""The processes of the simulated cluster: how each product is started and driven.

* **controller replica**: a :class:`~gpufleet.lifecycle.controller.Controller` driven
  the way :mod:`gpufleet.lifecycle.operator` wires it into kopf: ``prime()`` at
  start-up, ``on_node``/``on_node_deleted`` from a Node watch, ``on_policy`` from the
  FleetPolicy watch, and the ticker daemon (``tick_all`` then ``watch_boots`` every
  ``tick_s``). :class:`KopfModel` stands in for kopf: one worker per object that
  handles the latest event after a short batching window, list-then-watch streams
  that list again when a watch ends, and peering as the chart sets it
  (``mandatory=False``): replicas write keepalives to a ``ClusterKopfPeering``; one
  that sees a live peer of higher priority pauses (no watch handling, no ticks;
  tasks the controller already spawned run on, as they do under kopf); without
  the peering object every replica runs standalone.
* **Slurm syncer**: :class:`~gpufleet.slurm.syncer.Syncer` ``run()``.
* **agent**: the real agent (:class:`~gpufleet.dst.node.DstAgent`) ``run()``, with
  the Kubernetes reporter of production on this process's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.policy import Policy
from gpufleet.dst.kube import KubeClient
from gpufleet.dst.node import DstAgent, FaultFeed
from gpufleet.dst.slurm import Scontrol, SlurmRest
from gpufleet.dst.world import Proc, ProcSpec, World
from gpufleet.health import skus
from gpufleet.health.agent import AgentSettings
from gpufleet.health.kube_report import KubeReporter
from gpufleet.kubeapi import NODES, ApiError, NotFound, Resource, custom
from gpufleet.lifecycle import crds
from gpufleet.lifecycle.controller import Controller, ControllerSettings
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.slurm.syncer import Syncer, SyncSettings

log = logging.getLogger("gpufleet.dst")

PEERING = Resource("clusterkopfpeerings", "kopf.dev/v1")
PEERING_NAME = "gpufleet"
POLICIES = custom(crds.FLEET_POLICY_PLURAL)
POLICY_NAME = "default"

CONTROLLER_SETTINGS = ControllerSettings(
    tick_s=2.0,
    drain_poll_s=1.0,
    status_save_delay_s=0.5,
    bmc_retry_delays=(0.5, 1.0, 2.0),
)
SYNC_SETTINGS = SyncSettings(poll_interval_s=1.0, reservation_interval_s=0, work_heartbeat_s=30.0)
AGENT_SETTINGS = AgentSettings(interval_s=2.0, resync_s=60.0, request_retry_s=15.0)


class KopfModel:
    """What kopf does for the controller: streams, per-object workers, the ticker, peering."""

    BATCH_S = 0.1
    """kopf's batching window: events of one object that arrive within it are handled once."""
    KEEPALIVE_S = 10.0
    LIFETIME_S = 60.0

    def __init__(
        self, world: World, proc: Proc, ctl: Controller, client: KubeClient, priority: int
    ):
        self.world = world
        self.proc = proc
        self.ctl = ctl
        self.client = client
        self.priority = priority
        self.active = True
        """Not paused by peering (kopf starts unpaused and pauses on seeing a higher peer)."""
        self._latest: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._workers: set[tuple[str, str]] = set()
        self._epoch = 0
        """Bumped when peering lets this replica act again: its streams list afresh."""

    async def run(self) -> None:
        await self.ctl.prime()  # kopf's startup handler; a failure ends the process
        await asyncio.gather(
            self._stream(NODES, "node"),
            self._stream(POLICIES, "policy"),
            self._ticker(),
            self._peering(),
        )

    # --------------------------------------------------------------- streams

    async def _stream(self, resource: Resource, kind: str) -> None:
        while True:
            epoch = self._epoch
            try:
                listing = await self.client.list(resource)
                for obj in listing.items:
                    self._enqueue(kind, "", obj)
                stream = self.client.watch(resource, listing.resource_version, timeout_s=300)
                async for event in stream:
                    self._enqueue(kind, event.type, event.object)
                    if self._epoch != epoch:
                        break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("%s %s stream: %s", self.proc.label, kind, exc)
                await asyncio.sleep(1.0)

    def _enqueue(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        if not self.active:
            return
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
                if not self.active:
                    continue
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
        elif name == self.ctl.settings.policy_name:
            if type_ == "DELETED":
                self.ctl.policy = self.ctl.policy.model_copy(update={"paused": True})
            else:
                await self.ctl.on_policy(obj)

    # ---------------------------------------------------------------- ticker

    async def _ticker(self) -> None:
        works: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
            ("tick", self.ctl.tick_all),
            ("boot watch", self.ctl.watch_boots),
        )
        while True:
            if self.active and self.world.api.find(POLICIES, POLICY_NAME) is not None:
                for what, work in works:
                    try:
                        await work()
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        log.debug("%s %s failed: %s", self.proc.label, what, exc)
            await asyncio.sleep(self.ctl.settings.tick_s)

    # --------------------------------------------------------------- peering

    async def _peering(self) -> None:
        me = self.proc.name
        while True:
            try:
                obj = await self.client.get(PEERING, PEERING_NAME)
            except NotFound:
                self._set_active(True, "standalone: no peering object")
            except ApiError:
                pass  # keep the last verdict (kopf does)
            else:
                now = self.world.clock.now()
                with contextlib.suppress(ApiError):
                    await self.client.patch(
                        PEERING,
                        PEERING_NAME,
                        {"status": {me: {"priority": self.priority, "lastSeen": now}}},
                        status=True,
                    )
                peers = (obj.get("status") or {}).items()
                higher = [
                    name
                    for name, p in peers
                    if name != me
                    and isinstance(p, dict)
                    and int(p.get("priority", 0)) > self.priority
                    and now - float(p.get("lastSeen", 0)) < self.LIFETIME_S
                ]
                self._set_active(not higher, f"peers above: {higher}")
            await asyncio.sleep(self.KEEPALIVE_S)

    def _set_active(self, active: bool, why: str) -> None:
        if active == self.active:
            return
        self.active = active
        self.world.trace.add(self.proc.label, "peering", "active" if active else "paused", key=True)
        if active:
            self._epoch += 1  # kopf resumes its streams from a fresh list


def controller_spec(priority: int) -> ProcSpec:
    async def main(world: World, proc: Proc) -> None:
        client = KubeClient(world, proc)
        ctl = Controller(client, CONTROLLER_SETTINGS, Metrics(), clock=world.clock)
        proc.obj = ctl
        await KopfModel(world, proc, ctl, client, priority).run()

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


def peering_body() -> dict[str, Any]:
    return {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": PEERING_NAME},
        "status": {},
    }


__all__ = [
    "PEERING",
    "POLICIES",
    "KopfModel",
    "agent_spec",
    "controller_spec",
    "peering_body",
    "rfc3339",
    "syncer_spec",
]
