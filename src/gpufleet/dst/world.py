"""The simulated cluster: the models, the processes that run against them, and their deaths.

A :class:`World` holds one run: the deterministic loop, the apiserver, Slurm, the BMCs
and the node hardware, and the processes (controller replicas, the Slurm syncer, one
agent per node). A process is a series of incarnations (:class:`Proc`): each runs the
real product object built fresh, as a restarted pod would, and reaches the models
only through its own clients. Killing it (:meth:`World.crash`) is SIGKILL: its tasks
are cancelled, its watch streams end, and any call it still makes raises
``CancelledError`` without reaching a model; a restart builds a new object from what
the models hold.

Every call a process makes through a port is one scheduling point
(:meth:`World.port_call`): the seeded choice says how long it takes, whether it fails
before or after its effect, whether the caller dies there, and the call lands in the
trace. What the machines do when reset or powered off is here too
(:meth:`machine_reset`), because it touches every model at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet.domain.emptiness import pod_holds_node
from gpufleet.domain.ladder import Step
from gpufleet.dst.bmc import BmcModel, perform
from gpufleet.dst.choices import LATENCY, WATCH_DELAY, Choice, ChoiceSource, Odds
from gpufleet.dst.kube import ApiServer, _Sub
from gpufleet.dst.loop import DstLoop, VirtualClock
from gpufleet.dst.node import NodeHardware
from gpufleet.dst.slurm import SlurmModel
from gpufleet.dst.trace import Trace
from gpufleet.kubeapi import PODS, ApiError
from gpufleet.remediate.redfish import BmcUnreachable, RedfishError
from gpufleet.slurm.errors import SlurmError

if TYPE_CHECKING:
    from gpufleet.dst.slurmd import SlurmdFleet

T = TypeVar("T")
log = logging.getLogger("gpufleet.dst")

CURRENT: contextvars.ContextVar[Proc | None] = contextvars.ContextVar("dst_proc", default=None)
"""The process whose code is running (tasks inherit it from the task that made them)."""

GPU_ANNOTATION = "dst.gpufleet.io/uses-gpu"
"""On a pod: ``true`` when its containers hold the GPUs (the agent's GPU-busy reading)."""


class Proc:
    """One incarnation of a process. Dead is dead: a restart is a new :class:`Proc`."""

    def __init__(self, name: str, identity: str, incarnation: int, *, crashable: bool) -> None:
        self.name = name
        self.identity = identity
        self.incarnation = incarnation
        self.crashable = crashable
        self.alive = True
        self.tasks: dict[asyncio.Task[Any], None] = {}
        """Its tasks, in the order they were made (cancelled in that order: a set would
        order them by address, which differs from run to run)."""
        self.subs: list[_Sub] = []
        self.obj: Any = None
        """The product object this incarnation runs (Controller, Syncer, Agent)."""

    @property
    def label(self) -> str:
        return f"{self.name}#{self.incarnation}"

    def check_alive(self) -> None:
        """SIGKILL semantics: a dead process's code gets nowhere."""
        if not self.alive:
            raise asyncio.CancelledError(f"{self.label} is dead")


@dataclass
class ProcSpec:
    """How to run a process: its account, its main, how soon it comes back after dying."""

    identity: str
    main: Callable[[World, Proc], Coroutine[Any, Any, None]]
    restart_s: float = 5.0
    crashable: bool = True


@dataclass
class Violation:
    """An invariant that did not hold, where and when."""

    invariant: str
    at: float
    node: str
    text: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def category(self) -> str:
        """The invariant and the route that broke it (``1/after-failed-verification``)."""
        return str(self.detail.get("category") or self.invariant)

    def line(self) -> str:
        return f"[{self.category}] t={self.at:.3f} node={self.node}: {self.text}"


class World:
    """One run's loop, models and processes."""

    def __init__(
        self,
        seed: int,
        node_names: list[str],
        *,
        replay: list[int] | None = None,
        shuffle: bool = True,
        odds: Odds | None = None,
        keep_trace: bool = True,
    ) -> None:
        self.seed = seed
        self.loop = DstLoop(random.Random(f"loop-{seed}"), shuffle=shuffle)
        self.loop.task_hook = self._task_made
        self.clock = VirtualClock(self.loop)
        self.choices = ChoiceSource(seed, replay=replay, odds=odds)
        self.trace = Trace(self.loop.time, keep=keep_trace)
        self.api = ApiServer(
            now=self.loop.time,
            wall=self.clock.now,
            later=self._later,
            watch_delay=self._watch_delay,
        )
        self.node_names = list(node_names)
        self.slurm = SlurmModel(node_names, self.clock.now)
        self.bmcs: dict[str, BmcModel] = {}
        self.hw: dict[str, NodeHardware] = {n: NodeHardware(self, n) for n in node_names}
        self.specs: dict[str, ProcSpec] = {}
        self.procs: dict[str, Proc] = {}
        self._incarnations: dict[str, int] = {}
        self._stopped: set[str] = set()
        """Processes that stay down until started again (a powered-off node's agent)."""
        self.partitions: dict[str, float] = {}
        """Process name -> until when its apiserver connection is cut."""
        self.violations: list[Violation] = []
        self.stop_on_violation = True
        self.on_reset: list[Callable[[Proc, BmcModel, str, float], None]] = []
        """Called as a BMC accepts a reset: (caller, BMC, reset type, when it was sent)."""
        self.on_gpu_reset: list[Callable[[str, int | None], None]] = []
        self.pod_looks: dict[tuple[str, str], float] = {}
        """(process label, node) -> when the apiserver last listed that node's pods for
        that process: the moment of a look, not of its answer's arrival."""
        self.slurm_looks: dict[tuple[str, str], float] = {}
        """(process label, node) -> when slurmctld last answered that process about the node."""
        self.job_looks: dict[str, float] = {}
        """Process label -> when slurmctld last answered it with the running jobs."""
        self.slurmd: SlurmdFleet | None = None
        """The slurmd DaemonSet and its roll, in a run that has them (``Config.slurmd_roll``)."""
        self.on_disk_boot: list[Callable[[BmcModel], None]] = []
        """Called as a machine whose reset found a network boot armed boots its disk
        instead: the override was removed while its firmware was starting."""

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        self.loop.call_later(delay, fn)

    # ------------------------------------------------------------- processes

    def _task_made(self, task: asyncio.Task[Any]) -> None:
        proc = CURRENT.get()
        if proc is not None:
            proc.tasks[task] = None
            task.add_done_callback(lambda t: proc.tasks.pop(t, None))

    def current_proc(self) -> Proc:
        proc = CURRENT.get()
        if proc is None:
            raise RuntimeError("a port was used outside any process")
        return proc

    def add_process(self, name: str, spec: ProcSpec) -> None:
        self.specs[name] = spec

    def start(self, name: str) -> Proc:
        """Start a new incarnation of ``name`` (the previous one must be dead)."""
        old = self.procs.get(name)
        if old is not None and old.alive:
            return old
        self._stopped.discard(name)
        spec = self.specs[name]
        n = self._incarnations.get(name, 0) + 1
        self._incarnations[name] = n
        proc = Proc(name, spec.identity, n, crashable=spec.crashable)
        self.procs[name] = proc
        ctx = contextvars.Context()
        ctx.run(CURRENT.set, proc)
        self.trace.add(proc.label, "start", "running", key=True)
        self.loop.create_task(self._main(proc, spec), context=ctx)
        return proc

    async def _main(self, proc: Proc, spec: ProcSpec) -> None:
        try:
            await spec.main(self, proc)
            why = "exited"
        except asyncio.CancelledError:
            return
        except Exception as exc:
            why = f"exited: {type(exc).__name__}: {exc}"[:200]
        if proc.alive:
            self.crash(proc, why, restart_s=spec.restart_s)

    def crash(self, proc: Proc, why: str, *, restart_s: float | None = None) -> None:
        """SIGKILL ``proc``; start it again after ``restart_s`` (None: the spec's)."""
        if not proc.alive:
            return
        proc.alive = False
        self.trace.add(proc.label, "killed", why, key=True)
        self.api.close_subs(lambda s: s in proc.subs, None)
        for task in list(proc.tasks):
            task.cancel()
        delay = self.specs[proc.name].restart_s if restart_s is None else restart_s
        if delay >= 0:

            def again() -> None:
                if proc.name not in self._stopped and self.procs.get(proc.name) is proc:
                    self.start(proc.name)

            self.loop.call_later(delay, again)

    def kill(self, name: str, *, restart_s: float | None, why: str) -> None:
        """The environment kills a process (restart_s None: it stays down until started)."""
        proc = self.procs.get(name)
        if restart_s is None:
            self._stopped.add(name)
        if proc is not None and proc.alive:
            self.crash(proc, why, restart_s=-1 if restart_s is None else restart_s)

    def watching(self, proc: Proc, sub: _Sub) -> None:
        proc.subs = [s for s in proc.subs if s in self.api._subs]
        proc.subs.append(sub)

    def partitioned(self, proc: Proc) -> bool:
        until = self.partitions.get(proc.name)
        return until is not None and self.loop.time() < until

    def partition(self, name: str, seconds: float) -> None:
        self.partitions[name] = self.loop.time() + seconds
        proc = self.procs.get(name)
        if proc is not None:
            err = ApiError("watch", None, "connection lost (partition)")
            self.api.close_subs(lambda s: s in proc.subs, err)

    # ------------------------------------------------------------------ ports

    def _watch_delay(self) -> tuple[float, bool]:
        c = self.choices.watch()
        return WATCH_DELAY[c], c == 4

    async def port_call(
        self,
        proc: Proc,
        port: str,
        what: str,
        effect: Callable[[], T],
        *,
        writes: bool,
        error: Callable[[str], BaseException],
        lost: Callable[[str], BaseException] | None = None,
        key: bool = False,
    ) -> T:
        """One call through a port: latency, failure, death at this await, the effect."""
        proc.check_alive()
        c = self.choices.call(crashable=proc.crashable, writes=writes)
        label = proc.label
        if port == "kube" and self.partitioned(proc):
            await asyncio.sleep(1.0)
            proc.check_alive()
            self.trace.add(label, what, "partitioned")
            raise error(what)
        half = LATENCY.get(c, LATENCY[0]) / 2
        await asyncio.sleep(half)
        proc.check_alive()
        if c == Choice.ERROR:
            self.trace.add(label, what, "no answer, not done", key=key)
            raise error(what)
        if c == Choice.CRASH_BEFORE:
            self.trace.add(label, what, "caller killed before it arrived", key=True)
            self.crash(proc, f"killed at {what}")
            raise asyncio.CancelledError()
        try:
            result = effect()
            if c == Choice.DUPLICATE:
                with contextlib.suppress(ApiError, SlurmError, RedfishError):
                    effect()
        except (ApiError, SlurmError, RedfishError) as exc:
            self.trace.add(label, what, f"{type(exc).__name__}", key=key)
            await asyncio.sleep(half)
            proc.check_alive()
            raise
        if c == Choice.LOST:
            self.trace.add(label, what, "done, answer lost", key=key)
            await asyncio.sleep(half)
            proc.check_alive()
            raise (lost or error)(what)
        if c == Choice.CRASH_AFTER:
            self.trace.add(label, what, "done, caller killed before the answer", key=True)
            self.crash(proc, f"killed after {what}")
            raise asyncio.CancelledError()
        self.trace.add(label, what, "ok" if c != Choice.DUPLICATE else "ok (sent twice)", key=key)
        await asyncio.sleep(half)
        proc.check_alive()
        return result

    # -------------------------------------------------------------- machines

    def add_bmc(self, model: BmcModel) -> None:
        self.bmcs[model.endpoint] = model

    def bmc_at(self, endpoint: str) -> BmcModel:
        model = self.bmcs.get(endpoint)
        if model is None:
            raise BmcUnreachable(endpoint, "no BMC answers at this address")
        return model

    def bmc_of(self, node: str) -> BmcModel:
        return next(m for m in self.bmcs.values() if m.node == node)

    def bmc_reset(self, proc: Proc, model: BmcModel, reset_type: str, sent: float) -> None:
        """A BMC accepted a reset sent at ``sent``: the invariants look, then the machine
        does it."""
        for hook in self.on_reset:
            hook(proc, model, reset_type, sent)
        perform(self, model, reset_type)

    def machine_off(self, model: BmcModel) -> None:
        node = model.node
        model.firmware_reads = False  # powered off while starting: nothing reads the boot
        self.kill(f"agent-{node}", restart_s=None, why="machine powered off")
        for job in self.slurm.reboot(node):
            self.trace.add(
                "slurmctld", f"job {job.id} on {node}", "lost: node powered off", key=True
            )

    def machine_reset(self, model: BmcModel, reset_type: str) -> None:
        """The machine restarted: its agent dies and comes back, Slurm loses its jobs, the
        GPU trouble the reset fixes is gone (a one-time network boot reimages it)."""
        node = model.node
        self.trace.add(f"bmc-{node}", f"reset {reset_type}", "performed", key=True)
        agent = f"agent-{node}"
        self.kill(agent, restart_s=None, why=f"machine reset ({reset_type})")
        for job in self.slurm.reboot(node):
            self.trace.add("slurmctld", f"job {job.id} on {node}", "lost: node rebooted", key=True)
        hw = self.hw[node]
        by_reset = Step.POWER_CYCLE if reset_type in ("PowerCycle", "On") else Step.REBOOT
        # The BMC shows the machine on at once; its firmware reads a one-time network
        # boot only as it starts, here when the boot ends (a real one: a minute or more).
        network = model.boot_override is not None
        this_reset = model.resets
        model.firmware_reads = network
        if not network:
            hw.fixed(by_reset)

        def booted() -> None:
            if model.resets == this_reset:
                model.firmware_reads = False
            if network and model.resets == this_reset:  # a later reset boots on its own
                if model.boot_override is None:
                    hw.fixed(by_reset)
                    for hook in self.on_disk_boot:
                        hook(model)
                else:
                    model.boot_override = None
                    model.network_boots += 1
                    hw.fixed(Step.REIMAGE)
            if model.power == "On":
                self.slurm.booted(node)
                self.start(agent)

        self.loop.call_later(model.boot_s, booted)

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.api.all(PODS)
            if (p.get("spec") or {}).get("nodeName") == node and pod_holds_node(p)
        ]

    def gpu_busy(self, node: str) -> bool:
        pods = any(
            (p["metadata"].get("annotations") or {}).get(GPU_ANNOTATION) == "true"
            for p in self.pods_on(node)
        )
        return pods or any(j.uses_gpu for j in self.slurm.jobs_on(node))

    def gpu_reset(self, node: str, index: int | None) -> None:
        self.trace.add(f"gpu-{node}", f"reset GPU {index}", "performed", key=True)
        for hook in self.on_gpu_reset:
            hook(node, index)

    # ------------------------------------------------------------- verdicts

    def violate(self, v: Violation) -> None:
        self.violations.append(v)
        self.trace.add("invariant", v.invariant, v.text, key=True)
        if self.stop_on_violation:
            self.loop.stop()  # after this iteration: the run ends at its first violation
