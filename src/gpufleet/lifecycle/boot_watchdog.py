"""The Day-0 boot watchdog: a machine powered on to join either joins, is retried, or fails.

A boot in progress is recorded in its Machine's ``status.boot`` by whoever
powered it on (:mod:`gpufleet.remediate.machine_power`) and advanced by the
provisioning service (iPXE script served, token issued). The Machine watch
keeps the Machines with a boot in progress in ``booting``; every pass judges
each of them (:func:`gpufleet.domain.boot_watch.judge`):

- a Node of the machine is Ready since the power-on: the boot is ``Joined``;
- waiting: nothing to do;
- stalled, and the machine has a Node (a reimage or a reboot of a joined
  machine): its Node's lifecycle owns its power (the ladder's timeouts and
  budget); the stall is only reported, once, on the Machine;
- stalled with attempts left: a power cycle with a one-time network boot and a
  new token, unless the policy is paused or in dry-run (then an Event says what
  is held); the attempt is recorded before the power action and also when the
  action failed, so every stall consumes an attempt and nothing loops;
- stalled on the last attempt: the boot has ``Failed`` (phase, condition
  ``Booted``, a Warning Event) until someone powers the machine on again.

A machine with no Node runs nothing (no kubelet, no slurmd), so a retry is not
counted against the disruption budget (decision 0104); pause, dry-run and the
BMC identity check apply as to every power action.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api import conditions
from gpufleet.clock import Clock
from gpufleet.domain import boot_watch, enrollment, well_known
from gpufleet.gate import Gate
from gpufleet.kubeapi import NODES, ApiError, KubePort, NotFound
from gpufleet.kubeapi.machines import MACHINES, MachineStore
from gpufleet.lifecycle import machines, nodes
from gpufleet.lifecycle.core import ControllerSettings, Json, log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.remediate import machine_power, redfish

CONDITION = "Booted"


class BootWatch:
    """``on_machine`` (the Machine watch) and ``watch_boots`` (one pass over booting machines)."""

    def __init__(
        self,
        client: KubePort,
        settings: ControllerSettings,
        *,
        gate: Gate,
        book: NodeBook,
        policies: PolicyKeeper,
        events: EventSink,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self.client = client
        self.gate = gate
        self.settings = settings
        self.book = book
        self.policies = policies
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.booting: dict[str, Json] = {}
        """Machines with a boot in progress, as last seen by the Machine watch."""
        self._boot_said: dict[str, str] = {}
        """Per booting Machine: the last stall announced by an Event (announced once)."""

    def on_machine(self, type_: str, body: Mapping[str, Any]) -> None:
        """Keep ``booting`` current from the Machine watch (no API call)."""
        name = str(body.get("metadata", {}).get("name") or "")
        if not name:
            return
        status = body.get("status") or {}
        if type_ == "DELETED" or boot_watch.progress_of(status) is None:
            self.booting.pop(name, None)
            self._boot_said.pop(name, None)
        else:
            self.booting[name] = dict(body)

    def _node_of(self, name: str, status: Mapping[str, Any]) -> Json | None:
        """The machine's Node as the Node watch last saw it (it carries the Machine's label)."""
        for candidate in (status.get("node"), name):
            body = self.book.get(str(candidate)) if candidate else None
            if body is not None and machines.machine_of(body) == name:
                return body
        return None

    async def _read_node(self, name: str, status: Mapping[str, Any]) -> Json | None:
        """The machine's Node read from the API (None when there is none, or on an error:
        then the stall is judged as before, without a Node)."""
        for candidate in (status.get("node"), name):
            if not candidate:
                continue
            try:
                body = await self.client.get(NODES, str(candidate))
            except NotFound:
                continue
            except ApiError as exc:
                log.warning("machine=%s its Node not read: %s", name, exc)
                return None
            if machines.machine_of(body) == name:
                return dict(body)
        return None

    async def watch_boots(self) -> None:
        """Judge every boot in progress once; act on stalls (bounded: one action per stall)."""
        now = self.clock.now()
        policy = self.policies.effective()
        for name, body in list(self.booting.items()):
            status = body.get("status") or {}
            progress = boot_watch.progress_of(status)
            if progress is None:
                continue
            node = self._node_of(name, status)
            if node is not None and _ready_since(node, progress.requested_at):
                await self._joined(name, body)
                continue
            verdict = boot_watch.judge(
                progress,
                now,
                stall_seconds=policy.provisioning.stall_seconds,
                attempts=policy.provisioning.boot_attempts,
            )
            if isinstance(verdict, boot_watch.Waiting):
                continue
            if node is None and self.settings.node_selector:
                # A Node outside the managed set (a system node) is not in the Node watch:
                # read it before calling its boot stalled (once per stall judged).
                node = await self._read_node(name, status)
                if node is not None and _ready_since(node, progress.requested_at):
                    await self._joined(name, body)
                    continue
            said = f"{progress.attempt}:{verdict.stage}"
            if node is not None:
                if self._boot_said.get(name) != said:
                    self._boot_said[name] = said
                    self.events.machine(
                        body,
                        "Warning",
                        "BootStalled",
                        f"{verdict.message.split('; power cycle')[0]}; Node "
                        f"{nodes.name_of(node)} exists, so its lifecycle decides (no power "
                        "action from the boot watchdog)",
                    )
                continue
            if not verdict.retry:
                await self._failed(name, body, verdict, now)
                continue
            if policy.paused or policy.dry_run:
                if self._boot_said.get(name) != said:
                    self._boot_said[name] = said
                    held = "paused" if policy.paused else "dry-run"
                    self.events.machine(
                        body, "Warning", "BootRetryHeld", f"{verdict.message} (held: policy {held})"
                    )
                continue
            await self._retry(name, body, verdict, now)

    async def _joined(self, name: str, body: Json) -> None:
        status = body.get("status") or {}
        patch = {
            **boot_watch.joined_status(),
            "conditions": conditions.set_condition(
                status.get("conditions"),
                CONDITION,
                "True",
                "Joined",
                "a Node of this machine is Ready since its power-on",
                now=self.clock.now(),
            ),
        }
        try:
            await self.client.patch(MACHINES, name, {"status": patch}, status=True)
        except ApiError as exc:
            log.warning("machine=%s boot outcome not written (next pass): %s", name, exc)
            return
        self.booting.pop(name, None)
        self._boot_said.pop(name, None)

    async def _failed(self, name: str, body: Json, verdict: boot_watch.Stalled, now: float) -> None:
        status = body.get("status") or {}
        patch = {
            **boot_watch.stalled_status(verdict),
            "conditions": conditions.set_condition(
                status.get("conditions"),
                CONDITION,
                "False",
                verdict.reason,
                verdict.message,
                now=now,
            ),
        }
        try:
            await self.client.patch(MACHINES, name, {"status": patch}, status=True)
        except ApiError as exc:
            log.warning("machine=%s failed boot not written (next pass): %s", name, exc)
            return
        self.booting.pop(name, None)
        self._boot_said.pop(name, None)
        self.metrics.boot_stalls.labels(reason=verdict.reason, outcome="failed").inc()
        self.events.machine(body, "Warning", "BootFailed", verdict.message)
        log.warning("machine=%s boot failed: %s", name, verdict.message)

    async def _retry(self, name: str, body: Json, verdict: boot_watch.Stalled, now: float) -> None:
        """One power cycle for this stall; the attempt is consumed whatever happens."""
        self.metrics.boot_stalls.labels(reason=verdict.reason, outcome="retried").inc()
        self.events.machine(body, "Warning", "BootStalled", verdict.message)
        try:
            done = await self.gate.network_boot(
                MachineStore(self.client),
                name,
                by=well_known.CONTROLLER,
                now=now,
                attempt=verdict.next_attempt,
                why=f"retry after a stall at {verdict.stage} ({verdict.reason})",
                policy=self.policies.effective(),
            )
        except (machine_power.PowerRefused, redfish.RedfishError, ApiError) as exc:
            await self._consume_attempt(name, body, verdict, now, exc)
            return
        # The watch brings the written status; until then the pass must not act again.
        self.booting[name] = _advanced(body, verdict.next_attempt, now)
        self.events.machine(
            body,
            "Normal",
            "BootRetried",
            f"{done.reset_type} with a one-time network boot and a new token "
            f"(attempt {done.attempt})",
        )

    async def _consume_attempt(
        self, name: str, body: Json, verdict: boot_watch.Stalled, now: float, exc: Exception
    ) -> None:
        """A retry that failed still counts: the next stall comes ``stall_seconds`` later."""
        why = f"power cycle for attempt {verdict.next_attempt} failed: {exc}"
        self.events.machine(body, "Warning", "BootRetryFailed", why)
        log.warning("machine=%s %s", name, why)
        patch = boot_watch.requested_status(
            by=well_known.CONTROLLER, at=now, attempt=verdict.next_attempt, why=why
        )
        try:
            await self.client.patch(MACHINES, name, {"status": patch}, status=True)
        except ApiError as exc2:
            log.warning("machine=%s failed retry not recorded: %s", name, exc2)
        self.booting[name] = _advanced(body, verdict.next_attempt, now)


def _advanced(body: Json, attempt: int, now: float) -> Json:
    """``body`` with the attempt just recorded (the watch delivers the real one later)."""
    status = dict(body.get("status") or {})
    boot = dict(status.get("boot") or {})
    boot.update(boot_watch.requested_status(by="", at=now, attempt=attempt)["boot"])
    status["boot"] = boot
    return {**body, "status": status}


def _ready_since(node: Mapping[str, Any], since: float) -> bool:
    """Whether the Node is Ready and became so at or after ``since`` (this boot's join)."""
    when = enrollment.parse_rfc3339(machines.ready_since(node))
    return when is not None and when >= since - 1.0
