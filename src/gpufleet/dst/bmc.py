"""In-memory BMCs behind :class:`gpufleet.remediate.steps.Bmc`, and the one place they are injected.

A :class:`BmcModel` is one machine's Redfish ComputerSystem as the ladder's BMC steps
see it: identity (serial, HostName), ``PowerState``, ``LastResetTime`` (or, on BMCs that
do not report it, an event log), a one-time boot override, and resets with their
real-world timing: a ``GracefulRestart`` lets the OS shut down for a while before
``LastResetTime`` moves; ``ForceOff`` turns the power off until ``On``. A BMC may
refuse a reset type (4xx), or answer 500 after performing it, or not answer at all
(the choices of :meth:`World.port_call`).

What a reset does to the rest of the world (the node's agent dies, Slurm sees the
node down and loses its jobs, the GPU's trouble may be gone) is the world's
business: the model calls ``world.machine_reset`` and ``world.machine_off``. The
invariants look at every reset at the moment the BMC accepts it.

:func:`bmc_factory` is the only place the harness reaches into the controller: it is
the :data:`gpufleet.gate.BmcFactory` handed to the controller's gate, as the real one
(Redfish) is in production; nothing else in the controller can open a BMC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.domain.enrollment import rfc3339
from gpufleet.gate import BmcFactory
from gpufleet.remediate import redfish
from gpufleet.remediate.evidence import RESET_WORDS, ResetEvidence
from gpufleet.remediate.identity import BmcIdentity
from gpufleet.remediate.redfish import (
    BmcCredentials,
    BmcOutcomeUnknown,
    BmcRejected,
    BmcUnreachable,
)
from gpufleet.remediate.steps import Bmc

if TYPE_CHECKING:
    from gpufleet.dst.world import Proc, World

DISRUPTIVE = frozenset({"GracefulRestart", "ForceRestart", "PowerCycle", "ForceOff", "On", "Nmi"})
"""Reset types that take the machine's work away (``On`` only from off)."""


@dataclass
class BmcModel:
    """One machine's BMC."""

    node: str
    endpoint: str
    serial: str
    shutdown_s: float = 8.0
    """How long the OS takes to shut down after a GracefulRestart."""
    boot_s: float = 20.0
    """From a reset until the machine runs again (agent up, Slurm node back)."""
    reports_reset_time: bool = True
    """False: the BMC shows no LastResetTime; resets are seen in its event log."""
    allowed: tuple[str, ...] = ("On", "ForceOff", "GracefulRestart", "ForceRestart", "PowerCycle")
    refused: set[str] = field(default_factory=set)
    """Reset types it answers with 4xx (nothing done)."""
    power: str = "On"
    resets: int = 0
    last_reset_time: str | None = None
    log: list[tuple[str, str]] = field(default_factory=list)
    """(Created, Message) of its event log, oldest first."""
    boot_override: str | None = None
    """A one-time boot target armed and not yet consumed."""
    firmware_reads: bool = False
    """The machine is starting from a reset that found a network boot armed: its
    firmware reads the override as the boot ends (removed before, the disk boots)."""
    network_boots: int = 0
    """Boots the firmware made from a one-time network boot (reimages done)."""
    posts: list[tuple[float, str]] = field(default_factory=list)
    """(virtual time, reset type) of every reset it performed."""
    shutting_down: asyncio.TimerHandle | None = None
    """A graceful restart whose OS shutdown is under way (a later reset or power-off
    cuts it short: the OS that was shutting down is gone)."""


class BmcClient(Bmc):
    """One process's Redfish client for one BMC (implements :class:`steps.Bmc`)."""

    def __init__(self, world: World, proc: Proc, model: BmcModel, name: str) -> None:
        self.world = world
        self.proc = proc
        self.model = model
        self._name = f"{name} ({model.endpoint})" if name else model.endpoint

    @property
    def name(self) -> str:
        return self._name

    async def __aenter__(self) -> BmcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def _unreachable(self, what: str) -> BmcUnreachable:
        """What the client raises once its retries of an idempotent request ran out."""
        return BmcUnreachable(self._name, f"{what}: no answer after 4 attempts")

    async def _get(self, what: str, fn: Callable[[], Any]) -> Any:
        return await self.world.port_call(
            self.proc,
            "bmc",
            f"{self.model.node} GET {what}",
            fn,
            writes=False,
            error=self._unreachable,
        )

    async def identity(self) -> BmcIdentity:
        m = self.model
        got: BmcIdentity = await self._get(
            "System (identity)", lambda: BmcIdentity(serial=m.serial, hostname=m.node)
        )
        return got

    async def evidence(self) -> ResetEvidence:
        m = self.model

        def read() -> ResetEvidence:
            if m.reports_reset_time:
                return ResetEvidence(last_reset_time=m.last_reset_time, power_state=m.power)
            newest = max((c for c, _ in m.log), default=None)
            resets = tuple(c for c, msg in m.log if any(w in msg.lower() for w in RESET_WORDS))
            return ResetEvidence(power_state=m.power, log_newest=newest, log_resets=resets)

        got: ResetEvidence = await self._get("System (evidence)", read)
        return got

    async def power_state(self) -> str:
        m = self.model
        got: str = await self._get("System (PowerState)", lambda: m.power)
        return got

    def allows(self, reset_type: str) -> bool:
        return reset_type in self.model.allowed

    async def reset(self, reset_type: str) -> None:
        m = self.model
        if not self.allows(reset_type):
            raise BmcRejected(self._name, f"ResetType {reset_type} is not allowed")

        sent = self.world.loop.time()

        def post() -> None:
            if reset_type in m.refused:
                raise BmcRejected(self._name, f"POST Reset {reset_type}: HTTP 409 refused")
            self.world.bmc_reset(self.proc, m, reset_type, sent)

        await self.world.port_call(
            self.proc,
            "bmc",
            f"{m.node} POST Reset {reset_type}",
            post,
            writes=False,
            key=True,
            error=lambda w: BmcOutcomeUnknown(self._name, f"{w}: read timed out"),
            lost=lambda w: BmcOutcomeUnknown(self._name, f"{w}: HTTP 500", status=500),
        )

    async def wait_power(self, state: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + redfish.POWER_WAIT_S
        while loop.time() < deadline:
            self.proc.check_alive()
            if self.model.power == state:
                return
            await asyncio.sleep(0.5)
        raise BmcUnreachable(self._name, f"PowerState still {self.model.power}")

    async def set_one_time_boot(self, target: str = "Pxe") -> None:
        m = self.model

        def arm() -> None:
            m.boot_override = target

        what = f"{m.node} PATCH Boot {target} Once"
        await self.world.port_call(
            self.proc, "bmc", what, arm, writes=False, key=True, error=self._unreachable
        )

    async def clear_one_time_boot(self) -> None:
        m = self.model

        def disarm() -> None:
            m.boot_override = None

        what = f"{m.node} PATCH Boot None"
        await self.world.port_call(
            self.proc, "bmc", what, disarm, writes=False, key=True, error=self._unreachable
        )

    async def one_time_boot(self) -> str | None:
        m = self.model
        got: str | None = await self._get("System (boot)", lambda: m.boot_override)
        return got


def perform(world: World, m: BmcModel, reset_type: str) -> None:
    """What the machine does once its BMC accepted ``reset_type``."""
    loop = asyncio.get_running_loop()
    m.posts.append((loop.time(), reset_type))

    def reset_now() -> None:
        m.shutting_down = None
        m.resets += 1
        m.last_reset_time = rfc3339(world.clock.now() + m.resets * 1e-3)
        m.log.append((m.last_reset_time, f"System reset ({reset_type})"))
        m.power = "On"
        world.machine_reset(m, reset_type)

    if reset_type != "GracefulRestart" and m.shutting_down is not None:
        m.shutting_down.cancel()
        m.shutting_down = None
    if reset_type == "ForceOff":
        if m.power == "On":
            m.power = "Off"
            m.log.append((rfc3339(world.clock.now()), "System power off"))
            world.machine_off(m)
    elif reset_type == "GracefulRestart":
        if m.shutting_down is None:
            m.shutting_down = loop.call_later(m.shutdown_s, reset_now)
    elif reset_type == "On" and m.power == "On":
        pass  # already on: nothing happens
    else:  # ForceRestart, PowerCycle, On from off (a boot)
        reset_now()


def bmc_factory(world: World) -> BmcFactory:
    """The gate's :data:`~gpufleet.gate.BmcFactory` in a run: the calling process's
    client for the BMC at the credentials' endpoint (none answers there: unreachable)."""

    def open_bmc(creds: BmcCredentials, name: str) -> BmcClient:
        return BmcClient(world, world.current_proc(), world.bmc_at(creds.endpoint), name)

    return open_bmc
