"""A Redfish BMC emulator: one endpoint per fake node, all in one process.

Why our own and not sushy-tools: sushy-emulator's fake driver (2.2.0) keeps
``PowerState`` at ``On`` after ``ForceOff``, answers ``PowerCycle`` with 501 and
reads a ``Once`` boot override back as ``Continuous``, so the remediation tests
could not observe what they did (see docs/decisions). This server speaks the
DMTF resources a remediation driver uses -- ServiceRoot, Systems (PowerState,
Boot override, ComputerSystem.Reset with ResetActionInfo), Managers, Chassis,
SessionService (basic auth or X-Auth-Token sessions), and an EventLog
LogService -- with real semantics: ForceOff turns the system off, a reset boots
it, and a ``Once`` override is consumed by that boot and reads ``Disabled``
afterwards. Every action is recorded in the EventLog and counted under
``Oem.Gpufleet``, so a test can see which BMC did what.

Run: ``python -m gpufleet.local.redfish CONFIG.json`` where the config is
``{"user": ..., "password": ..., "bmcs": [{"node": "gpu-node-0000", "port": 18000}]}``.
Each BMC listens on 127.0.0.1 at its own port (0: a free one, read from the server's
``server_address``) and shares nothing with the others. ``poll_interval`` (at the top;
default 0.5 s) is how often each BMC's server thread looks for a shutdown request.
With ``"tls": {"cert": PEM_FILE, "key": PEM_FILE}`` (at the top, for every BMC, or
in a BMC's entry) it speaks HTTPS with that certificate, as a real BMC does
(:func:`gpufleet.local.pki.create_bmc` makes one, signed by a CA of its own or
self-signed); ``requests`` counts the HTTP requests each BMC answered, so a test
can tell that a client which refused the certificate sent none.

Each system reports ``SerialNumber`` ``SN-<node>`` (what the demo's Machines
say), ``HostName`` the node name, a ``UUID`` derived from the node name, and a
``LastResetTime`` that changes on every performed reset (ComputerSystem
v1.15+). A BMC entry may override ``serial``, ``hostname`` and ``uuid``, and
give ``boot_seconds`` (how long PowerState reads ``Off`` after a reset before
the system is on again; default 0) and a ``boot_hook``:
a URL the emulator POSTs to (outside Redfish, nothing of it shows in the
resources) each time the system boots. The local cluster points it at the node's
simulated hardware, so that a reboot or power cycle clears what a real one
would clear (a GPU that fell off the bus), as on a real server.

What real firmware does that remediation must live with (docs/local-cluster.md,
"The Redfish emulator's firmware behaviours", says which firmware does each):

- **A graceful reset waits for the OS.** ``GracefulRestart`` and
  ``GracefulShutdown`` ask the OS to shut down (the BMC logs the request and
  answers at once); the machine resets only once the OS is down, after
  ``os_shutdown_seconds`` (default :data:`DEFAULT_OS_SHUTDOWN_S`; real servers
  take seconds to minutes). Until then ``PowerState`` reads ``On`` (or
  ``PoweringOff``) and ``LastResetTime`` does not move; then it moves, the
  system powers off and (for a restart) boots. A second graceful request while
  the OS is shutting down joins the one under way (one reset); a forced one
  (``ForceOff``, ``ForceRestart``, ``PowerCycle``) overrides it at once.
  ``osIgnoresShutdown`` (control) models a hung OS that never acts on the
  request: answered, logged, never performed.
- **Allowed reset types per system** (``reset_types``): the AllowableValues of
  the Reset action and its ActionInfo list them, and a POST of another type is
  refused 400 ``ActionParameterNotSupported``, nothing done.
- **A Reset answered with a Task** (``task_reset``): ``202 Accepted``, a
  ``Location`` header naming a Task under ``/redfish/v1/TaskService/Tasks``,
  whose ``TaskState`` is ``Running`` until the reset is performed, then
  ``Completed``.
- **Transitional power states** (``power_transitions``): ``PoweringOff`` while
  the OS shuts down, ``PoweringOn`` while the system boots (``boot_seconds``)
  instead of ``Off``.
- **A reset during a boot starts the boot over** (``reset_restarts_boot``): a
  machine power-cycled in POST starts POST again, so it is on ``boot_seconds``
  after the last reset. Without it (the default) a boot under way still ends at
  its first time, whatever reset came meanwhile.
- **A one-time boot override is consumed by the boot that uses it** (it reads
  ``Disabled`` afterwards; above).

Misbehaviour, for reliability tests, switched at run time per BMC through
``/gpufleet/control`` (outside Redfish; same credentials; GET reads, PATCH
sets): ``failAfterReset: N`` -- the next N Reset POSTs are performed, then
answered 500; ``slowAnswers: N`` with ``slowAnswerSeconds: S`` -- performed,
answered only after S seconds; ``refuse: N`` -- answered 503 and *not*
performed; ``getDelaySeconds: S`` -- every GET answered after S seconds;
``bootSeconds``; ``reportLastResetTime: false`` -- an older BMC without
``LastResetTime``; ``osIgnoresShutdown: true`` -- see above. The firmware
behaviours are switched there too: ``osShutdownSeconds``, ``resetTypes``,
``taskReset``, ``powerTransitions``. ``Oem.Gpufleet.ResetPosts`` counts every
Reset POST received (performed or not), ``ResetCount`` the resets performed or
under way (a graceful one from its POST: its OS is shutting down), and
``GracefulJoined`` the graceful requests that joined one under way.

A BMC entry with a ``vm`` (the fields of :class:`gpufleet.local.vm.VmSpec`) is
the BMC of a real machine of the local cluster, a qemu virtual machine this
process starts and owns: ``On`` starts it, ``ForceOff`` ends it,
``GracefulShutdown`` presses its power button and ends it after a grace period,
``ForceRestart`` resets it (the firmware network-boots again), ``GracefulRestart``
and ``PowerCycle`` stop it and start a new one, and ``PowerState`` reads whether
it runs. The machine has no disk: every boot is a network boot, so a one-time
``Pxe`` override is what it does anyway and reads ``Pxe`` as the boot source.
Power operations run in the background (a BMC answers a reset at once and the
server follows); a machine that stops by itself is logged as a crash
(``Gpufleet.1.0.SystemCrashed``, Critical). ``power_on: true`` starts it with the
emulator; stopping the emulator stops every machine it started.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import secrets
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpufleet.local.vm import Forward, Vm, VmSpec

FAULTS: dict[str, Any] = {
    "failAfterReset": 0,
    "slowAnswers": 0,
    "slowAnswerSeconds": 15.0,
    "refuse": 0,
    "getDelaySeconds": 0.0,
    "reportLastResetTime": True,
    "osIgnoresShutdown": False,
}
"""Misbehaviour switches and their defaults (a well-behaved BMC)."""

DEFAULT_OS_SHUTDOWN_S = 3.0
"""How long the OS of an emulated system takes to shut down after a graceful request,
unless its entry says otherwise (``os_shutdown_seconds``; 0: at once). Real servers take
from a few seconds to minutes; tests that probe a settle window set it longer."""
DEFAULT_POLL_INTERVAL_S = 0.5
"""How often each BMC's server thread wakes to look for a :meth:`shutdown` request
(``serve_forever``'s default), unless the config's ``poll_interval`` says otherwise: a
storm bench serving thousands of BMCs, never shut down that way, sets it longer, since
every wake-up of every thread costs CPU."""
GRACEFUL = ("GracefulRestart", "GracefulShutdown")
FORCED = ("ForceOff", "ForceRestart", "PowerCycle")
"""Resets that cut the OS short: they override a graceful one under way."""

RESET_TYPES = (
    "On",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "PowerCycle",
    "ForceOn",
    "Nmi",
)
BOOT_TARGETS = ("None", "Pxe", "Hdd", "Cd", "Usb", "BiosSetup", "UefiHttp", "UefiShell")
BOOT_ENABLED = ("Disabled", "Once", "Continuous")
SYSTEM = "/redfish/v1/Systems/1"
MANAGER = "/redfish/v1/Managers/BMC"
CHASSIS = "/redfish/v1/Chassis/1"
LOG = f"{SYSTEM}/LogServices/EventLog"
RESET_ACTION = f"{SYSTEM}/Actions/ComputerSystem.Reset"
TASKS = "/redfish/v1/TaskService/Tasks"
CONTROL = "/gpufleet/control"
"""Test control endpoint (not Redfish): the misbehaviour switches of this BMC."""

Json = dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _precise_now() -> str:
    """LastResetTime: sub-second, so two resets in one second still differ."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class RedfishError(Exception):
    """A request error, reported in the Redfish extended-error format."""

    def __init__(self, status: HTTPStatus, message_id: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body: Json = {
            "error": {
                "code": f"Base.1.8.{message_id}",
                "message": message,
                "@Message.ExtendedInfo": [
                    {
                        "MessageId": f"Base.1.8.{message_id}",
                        "Message": message,
                        "Severity": "Warning",
                    }
                ],
            }
        }


@dataclass
class BmcState:
    """One node's BMC: power, boot override, event log. Guarded by ``lock``."""

    node: str
    power_state: str = "On"
    boot_target: str = "None"
    boot_enabled: str = "Disabled"
    boot_mode: str = "UEFI"
    boot_count: int = 0
    reset_count: int = 0
    last_reset_type: str | None = None
    last_boot_source: str = "Hdd"
    log: list[Json] = field(default_factory=list)
    sessions: dict[str, str] = field(default_factory=dict)
    system_uuid: str = ""
    """Derived from the node name when not given (stable across emulator restarts)."""
    serial: str = ""
    """``SN-<node>`` when not given (what the demo's Machines record)."""
    hostname: str = ""
    """The node name when not given."""
    last_reset_time: str = field(default_factory=_precise_now)
    reset_posts: int = 0
    """Reset POSTs received, performed or not."""
    reset_posts_by_type: dict[str, int] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=lambda: dict(FAULTS))
    """The misbehaviour switches (see the module docstring and :data:`FAULTS`)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    boot_hook: str | None = None
    """URL POSTed to on every boot (see the module docstring); None: no hook."""
    boot_seconds: float = 0.0
    """How long a boot takes: PowerState reads Off until then (real servers: minutes)."""
    vm: Vm | None = None
    """The real machine this BMC powers (see the module docstring); None: emulated power."""
    power_lock: threading.Lock = field(default_factory=threading.Lock)
    """Serialises the VM's power operations (they run outside ``lock``)."""
    crashes_seen: int = 0
    os_shutdown_seconds: float = DEFAULT_OS_SHUTDOWN_S
    """How long the OS takes to shut down after a graceful request (see the module docstring)."""
    reset_types: tuple[str, ...] = RESET_TYPES
    """The ResetTypes this system allows (the action's AllowableValues)."""
    task_reset: bool = False
    """Answer an accepted Reset 202 with a Task instead of 204."""
    power_transitions: bool = False
    """Report PoweringOff / PoweringOn while the OS shuts down / the system boots."""
    reset_restarts_boot: bool = False
    """A reset during a boot starts it over (see the module docstring)."""
    graceful_joined: int = 0
    """Graceful requests that joined a shutdown already under way."""
    tasks: dict[str, Json] = field(default_factory=dict)
    requests: int = 0
    """HTTP requests received (a TLS handshake that failed is none)."""
    _shutdown: int = 0
    """Generation of the OS shutdown under way (0: none)."""
    _shutdown_type: str = ""
    _generations: int = 0
    _booting: bool = False
    _boots_started: int = 0
    """Boots started (by :meth:`_power_on`): which one a boot timer belongs to."""
    _reset_task: str | None = None
    """The Task of the reset just accepted (set by :meth:`reset` when ``task_reset``)."""

    def __post_init__(self) -> None:
        self.system_uuid = self.system_uuid or str(uuid.uuid5(uuid.NAMESPACE_DNS, self.node))
        self.serial = self.serial or f"SN-{self.node}"
        self.hostname = self.hostname or self.node

    def control(self) -> Json:
        """The switches as the control endpoint shows them."""
        return {
            **self.faults,
            "bootSeconds": self.boot_seconds,
            "osShutdownSeconds": self.os_shutdown_seconds,
            "resetTypes": list(self.reset_types),
            "taskReset": self.task_reset,
            "powerTransitions": self.power_transitions,
        }

    def set_control(self, body: Json) -> None:
        """Set switches; an unknown name or a wrong type is refused (400), nothing set."""
        for key, value in body.items():
            if key in ("bootSeconds", "osShutdownSeconds"):
                ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
            elif key in ("taskReset", "powerTransitions"):
                ok = isinstance(value, bool)
            elif key == "resetTypes":
                ok = (
                    isinstance(value, list)
                    and bool(value)
                    and all(isinstance(v, str) and v in RESET_TYPES for v in value)
                )
            elif key in FAULTS:
                want = type(FAULTS[key])
                ok = isinstance(value, want) or (
                    want is float and isinstance(value, int) and not isinstance(value, bool)
                )
                ok = ok and (isinstance(value, bool) or value >= 0)
            else:
                ok = False
            if not ok:
                raise RedfishError(
                    HTTPStatus.BAD_REQUEST,
                    "PropertyValueNotInList",
                    f"control {key}={value!r}: known switches {', '.join(sorted(FAULTS))}, "
                    "bootSeconds, osShutdownSeconds (numbers >= 0), taskReset, "
                    "powerTransitions (booleans), resetTypes (a list of ResetTypes)",
                )
        for key, value in body.items():
            if key == "bootSeconds":
                self.boot_seconds = float(value)
            elif key == "osShutdownSeconds":
                self.os_shutdown_seconds = float(value)
            elif key == "resetTypes":
                self.reset_types = tuple(value)
            elif key == "taskReset":
                self.task_reset = value
            elif key == "powerTransitions":
                self.power_transitions = value
            else:
                self.faults[key] = value

    def reported_power_state(self) -> str:
        """``PowerState`` as the BMC reports it (transitional values when it shows them)."""
        if self.power_transitions and self._shutdown:
            return "PoweringOff"
        if self.power_transitions and self._booting and self.power_state == "Off":
            return "PoweringOn"
        return self.power_state

    def take(self, switch: str) -> bool:
        """Use up one count of a ``next N POSTs`` switch; whether it applied."""
        if self.faults[switch] > 0:
            self.faults[switch] -= 1
            return True
        return False

    def record(self, message_id: str, message: str, severity: str = "OK") -> None:
        entry_id = str(len(self.log) + 1)
        self.log.append(
            {
                "@odata.id": f"{LOG}/Entries/{entry_id}",
                "@odata.type": "#LogEntry.v1_15_0.LogEntry",
                "Id": entry_id,
                "Name": f"Log Entry {entry_id}",
                "EntryType": "Event",
                "Severity": severity,
                "Created": _now(),
                "MessageId": message_id,
                "Message": message,
            }
        )

    def refresh(self) -> None:
        """A machine BMC reads the truth: PowerState from the VM, and a VM that stopped
        without being told is logged as a crash. Caller holds ``lock``."""
        if self.vm is None:
            return
        on = self.vm.is_on()
        if self.vm.crashes > self.crashes_seen:
            self.crashes_seen = self.vm.crashes
            self.record(
                "Gpufleet.1.0.SystemCrashed",
                f"{self.node}: the system stopped unexpectedly (power off)",
                "Critical",
            )
        if not self.power_lock.locked():
            self.power_state = "On" if on else "Off"

    def _in_background(self, what: str, *steps: Any) -> None:
        """Run the VM's power steps in order, after any already under way."""

        def run() -> None:
            with self.power_lock:
                for step in steps:
                    try:
                        step()
                    except Exception as exc:  # the BMC stays up; the log says what failed
                        with self.lock:
                            self.record(
                                "Gpufleet.1.0.PowerActionFailed",
                                f"{self.node}: {what}: {exc}",
                                "Critical",
                            )
                        print(f"[{self.node}] {what} failed: {exc}", flush=True)
                        return
            with self.lock:
                self.refresh()

        threading.Thread(target=run, name=f"power-{self.node}", daemon=True).start()

    def boot(self) -> None:
        """Power on and boot, consuming a one-time override."""
        self.power_state = "On"
        self._booting = False
        self.boot_count += 1
        source = self.boot_target if self.boot_enabled != "Disabled" else "Hdd"
        if source == "None":
            source = "Hdd"
        if self.vm is not None:
            source = "Pxe"  # no disk: the NIC is the only boot device
        self.last_boot_source = source
        self.record("Gpufleet.1.0.SystemBooted", f"{self.node} booted from {source}")
        if self.boot_enabled == "Once":
            self.boot_enabled = "Disabled"
            self.boot_target = "None"
        if self.boot_hook:
            _call_hook(self.node, self.boot_hook)

    def _power_on(self) -> None:
        """Boot now, or after ``boot_seconds`` (PowerState Off meanwhile)."""
        if self.boot_seconds <= 0:
            self.boot()
            return
        self.power_state = "Off"
        self._booting = True
        self._boots_started += 1
        started = self._boots_started

        def later() -> None:
            with self.lock:
                overtaken = self.reset_restarts_boot and started != self._boots_started
                if self.power_state == "Off" and self._booting and not overtaken:
                    self.boot()

        timer = threading.Timer(self.boot_seconds, later)
        timer.daemon = True
        timer.start()

    def reset(self, reset_type: str) -> None:
        """Carry out (or, graceful, start) one accepted reset. Caller holds ``lock``."""
        self._reset_task = None
        if reset_type not in RESET_TYPES:
            raise RedfishError(
                HTTPStatus.BAD_REQUEST,
                "ActionParameterValueNotInList",
                f"ResetType {reset_type!r} is not one of {', '.join(RESET_TYPES)}",
            )
        if reset_type not in self.reset_types:
            raise RedfishError(
                HTTPStatus.BAD_REQUEST,
                "ActionParameterNotSupported",
                f"ResetType {reset_type} is not supported by this system "
                f"(allowed: {', '.join(self.reset_types)}); nothing was done",
            )
        self.record(
            "Gpufleet.1.0.ResetRequested", f"{self.node}: ComputerSystem.Reset {reset_type}"
        )
        if self.vm is None and reset_type in GRACEFUL and self.power_state == "On":
            self._graceful(reset_type)
            return
        if reset_type in FORCED:
            self._shutdown = 0  # a forced reset overrides a graceful one under way
        self.reset_count += 1
        self.last_reset_type = reset_type
        self.last_reset_time = _precise_now()
        if self.task_reset:
            self._reset_task = self._new_task(reset_type, done=True)
        if self.vm is not None:
            self._reset_vm(reset_type, self.vm)
            return
        self._perform(reset_type)

    def _graceful(self, reset_type: str) -> None:
        """Ask the OS to shut down; the reset follows ``os_shutdown_seconds`` later."""
        if self._shutdown:
            self.graceful_joined += 1
            self.record(
                "Gpufleet.1.0.ShutdownInProgress",
                f"{self.node}: {reset_type} joins the {self._shutdown_type} under way",
            )
            return
        if self.faults["osIgnoresShutdown"]:
            return  # the OS never acts on the request (a hung kernel ignores ACPI)
        self.reset_count += 1
        self.last_reset_type = reset_type
        self._generations += 1
        self._shutdown, self._shutdown_type = self._generations, reset_type
        task = self._new_task(reset_type, done=False) if self.task_reset else None
        self._reset_task = task
        generation = self._shutdown
        self.record("Gpufleet.1.0.OsShutdownStarted", f"{self.node}: the OS is shutting down")

        def down() -> None:  # caller holds the lock
            if self._shutdown != generation:
                return  # overridden by a forced reset meanwhile
            self._shutdown = 0
            self.last_reset_time = _precise_now()
            self._perform(reset_type)
            if task is not None:
                self._finish_task(task)

        def later() -> None:
            with self.lock:
                down()

        if self.os_shutdown_seconds <= 0:
            down()
            return
        timer = threading.Timer(self.os_shutdown_seconds, later)
        timer.daemon = True
        timer.start()

    def _new_task(self, reset_type: str, *, done: bool) -> str:
        task_id = str(len(self.tasks) + 1)
        self.tasks[task_id] = {
            "@odata.id": f"{TASKS}/{task_id}",
            "@odata.type": "#Task.v1_7_0.Task",
            "Id": task_id,
            "Name": f"ComputerSystem.Reset {reset_type}",
            "TaskState": "Running",
            "TaskStatus": "OK",
            "StartTime": _now(),
            "Messages": [],
        }
        if done:
            self._finish_task(task_id)
        return task_id

    def _finish_task(self, task_id: str) -> None:
        self.tasks[task_id].update(TaskState="Completed", EndTime=_now(), PercentComplete=100)

    def _perform(self, reset_type: str) -> None:
        """The power side of a reset, now (emulated power)."""
        if reset_type in ("ForceOff", "GracefulShutdown"):
            self.power_state = "Off"
            self._booting = False
            self.record("Gpufleet.1.0.PowerOff", f"{self.node} powered off")
        elif reset_type in ("On", "ForceOn"):
            if self.power_state != "On":
                self._power_on()
        elif reset_type in ("GracefulRestart", "ForceRestart", "PowerCycle"):
            if reset_type == "PowerCycle" or self.power_state == "On":
                self.record("Gpufleet.1.0.PowerOff", f"{self.node} powered off")
            self._power_on()
        # Nmi: recorded only.

    GRACE_S = 30.0
    """How long a graceful shutdown waits for the guest before the power goes."""

    def _reset_vm(self, reset_type: str, vm: Vm) -> None:
        """The reset on the real machine. Caller holds ``lock``; the bookkeeping is done
        now, the power steps in the background."""
        on = vm.is_on()
        if reset_type in ("ForceOff", "GracefulShutdown"):
            grace = self.GRACE_S if reset_type == "GracefulShutdown" else 0.0
            self.power_state = "Off"
            self.record("Gpufleet.1.0.PowerOff", f"{self.node} powered off")
            self._in_background(reset_type, lambda: vm.power_off(grace=grace))
        elif reset_type in ("On", "ForceOn"):
            if not on:
                self.boot()
                self._in_background(reset_type, vm.power_on)
        elif reset_type == "ForceRestart":
            self.boot()
            self._in_background(reset_type, vm.reset)
        elif reset_type in ("GracefulRestart", "PowerCycle"):
            grace = self.GRACE_S if reset_type == "GracefulRestart" else 0.0
            if on:
                self.record("Gpufleet.1.0.PowerOff", f"{self.node} powered off")
            self.boot()
            self._in_background(reset_type, lambda: vm.power_off(grace=grace), vm.power_on)
        # Nmi: recorded only.

    def patch_system(self, body: Json) -> None:
        boot = body.get("Boot")
        if not isinstance(boot, dict) or not boot:
            raise RedfishError(
                HTTPStatus.BAD_REQUEST, "PropertyUnknown", "only the Boot properties can be patched"
            )
        allowed = {
            "BootSourceOverrideTarget": BOOT_TARGETS,
            "BootSourceOverrideEnabled": BOOT_ENABLED,
            "BootSourceOverrideMode": ("UEFI", "Legacy"),
        }
        for key, value in boot.items():
            if key not in allowed:
                raise RedfishError(
                    HTTPStatus.BAD_REQUEST, "PropertyUnknown", f"Boot.{key} is not writable"
                )
            if value not in allowed[key]:
                raise RedfishError(
                    HTTPStatus.BAD_REQUEST,
                    "PropertyValueNotInList",
                    f"Boot.{key}={value!r} is not one of {', '.join(allowed[key])}",
                )
        self.boot_target = boot.get("BootSourceOverrideTarget", self.boot_target)
        self.boot_enabled = boot.get("BootSourceOverrideEnabled", self.boot_enabled)
        self.boot_mode = boot.get("BootSourceOverrideMode", self.boot_mode)
        # DMTF: setting a target without saying how long applies it once.
        if (
            "BootSourceOverrideEnabled" not in boot
            and self.boot_enabled == "Disabled"
            and self.boot_target != "None"
        ):
            self.boot_enabled = "Once"
        self.record(
            "Gpufleet.1.0.BootOverrideSet",
            f"{self.node}: boot override {self.boot_target} ({self.boot_enabled})",
        )


def _call_hook(node: str, url: str) -> None:
    """POST ``{"node": ..., "event": "boot"}`` to a boot hook; failures are logged only
    (the boot itself happened, whatever the hook's receiver says)."""
    body = json.dumps({"node": node, "event": "boot"}).encode()
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            print(f"[{node}] boot hook {url}: HTTP {resp.status}", flush=True)
    except (urllib.error.URLError, OSError) as exc:
        print(f"[{node}] boot hook {url} failed: {exc}", flush=True)


def _collection(path: str, name: str, kind: str, members: list[str]) -> Json:
    return {
        "@odata.id": path,
        "@odata.type": f"#{kind}Collection.{kind}Collection",
        "Name": name,
        "Members@odata.count": len(members),
        "Members": [{"@odata.id": m} for m in members],
    }


def render(state: BmcState, path: str) -> Json | None:
    """The resource at ``path``, or None if there is none. Caller holds the lock."""
    path = path.rstrip("/") or "/"
    if path == "/redfish":
        return {"v1": "/redfish/v1/"}
    if path == "/redfish/v1":
        return {
            "@odata.id": "/redfish/v1",
            "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
            "Id": "RootService",
            "Name": f"BMC of {state.node}",
            "RedfishVersion": "1.17.0",
            "UUID": state.system_uuid,
            "Systems": {"@odata.id": "/redfish/v1/Systems"},
            "Managers": {"@odata.id": "/redfish/v1/Managers"},
            "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
            "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
            "TaskService": {"@odata.id": "/redfish/v1/TaskService"},
            "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
        }
    if path == "/redfish/v1/Systems":
        return _collection(path, "Computer System Collection", "ComputerSystem", [SYSTEM])
    if path == SYSTEM:
        return {
            "@odata.id": SYSTEM,
            "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
            "Id": "1",
            "Name": state.node,
            "HostName": state.hostname,
            "SystemType": "Physical",
            "Manufacturer": "gpufleet",
            "Model": "Emulated 8-GPU server",
            "SerialNumber": state.serial,
            "UUID": state.system_uuid,
            "PowerState": state.reported_power_state(),
            **(
                {"LastResetTime": state.last_reset_time}
                if state.faults["reportLastResetTime"]
                else {}
            ),
            "Status": {"State": "Enabled", "Health": "OK"},
            "Boot": {
                "BootSourceOverrideEnabled": state.boot_enabled,
                "BootSourceOverrideTarget": state.boot_target,
                "BootSourceOverrideTarget@Redfish.AllowableValues": list(BOOT_TARGETS),
                "BootSourceOverrideMode": state.boot_mode,
            },
            "LogServices": {"@odata.id": f"{SYSTEM}/LogServices"},
            "Links": {"ManagedBy": [{"@odata.id": MANAGER}], "Chassis": [{"@odata.id": CHASSIS}]},
            "Actions": {
                "#ComputerSystem.Reset": {
                    "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                    "@Redfish.ActionInfo": f"{SYSTEM}/ResetActionInfo",
                    "ResetType@Redfish.AllowableValues": list(state.reset_types),
                }
            },
            "Oem": {
                "Gpufleet": {
                    "ResetCount": state.reset_count,
                    "GracefulJoined": state.graceful_joined,
                    "ResetPosts": state.reset_posts,
                    "ResetPostsByType": dict(state.reset_posts_by_type),
                    "LastResetType": state.last_reset_type,
                    "BootCount": state.boot_count,
                    "LastBootSource": state.last_boot_source,
                }
            },
        }
    if path == f"{SYSTEM}/ResetActionInfo":
        return {
            "@odata.id": path,
            "@odata.type": "#ActionInfo.v1_3_0.ActionInfo",
            "Id": "ResetActionInfo",
            "Name": "Reset Action Info",
            "Parameters": [
                {
                    "Name": "ResetType",
                    "Required": True,
                    "DataType": "String",
                    "AllowableValues": list(state.reset_types),
                }
            ],
        }
    if path == "/redfish/v1/TaskService":
        return {
            "@odata.id": path,
            "@odata.type": "#TaskService.v1_2_0.TaskService",
            "Id": "TaskService",
            "Name": "Task Service",
            "ServiceEnabled": True,
            "Tasks": {"@odata.id": TASKS},
        }
    if path == TASKS:
        return _collection(
            path, "Task Collection", "Task", [t["@odata.id"] for t in state.tasks.values()]
        )
    if path.startswith(f"{TASKS}/"):
        return state.tasks.get(path.rsplit("/", 1)[1])
    if path == f"{SYSTEM}/LogServices":
        return _collection(path, "Log Service Collection", "LogService", [LOG])
    if path == LOG:
        return {
            "@odata.id": LOG,
            "@odata.type": "#LogService.v1_5_0.LogService",
            "Id": "EventLog",
            "Name": "Event Log",
            "Entries": {"@odata.id": f"{LOG}/Entries"},
        }
    if path == f"{LOG}/Entries":
        return {
            "@odata.id": path,
            "@odata.type": "#LogEntryCollection.LogEntryCollection",
            "Name": "Event Log Entries",
            "Members@odata.count": len(state.log),
            "Members": list(state.log),
        }
    if path.startswith(f"{LOG}/Entries/"):
        entry_id = path.rsplit("/", 1)[1]
        return next((e for e in state.log if e["Id"] == entry_id), None)
    if path == "/redfish/v1/Managers":
        return _collection(path, "Manager Collection", "Manager", [MANAGER])
    if path == MANAGER:
        return {
            "@odata.id": MANAGER,
            "@odata.type": "#Manager.v1_19_0.Manager",
            "Id": "BMC",
            "Name": f"BMC of {state.node}",
            "ManagerType": "BMC",
            "Status": {"State": "Enabled", "Health": "OK"},
            "Links": {"ManagerForServers": [{"@odata.id": SYSTEM}]},
        }
    if path == "/redfish/v1/Chassis":
        return _collection(path, "Chassis Collection", "Chassis", [CHASSIS])
    if path == CHASSIS:
        return {
            "@odata.id": CHASSIS,
            "@odata.type": "#Chassis.v1_25_0.Chassis",
            "Id": "1",
            "Name": f"Chassis of {state.node}",
            "ChassisType": "RackMount",
            "PowerState": state.reported_power_state(),
            "Links": {
                "ComputerSystems": [{"@odata.id": SYSTEM}],
                "ManagedBy": [{"@odata.id": MANAGER}],
            },
        }
    if path == "/redfish/v1/SessionService":
        return {
            "@odata.id": path,
            "@odata.type": "#SessionService.v1_1_9.SessionService",
            "Id": "SessionService",
            "Name": "Session Service",
            "ServiceEnabled": True,
            "Sessions": {"@odata.id": f"{path}/Sessions"},
        }
    if path == "/redfish/v1/SessionService/Sessions":
        return _collection(
            path,
            "Session Collection",
            "Session",
            [f"{path}/{sid}" for sid in state.sessions.values()],
        )
    return None


class _Handler(BaseHTTPRequestHandler):
    server_version = "gpufleet-bmc/1"
    protocol_version = "HTTP/1.1"

    @property
    def bmc(self) -> BmcState:
        return self.server.bmc  # type: ignore[attr-defined,no-any-return]

    @property
    def credentials(self) -> tuple[str, str]:
        return self.server.credentials  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        print(f"[{self.bmc.node}] {self.address_string()} {format % args}", flush=True)

    def _send(
        self, status: HTTPStatus, body: Json | None = None, headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        try:
            self._write(status, data, body is not None, headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up waiting (a slow answer)

    def _write(
        self, status: HTTPStatus, data: bytes, is_json: bool, headers: dict[str, str] | None
    ) -> None:
        self.send_response(status)
        self.send_header("OData-Version", "4.0")
        if is_json:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Json:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise RedfishError(
                HTTPStatus.BAD_REQUEST, "MalformedJSON", f"body is not JSON: {exc}"
            ) from exc
        if not isinstance(body, dict):
            raise RedfishError(
                HTTPStatus.BAD_REQUEST, "MalformedJSON", "body must be a JSON object"
            )
        return body

    def _authorized(self) -> bool:
        token = self.headers.get("X-Auth-Token")
        if token is not None:
            return token in self.bmc.sessions
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        except ValueError:
            return False
        want_user, want_password = self.credentials
        return hmac.compare_digest(user, want_user) and hmac.compare_digest(password, want_password)

    def _handle(self, method: str) -> None:
        with self.bmc.lock:
            self.bmc.requests += 1
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self._answer_delay = 0.0
        try:
            # The service root and the session login are open, as the spec requires.
            open_paths = {"/redfish", "/redfish/v1"}
            login = method == "POST" and path == "/redfish/v1/SessionService/Sessions"
            if path not in open_paths and not login and not self._authorized():
                raise RedfishError(
                    HTTPStatus.UNAUTHORIZED, "NoValidSession", "authentication required"
                )
            if method == "GET" and path != CONTROL:
                delay = float(self.bmc.faults["getDelaySeconds"])
                if delay > 0:
                    time.sleep(delay)
            with self.bmc.lock:
                self.bmc.refresh()
                status, body, headers = self._dispatch(method, path)
        except RedfishError as err:
            extra = (
                {"WWW-Authenticate": 'Basic realm="BMC"'}
                if err.status == HTTPStatus.UNAUTHORIZED
                else {}
            )
            self._send(err.status, err.body, extra)
            return
        if self._answer_delay > 0:  # outside the lock: the BMC answers reads meanwhile
            time.sleep(self._answer_delay)
        self._send(status, body, headers)

    def _dispatch(self, method: str, path: str) -> tuple[HTTPStatus, Json | None, dict[str, str]]:
        bmc = self.bmc
        if path == CONTROL and method in ("GET", "PATCH"):
            if method == "PATCH":
                bmc.set_control(self._body())
            return HTTPStatus.OK, bmc.control(), {}
        if method == "GET":
            resource = render(bmc, path)
            if resource is None:
                raise RedfishError(
                    HTTPStatus.NOT_FOUND, "ResourceMissingAtURI", f"no resource at {path}"
                )
            return HTTPStatus.OK, resource, {}
        if method == "POST" and path == RESET_ACTION:
            reset_type = str(self._body().get("ResetType", ""))
            bmc.reset_posts += 1
            bmc.reset_posts_by_type[reset_type] = bmc.reset_posts_by_type.get(reset_type, 0) + 1
            if bmc.take("refuse"):
                raise RedfishError(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    "ServiceTemporarilyUnavailable",
                    "the service is busy; the reset was not performed",
                )
            bmc.reset(reset_type)
            if bmc.take("failAfterReset"):
                raise RedfishError(
                    HTTPStatus.INTERNAL_SERVER_ERROR, "InternalError", "internal error"
                )
            if bmc.take("slowAnswers"):
                self._answer_delay = float(bmc.faults["slowAnswerSeconds"])
            task = bmc._reset_task
            if task is not None:
                return HTTPStatus.ACCEPTED, dict(bmc.tasks[task]), {"Location": f"{TASKS}/{task}"}
            return HTTPStatus.NO_CONTENT, None, {}
        if method == "PATCH" and path == SYSTEM:
            bmc.patch_system(self._body())
            return HTTPStatus.NO_CONTENT, None, {}
        if method == "POST" and path == "/redfish/v1/SessionService/Sessions":
            body = self._body()
            want_user, want_password = self.credentials
            if not (
                hmac.compare_digest(str(body.get("UserName", "")), want_user)
                and hmac.compare_digest(str(body.get("Password", "")), want_password)
            ):
                raise RedfishError(
                    HTTPStatus.UNAUTHORIZED, "NoValidSession", "bad user name or password"
                )
            token = secrets.token_hex(16)
            sid = str(len(bmc.sessions) + 1)
            bmc.sessions[token] = sid
            location = f"/redfish/v1/SessionService/Sessions/{sid}"
            session = {"@odata.id": location, "Id": sid, "UserName": want_user}
            return HTTPStatus.CREATED, session, {"X-Auth-Token": token, "Location": location}
        if method == "DELETE" and path.startswith("/redfish/v1/SessionService/Sessions/"):
            sid = path.rsplit("/", 1)[1]
            for token, s in list(bmc.sessions.items()):
                if s == sid:
                    del bmc.sessions[token]
                    return HTTPStatus.NO_CONTENT, None, {}
            raise RedfishError(HTTPStatus.NOT_FOUND, "ResourceMissingAtURI", f"no session {sid}")
        if render(bmc, path) is not None:
            raise RedfishError(
                HTTPStatus.METHOD_NOT_ALLOWED, "OperationNotAllowed", f"{method} {path}"
            )
        raise RedfishError(HTTPStatus.NOT_FOUND, "ResourceMissingAtURI", f"no resource at {path}")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


def vm_from_config(entry: Json, system_uuid: str = "") -> Vm:
    """A :class:`Vm` from a BMC entry's ``vm`` object (paths as strings); its SMBIOS
    UUID is the one its BMC reports."""
    return Vm(
        VmSpec(
            name=str(entry["name"]),
            mac=str(entry["mac"]),
            boot_url=str(entry["boot_url"]),
            console_log=Path(entry["console_log"]),
            state_dir=Path(entry["state_dir"]),
            memory_mib=int(entry.get("memory_mib", 1536)),
            cpus=int(entry.get("cpus", 1)),
            serial=str(entry.get("serial", "")),
            forwards=tuple(Forward(int(h), int(g)) for h, g in entry.get("forwards", [])),
            guest_ports=tuple(int(p) for p in entry.get("guest_ports", [])),
            fabric_socket=Path(entry["fabric_socket"]) if entry.get("fabric_socket") else None,
            fabric_mac=str(entry.get("fabric_mac", "")),
            seed_disk=Path(entry["seed_disk"]) if entry.get("seed_disk") else None,
            uuid=system_uuid,
            **({"accel": str(entry["accel"])} if entry.get("accel") else {}),
        )
    )


class _TlsServer(ThreadingHTTPServer):
    """HTTPS. Each connection's handshake runs in its handler's thread (at its first
    read), so a client that refuses the certificate or stalls holds up no other one."""

    def __init__(self, address: tuple[str, int], tls: Json) -> None:
        super().__init__(address, _Handler)
        self.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ssl_context.load_cert_chain(str(tls["cert"]), str(tls["key"]))

    def get_request(self) -> tuple[Any, Any]:
        conn, addr = super().get_request()
        return self.ssl_context.wrap_socket(
            conn, server_side=True, do_handshake_on_connect=False
        ), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that refused the certificate leaves mid-handshake: one line, no traceback.
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):  # ssl.SSLError and a reset connection are OSErrors
            super().handle_error(request, client_address)
            return
        node = self.bmc.node  # type: ignore[attr-defined]
        print(f"[{node}] {client_address[0]} TLS: {type(exc).__name__}: {exc}", flush=True)


def serve(config: Json) -> list[ThreadingHTTPServer]:
    """Start one HTTP(S) server thread per BMC in ``config``; return the servers."""
    servers: list[ThreadingHTTPServer] = []
    poll = float(config.get("poll_interval", DEFAULT_POLL_INTERVAL_S))
    for bmc in config["bmcs"]:
        address = ("127.0.0.1", int(bmc["port"]))
        tls = bmc.get("tls") or config.get("tls")
        server = _TlsServer(address, tls) if tls else ThreadingHTTPServer(address, _Handler)
        server.daemon_threads = True
        state = BmcState(
            node=bmc["node"],
            boot_hook=bmc.get("boot_hook"),
            boot_seconds=float(bmc.get("boot_seconds", 0.0)),
            serial=str(bmc.get("serial", "")),
            hostname=str(bmc.get("hostname", "")),
            system_uuid=str(bmc.get("uuid", "")),
            power_state="Off" if bmc.get("vm") else "On",
            os_shutdown_seconds=float(bmc.get("os_shutdown_seconds", DEFAULT_OS_SHUTDOWN_S)),
            reset_types=tuple(bmc.get("reset_types") or RESET_TYPES),
            task_reset=bool(bmc.get("task_reset", False)),
            power_transitions=bool(bmc.get("power_transitions", False)),
            reset_restarts_boot=bool(bmc.get("reset_restarts_boot", False)),
        )
        vm = vm_from_config(bmc["vm"], state.system_uuid) if bmc.get("vm") else None
        state.vm = vm
        if vm is not None and bmc.get("power_on"):
            with state.lock:
                state.boot()
                state._in_background("power on", vm.power_on)
        server.bmc = state  # type: ignore[attr-defined]
        server.credentials = (config["user"], config["password"])  # type: ignore[attr-defined]
        threading.Thread(
            target=server.serve_forever, args=(poll,), name=f"bmc-{bmc['node']}", daemon=True
        ).start()
        servers.append(server)
    return servers


@contextmanager
def serving(config: Json) -> Iterator[list[ThreadingHTTPServer]]:
    """:func:`serve` for a ``with`` block: each server stopped and its socket closed after
    (tests' BMCs; the machines of ``vm`` entries are not powered off)."""
    servers = serve(config)
    try:
        yield servers
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Redfish BMC emulator, one endpoint per node.")
    parser.add_argument("config", type=Path, help="JSON: user, password, bmcs[{node, port}]")
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    servers = serve(config)
    print(f"serving {len(servers)} BMCs", flush=True)
    stop.wait()
    # The BMC state is throwaway and the server threads are daemons: close the
    # sockets and exit, rather than wait out each server's poll interval. The
    # machines are ours: none outlives its BMC.
    for server in servers:
        server.server_close()
    power_off_all(servers)


def power_off_all(servers: list[ThreadingHTTPServer]) -> None:
    """End every machine the BMCs in ``servers`` started (all at once)."""
    vms = [s.bmc.vm for s in servers if s.bmc.vm is not None]  # type: ignore[attr-defined]
    threads = [threading.Thread(target=v.power_off, daemon=True) for v in vms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


if __name__ == "__main__":
    main()
