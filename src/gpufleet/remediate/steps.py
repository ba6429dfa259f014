"""Carry out the machine-level ladder steps through a BMC, at most once per attempt.

``reboot`` restarts the machine (for a stateless node, whose root file system
comes from the network image, a reboot *is* a reimage); ``power-cycle`` cuts
power, which clears what a warm reboot keeps (a hung GPU, a wedged NIC);
``reimage`` forces a one-time network boot first. GPU resets are not here:
they run on the node, asked of its agent.

Every step follows the same order, so that one ladder attempt ends in at most
one performed reset (docs/decisions/0072):

1. **identity**: the BMC's ComputerSystem must be the node's machine
   (:mod:`gpufleet.remediate.identity`), or nothing is done;
2. **baseline**: read what a reset would change (:class:`ResetEvidence`);
3. **write-ahead mark**: the caller's :class:`Journal` stores an
   :class:`ActionMark` durably (on the Node) *before* the POST;
4. **one POST**: never repeated; a lost answer (timeout, 5xx) is followed by
   reads until the reset shows or the settle time has passed (:data:`SETTLE_S`;
   a GracefulRestart gets :data:`GRACEFUL_SETTLE_S`: the OS shuts down first,
   and only then does the machine reset and ``LastResetTime`` move);
5. **power on**: wait for ``PowerState: On``.

A controller that restarts in the middle passes the mark it finds back in
(``mark=``): the reset is then *read*, not posted. Only an immediate reset
(ForceRestart, PowerCycle, ForceOff, On) that the BMC shows never happened
after its settle time is posted again, and only after ``prove`` (the gate's
fresh proof that the node is empty) passed again; a GracefulRestart is never
posted twice: if it does not show within its settle time the step fails and
the ladder's next rung is a new decision (docs/decisions/0142).

This module drives a :class:`Bmc` it is handed; only the gate
(:mod:`gpufleet.gate`) can hand it one that acts (docs/decisions/0139).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from gpufleet.domain.ladder import Step
from gpufleet.remediate import identity
from gpufleet.remediate.evidence import ActionMark, ResetEvidence, reset_since
from gpufleet.remediate.redfish import (
    BmcOutcomeUnknown,
    BmcRejected,
    RedfishError,
)

BMC_STEPS = frozenset({Step.REBOOT, Step.POWER_CYCLE, Step.REIMAGE})
"""Steps that go through the node's BMC."""
SETTLE_S = 10.0
"""After a lost answer, how long the BMC is given to show the reset before the
controller concludes it was not performed (BMCs apply an accepted reset within
seconds; the answer is what gets lost)."""
GRACEFUL_SETTLE_S = 300.0
"""The same for a GracefulRestart: the BMC asks the OS to shut down, and the machine
resets (``LastResetTime`` moves) only once it has; real servers take from seconds
to minutes. Within this time nothing else is posted for the attempt."""
POLL_S = 1.0
"""How often the BMC is read while waiting for the reset to show."""
GRACEFUL = "GracefulRestart"
NETWORK_BOOT = "Pxe"
"""The ``resetType`` of the mark a reimage writes before it sets its one-time network
boot: no reset is posted under it, but a process killed between the override and its
reset leaves the mark, so whoever finds the attempt ended removes the override
(docs/decisions/0143, 0148)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """The ladder attempt a BMC step belongs to (``StepAttempt`` of the record)."""

    step: Step
    attempt: int
    started_at: float


class Bmc(Protocol):
    """What a BMC step uses of the node's BMC.

    :class:`gpufleet.remediate.redfish.RedfishClient` implements it; the unit tests'
    fake (``tests/unit/fakes.py``) too, checked by mypy against this. The errors are
    part of the contract: :class:`~gpufleet.remediate.redfish.BmcRejected` when the
    BMC refused (nothing was done), :class:`~gpufleet.remediate.redfish.BmcOutcomeUnknown`
    when a reset's answer was lost, another
    :class:`~gpufleet.remediate.redfish.RedfishError` when the BMC could not be used.
    """

    @property
    def name(self) -> str:
        """The BMC in words, for errors and Events."""
        ...

    async def identity(self) -> identity.BmcIdentity:
        """What the ComputerSystem says about itself, read now."""
        ...

    async def evidence(self) -> ResetEvidence:
        """What a reset would change, read now."""
        ...

    async def power_state(self) -> str: ...

    async def reset(self, reset_type: str) -> None:
        """POST one ComputerSystem.Reset, never repeated."""
        ...

    def allows(self, reset_type: str) -> bool:
        """Whether the BMC lists ``reset_type`` (or lists none)."""
        ...

    async def wait_power(self, state: str) -> None:
        """Return once PowerState reads ``state``; raise when it does not in time."""
        ...

    async def set_one_time_boot(self, target: str = "Pxe") -> None:
        """Boot once from ``target`` (idempotent)."""
        ...

    async def clear_one_time_boot(self) -> None:
        """Remove a one-time boot override (idempotent)."""
        ...

    async def one_time_boot(self) -> str | None:
        """The one-time network boot armed now (its target), or None: none, or one the
        firmware already read (a ``Once`` override goes back to ``Disabled`` when used)."""
        ...


class Journal(Protocol):
    """Where the write-ahead mark is kept. ``write`` returns only once it is durable
    and raises if it is not: then nothing is posted. The gate's journal also makes
    its last checks there (its lease, no pod landed), right before the POST."""

    async def write(self, mark: ActionMark) -> None: ...


class BmcIdentityMismatch(RedfishError):
    """The BMC is not (provably) the node's: no power action was taken."""

    def __init__(self, bmc: str, problems: tuple[str, ...], seen: identity.BmcIdentity) -> None:
        super().__init__(
            bmc,
            "identity not verified, no power action: "
            + "; ".join(problems)
            + f" (BMC reports {seen.describe()})",
        )
        self.problems = problems
        self.seen = seen


class ResetNotPerformed(RedfishError):
    """The BMC did not carry out a reset whose answer was lost; it was not posted again."""


async def run_bmc_step(
    step: Step,
    bmc: Bmc,
    *,
    attempt: Attempt,
    journal: Journal,
    expected: identity.ExpectedIdentity,
    mark: ActionMark | None = None,
    prepare: Callable[[], Awaitable[None]] | None = None,
    prove: Callable[[], Awaitable[None]] | None = None,
    clock: Callable[[], float] = time.time,
    settle_s: float = SETTLE_S,
    graceful_settle_s: float = GRACEFUL_SETTLE_S,
    poll_s: float = POLL_S,
) -> str:
    """Run (or, given this attempt's ``mark``, resume) one BMC step; wait for power on.

    ``prove`` runs before anything is posted afresh (a fresh run, or a resumed
    immediate reset the BMC shows never happened) and raises if the node may not
    be disrupted now. ``prepare`` runs once the identity is verified and proven,
    before the BMC is touched, only on a fresh run (the reimage's new join
    token). ``clock`` is wall time: ``mark.posted_at`` may come from another process.

    Returns a sentence for the record and the Event. Raises
    :class:`~gpufleet.remediate.redfish.RedfishError` (its subclasses
    :class:`BmcIdentityMismatch` and :class:`ResetNotPerformed` among them)
    if the step failed.
    """
    if step not in BMC_STEPS:
        raise ValueError(f"{step} is not a BMC step")
    seen = await bmc.identity()
    problems = identity.mismatches(expected, seen)
    if problems:
        raise BmcIdentityMismatch(bmc.name, problems, seen)
    run = _Run(step, bmc, attempt, journal, clock, settle_s, graceful_settle_s, poll_s, prove)
    if mark is not None and mark.binds(step.value, attempt.attempt, attempt.started_at):
        done = await run.resume(mark)
    else:
        await run.proven()
        if prepare is not None:
            await prepare()
        done = await run.fresh()
    await bmc.wait_power("On")
    return f"{step} via {bmc.name}: {done}"


@dataclass
class _Run:
    step: Step
    bmc: Bmc
    attempt: Attempt
    journal: Journal
    clock: Callable[[], float]
    settle_s: float
    graceful_settle_s: float
    poll_s: float
    prove: Callable[[], Awaitable[None]] | None

    async def proven(self) -> None:
        if self.prove is not None:
            await self.prove()

    def settle_for(self, reset_type: str) -> float:
        return self.graceful_settle_s if reset_type == GRACEFUL else self.settle_s

    async def fresh(self) -> str:
        if self.step is not Step.REIMAGE:
            # A reimage's network boot left armed (its reset unconfirmed, its override
            # kept through verification) must not turn this reset into a reimage (0177).
            await self.bmc.clear_one_time_boot()
        if self.step is Step.REBOOT:
            if self.bmc.allows("GracefulRestart"):
                try:
                    return await self.post("GracefulRestart")
                except BmcRejected:
                    pass  # refused (4xx): nothing was done, the forced restart may go
            return await self.post("ForceRestart")
        if self.step is Step.REIMAGE:
            await self.journal.write(self.mark(NETWORK_BOOT, await self.bmc.evidence()))
            await self.bmc.set_one_time_boot("Pxe")  # idempotent: may be repeated
            return f"Pxe once + {await self.power_cycle()}"
        return await self.power_cycle()

    async def power_cycle(self) -> str:
        if self.bmc.allows("PowerCycle"):
            try:
                return await self.post("PowerCycle")
            except BmcRejected:
                pass  # refused (4xx, 501): nothing was done
        return await self.off_on()

    async def off_on(self) -> str:
        off = await self.post("ForceOff")
        await self.bmc.wait_power("Off")
        return f"{off} + {await self.post('On')}"

    async def post(self, reset_type: str) -> str:
        """Baseline, mark, one POST; then read until the reset shows.

        An accepted reset is not done until the BMC shows it: a GracefulRestart is
        answered at once but the machine resets only once its OS has shut down (a hung
        OS never does), so the step waits for ``LastResetTime`` (or a log entry, or a
        power change) up to the reset type's settle time. One that never shows fails the
        step, "not performed", never posted again; the ladder's next rung is a new
        decision. A lost answer is read the same way."""
        mark = self.mark(reset_type, await self.bmc.evidence())
        await self.journal.write(mark)
        try:
            await self.bmc.reset(reset_type)
        except BmcOutcomeUnknown as exc:
            happened = await self.observe(mark)
            return self.judged(mark, happened, f"answer lost ({exc})")
        happened = await self.observe(mark)
        if happened:
            return reset_type
        return self.judged(mark, happened, "accepted")

    def mark(self, reset_type: str, baseline: ResetEvidence) -> ActionMark:
        """The write-ahead mark of this attempt for ``reset_type``, from ``baseline``."""
        return ActionMark(
            step=self.step.value,
            attempt=self.attempt.attempt,
            started_at=self.attempt.started_at,
            reset_type=reset_type,
            baseline=baseline,
            posted_at=self.clock(),
        )

    async def observe(self, mark: ActionMark) -> bool | None:
        """Read the BMC until the reset shows or ``settle_s`` after the POST has passed."""
        loop = asyncio.get_running_loop()
        # Wall time only to learn how much of the settle time is left (the POST may
        # be another process's); the waiting itself is on this loop's monotonic clock.
        settle = self.settle_for(mark.reset_type)
        left = max(0.0, settle - max(0.0, self.clock() - mark.posted_at))
        deadline = loop.time() + left
        happened: bool | None = None
        while True:
            try:
                happened = reset_since(mark.baseline, await self.bmc.evidence(), mark.reset_type)
            except RedfishError:
                happened = None
            if happened or loop.time() >= deadline:
                return happened
            await asyncio.sleep(self.poll_s)

    def judged(self, mark: ActionMark, happened: bool | None, why: str) -> str:
        if happened:
            return f"{mark.reset_type} ({why}; the BMC shows the reset happened)"
        if happened is None:
            # Nothing the BMC shows can say whether it happened: count it as done
            # and let verification judge the node (docs/decisions/0072).
            return (
                f"{mark.reset_type} ({why}; not confirmed: the BMC shows neither "
                "LastResetTime, a log entry nor a power change; not posted again)"
            )
        raise ResetNotPerformed(
            self.bmc.name,
            f"{mark.reset_type} was not performed: {why}; LastResetTime unchanged "
            f"{self.settle_for(mark.reset_type):g}s after the POST; not posted again",
        )

    async def resume(self, mark: ActionMark) -> str:
        """A POST of this attempt may have gone out before a restart: read, then finish."""
        if mark.reset_type == NETWORK_BOOT:  # the override perhaps, never a reset
            await self.proven()
            return f"{await self.fresh()} (the network boot was being set before a restart)"
        happened = await self.observe(mark)
        why = "posted before a controller restart"
        if happened is False:
            if mark.reset_type == "On":  # second half of ForceOff + On
                if await self.bmc.power_state() == "On":
                    return "ForceOff + On (on already)"
                return f"ForceOff + {await self.post('On')}"
            if mark.reset_type == GRACEFUL:
                # The OS may still have been shutting down: never posted twice.
                return self.judged(mark, happened, why)
            # An immediate reset the BMC shows never happened: this attempt's one reset
            # is still to be done, and the node must be proven empty again first.
            await self.proven()
            return f"{await self.fresh()} ({why}, not performed then)"
        done = self.judged(mark, happened, why)
        if mark.reset_type == "ForceOff":
            await self.bmc.wait_power("Off")
            return f"{done} + {await self.post('On')}"
        return done
