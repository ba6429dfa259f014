"""In-memory Slurm behind the syncer's ports (:mod:`gpufleet.slurm.ports`).

slurmctld's part that matters to gpufleet's safety: nodes with a base state, flags
and a drain reason; running jobs allocated onto idle, undrained nodes at times the
scenario picks (so a job can land between the syncer's read and its DRAIN);
requeue (also of a job that finished after a departure notice: Slurm requeues a
finished batch job, whatever its exit code); ``scancel --signal`` (the departure notice,
which a job that asks for one answers by leaving after a while with exit code 75, by
finishing its work with exit 0, or ignores: :mod:`gpufleet.dst.notices`);
an administrator's drain and ``scontrol update state=resume`` (which clears any
drain, gpufleet's included); a node that reboots (down, its jobs lost, then idle
again with its drain kept); slurmctld or slurmrestd down; each node's slurmd, which
stops with its pod (its jobs lost, the node not responding) and registers again
with a new start time (:mod:`gpufleet.dst.slurmd`).

:class:`SlurmRest` and :class:`Scontrol` are the syncer's clients for one process,
every call a scheduling point of the run (:meth:`World.port_call`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpufleet.domain import departure, slurm_sync
from gpufleet.domain.slurm_reasons import NOT_RESPONDING_SUFFIX
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmError, SlurmUnavailable
from gpufleet.slurm.ports import ScontrolPort, SlurmRestPort

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpufleet.dst.world import Proc, World


@dataclass
class SNode:
    state: str = "idle"
    flags: set[str] = field(default_factory=set)
    reason: str | None = None
    booting: bool = False
    slurmd: bool = True
    """A slurmd runs on the node (False between its pod's deletion and the new one's)."""
    slurmd_started: float | None = None
    """Wall time the running slurmd registered (``slurmd_start_time``)."""


@dataclass(frozen=True)
class Job:
    id: int
    node: str
    requeueable: bool = True
    uses_gpu: bool = True
    """False: the job is still in its prolog (no GPU process yet)."""
    started: float = 0.0
    """Wall time it was allocated."""
    also: tuple[str, ...] = ()
    """The allocation's other nodes (a pod group's job, :mod:`gpufleet.dst.pods`)."""
    notice: bool = False
    """Its comment asks for a departure notice (``gpufleet.io/notice``)."""
    depart_s: float | None = None
    """Seconds after its first notice it leaves (its steps end, the batch script with
    them); None: it ignores the notice."""
    depart_code: int = departure.DEPARTED_EXIT_CODE
    """The exit code it ends with then: 75, it wants to come back; 0, its work was done
    (it must not run again, docs/decisions/0279)."""

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.also)


class SlurmModel:
    """slurmctld's nodes and running jobs."""

    def __init__(self, names: Sequence[str], now: Callable[[], float]) -> None:
        self._now = now
        self.nodes: dict[str, SNode] = {n: SNode() for n in names}
        self.jobs: dict[int, Job] = {}
        self.ctld_down = False
        self.restd_down = False
        self.nodes_changed = 0.0
        self.jobs_changed = 0.0
        self._next_id = 1000
        self.drained_at: dict[str, float] = {}
        """Node -> when its DRAIN flag was last set (wall time)."""
        self.resumed_at: dict[str, float] = {}
        """Node -> when an administrator last resumed it (wall time)."""
        self.on_write: list[Callable[[str, str, str | None], None]] = []
        """Called before a port's drain or undrain changes a node: (verb, node, reason)."""
        self.on_end: list[Callable[[int, str], None]] = []
        """Called as a node's stop ends a job: (job id, the state it ends in)."""
        self.on_requeue: list[Callable[[int], None]] = []
        """Called as ``scontrol requeue`` takes a running job off its nodes."""
        self.on_signal: list[Callable[[Job], None]] = []
        """Called as a job's steps get their first departure notice."""
        self.signalled: dict[int, float] = {}
        """Job -> when (wall time) its steps were first signalled."""
        self.finished: dict[int, tuple[Job, float]] = {}
        """Signalled jobs that ended by themselves (wall time), not requeued yet: Slurm
        still requeues them (MinJobAge)."""
        self.requeued_finished: set[int] = set()
        """Finished jobs a ``scontrol requeue`` brought back."""
        self.ended: dict[int, departure.Ended] = {}
        """Jobs that asked for a notice and ended (not requeued since): what ``/jobs``
        says of them (kept for the whole run; Slurm keeps them for MinJobAge)."""
        self.done_noticed: dict[int, float] = {}
        """Signalled jobs that ended by themselves otherwise than departing (wall time)."""
        self.rerun: set[int] = set()
        """Jobs of :attr:`done_noticed` a ``scontrol requeue`` brought back (invariant 18)."""
        self.reason_at: dict[str, float] = {}
        """Node -> when its drain reason was last set (wall time)."""
        self.release: str = "22.05"
        """The slurmctld whose ways are modelled. ``24.11`` (the chart's, with the slurmd
        roll): a resume keeps the node's reason (no accounting storage, Slurm issue
        50933), and a drained node whose slurmd is away past ``SlurmdTimeout`` goes down
        with ``: Not responding`` appended to its reason, which stays once it registers."""

    # -------------------------------------------------------------- helpers

    def _up(self, what: str) -> None:
        if self.ctld_down or self.restd_down:
            raise SlurmUnavailable(f"{what}: slurm{'ctld' if self.ctld_down else 'restd'} down")

    def _ctld(self, what: str) -> None:
        if self.ctld_down:
            raise SlurmUnavailable(f"{what}: slurmctld down")

    def _touch_nodes(self) -> None:
        self.nodes_changed = self._now()

    def _touch_jobs(self) -> None:
        self.jobs_changed = self._now()

    def _settle(self, name: str) -> None:
        n = self.nodes[name]
        if n.booting or (n.state == "down" and not n.slurmd):
            return
        busy = any(name in j.nodes for j in self.jobs.values())
        n.state = "allocated" if busy else "idle"

    def view(self, name: str) -> slurm_sync.SlurmView:
        n = self.nodes[name]
        return slurm_sync.SlurmView(
            n.state, frozenset(n.flags), n.reason, slurmd_started=n.slurmd_started
        )

    def jobs_on(self, name: str) -> list[Job]:
        return [j for j in self.jobs.values() if name in j.nodes]

    def candidates(self) -> list[str]:
        """Nodes a new job can start on: idle, not drained, not down."""
        return [
            name
            for name, n in self.nodes.items()
            if n.state == "idle" and not n.flags & {"DRAIN", "NOT_RESPONDING"} and not n.booting
        ]

    def _lose(self, name: str) -> list[Job]:
        """The jobs on a node that stops: gone, their other nodes freed."""
        lost = self.jobs_on(name)
        for j in lost:
            del self.jobs[j.id]
            for other in j.nodes:
                if other != name:
                    self._settle(other)
            if j.notice:
                self.ended[j.id] = departure.Ended("NODE_FAIL", 0)
            for hook in self.on_end:
                hook(j.id, "NODE_FAIL")
        return lost

    # ------------------------------------------------------- the scheduler

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def start_job(
        self,
        node: str,
        *,
        requeueable: bool = True,
        uses_gpu: bool = True,
        job_id: int | None = None,
        also: tuple[str, ...] = (),
        notice: bool = False,
        depart_s: float | None = None,
        depart_code: int = departure.DEPARTED_EXIT_CODE,
    ) -> Job:
        """Allocate a job (``job_id``: a pending one's, keeping its id) onto its nodes."""
        jid = self.new_id() if job_id is None else job_id
        job = Job(
            jid, node, requeueable, uses_gpu, self._now(), also, notice, depart_s, depart_code
        )
        self.jobs[job.id] = job
        for name in job.nodes:
            self._settle(name)
        self._touch_nodes()
        self._touch_jobs()
        return job

    def end_job(self, job_id: int, *, by_itself: bool = True, exit_code: int = 0) -> Job | None:
        """The job ends: by itself with ``exit_code`` (a departure: 75), or requeued."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            record = departure.Ended("COMPLETED" if exit_code == 0 else "FAILED", exit_code)
            if by_itself and job.notice:
                self.ended[job_id] = record
            if by_itself and job_id in self.signalled:
                if record.departed:
                    self.finished[job_id] = (job, self._now())
                else:
                    self.done_noticed[job_id] = self._now()
            for name in job.nodes:
                self._settle(name)
            self._touch_nodes()
            self._touch_jobs()
        return job

    def reboot(self, name: str) -> list[Job]:
        """The node goes down (its jobs are lost); :meth:`booted` brings it back."""
        lost = self._lose(name)
        n = self.nodes[name]
        n.booting = True
        n.state = "down"
        n.flags.add("NOT_RESPONDING")
        self._touch_nodes()
        self._touch_jobs()
        return lost

    def booted(self, name: str) -> None:
        """The machine is up again: its slurmd (if its pod has one) registers anew."""
        n = self.nodes[name]
        n.booting = False
        if n.slurmd:
            n.flags.discard("NOT_RESPONDING")
            n.slurmd_started = self._now()
        self._settle(name)
        self._touch_nodes()

    def slurmd_stopped(self, name: str) -> list[Job]:
        """The node's slurmd pod is being deleted: slurmd and its job steps (in the pod's
        cgroup) end; slurmctld stops hearing from the node."""
        lost = self._lose(name)
        n = self.nodes[name]
        n.slurmd = False
        n.flags.add("NOT_RESPONDING")
        self._settle(name)
        self._touch_nodes()
        self._touch_jobs()
        return lost

    def not_responding(self, name: str) -> None:
        """``SlurmdTimeout`` passed with no slurmd: slurmctld marks the node down
        (``set_node_down_ptr``); 24.11 appends to a reason it has."""
        n = self.nodes[name]
        if n.slurmd or n.booting:
            return
        n.state = "down"
        if n.reason and self.release == "24.11":
            if NOT_RESPONDING_SUFFIX not in n.reason:
                n.reason += NOT_RESPONDING_SUFFIX
        elif not n.reason:
            n.reason = "Not responding"
        self._touch_nodes()

    def slurmd_registered(self, name: str) -> None:
        """A new slurmd registered with slurmctld (its pod started)."""
        n = self.nodes[name]
        n.slurmd = True
        n.slurmd_started = self._now()
        if not n.booting:
            n.flags.discard("NOT_RESPONDING")
            if n.state == "down":  # ReturnToService=2: the DOWN goes, a DRAIN and its reason stay
                n.state = "idle"
                if n.reason == "Not responding":
                    n.reason = None
        self._settle(name)
        self._touch_nodes()

    # ----------------------------------------------------------- the admin

    def admin_drain(self, name: str, reason: str) -> None:
        n = self.nodes[name]
        if "DRAIN" not in n.flags:
            self.drained_at[name] = self._now()
        n.flags.add("DRAIN")
        n.reason = reason
        self.reason_at[name] = self._now()
        self._touch_nodes()

    def _resume(self, n: SNode) -> None:
        n.flags.discard("DRAIN")
        if self.release != "24.11":
            n.reason = None

    def admin_resume(self, name: str) -> None:
        """``scontrol update nodename=X state=resume``: clears any drain."""
        self._resume(self.nodes[name])
        self.resumed_at[name] = self._now()
        self._touch_nodes()

    # --------------------------------------------------- what the ports do

    def drain(self, names: Sequence[str], reason: str) -> None:
        self._ctld("scontrol drain")
        unknown = [n for n in names if n not in self.nodes]
        if unknown:
            raise SlurmCommandFailed(["scontrol", "update"], 1, "Invalid node name specified")
        for name in names:
            for hook in self.on_write:
                hook("drain", name, reason)
            self.admin_drain(name, reason)

    def undrain(self, names: Sequence[str]) -> None:
        self._ctld("scontrol undrain")
        for name in names:
            for hook in self.on_write:
                hook("undrain", name, None)
            self._resume(self.nodes[name])
        self._touch_nodes()

    def requeue(self, job_ids: Sequence[int]) -> None:
        self._ctld("scontrol requeue")
        for jid in job_ids:
            job = self.jobs.get(jid)
            if job is None and jid in self.ended:
                del self.ended[jid]
                if self.finished.pop(jid, None) is not None:
                    self.requeued_finished.add(jid)
                if jid in self.done_noticed:
                    self.rerun.add(jid)
                self._touch_jobs()
                for hook in self.on_requeue:
                    hook(jid)
                continue
            if job is None:
                raise SlurmCommandFailed(["scontrol", "requeue"], 1, "Job is pending execution")
            if not job.requeueable:
                raise SlurmCommandFailed(["scontrol", "requeue"], 1, "Requeue of job disabled")
            self.end_job(jid, by_itself=False)
            for hook in self.on_requeue:
                hook(jid)

    def signal(self, job_id: int, signal: str) -> None:
        """``scancel --signal``: the job's steps get it; a job that asks for a notice
        leaves after its ``depart_s`` (:attr:`on_signal` schedules that)."""
        self._ctld(f"scancel --signal={signal}")
        job = self.jobs.get(job_id)
        if job is None:
            raise SlurmCommandFailed(["scancel"], 1, "Job/step already completing or completed")
        if job_id not in self.signalled:
            self.signalled[job_id] = self._now()
            for hook in self.on_signal:
                hook(job)

    def ended_views(self) -> dict[int, departure.Ended]:
        return dict(self.ended)

    def job_views(self) -> list[slurm_sync.JobView]:
        return [
            slurm_sync.JobView(j.id, 100, j.requeueable, frozenset(j.nodes), wants_notice=j.notice)
            for j in self.jobs.values()
        ]


class SlurmRest(SlurmRestPort):
    """slurmrestd as one process sees it."""

    def __init__(self, world: World, proc: Proc) -> None:
        self.world = world
        self.proc = proc
        self.model = world.slurm
        self._version: str | None = None
        self.ended_jobs: Mapping[int, departure.Ended] = {}

    @property
    def version(self) -> str | None:
        return self._version

    async def _read(self, what: str, fn: Callable[[], object]) -> object:
        def effect() -> object:
            self.model._up(what)
            return fn()

        return await self.world.port_call(
            self.proc, "slurm", what, effect, writes=False, error=_unavailable
        )

    async def connect(self) -> str:
        await self._read("GET /openapi", lambda: None)
        self._version = "v0.0.40"
        return self._version

    def _looked(self, names: Sequence[str]) -> None:
        """The moment slurmctld answered this process about these nodes (the checks
        count what changed after it as in flight)."""
        t = self.world.loop.time()
        for n in names:
            self.world.slurm_looks[(self.proc.label, n)] = t

    def _views(self) -> dict[str, slurm_sync.SlurmView]:
        m = self.model
        self._looked(list(m.nodes))
        return {n: m.view(n) for n in m.nodes}

    async def nodes(self) -> dict[str, slurm_sync.SlurmView]:
        got = await self._read("GET /nodes", self._views)
        assert isinstance(got, dict)
        return got

    async def nodes_if_changed(self, since: float) -> dict[str, slurm_sync.SlurmView] | None:
        m = self.model
        got = await self._read(
            "GET /nodes?update_time",
            lambda: None if m.nodes_changed <= since else self._views(),
        )
        assert got is None or isinstance(got, dict)
        return got

    async def node(self, name: str) -> slurm_sync.SlurmView | None:
        m = self.model

        def one() -> slurm_sync.SlurmView | None:
            self._looked([name])
            return m.view(name) if name in m.nodes else None

        got = await self._read(f"GET /node/{name}", one)
        assert got is None or isinstance(got, slurm_sync.SlurmView)
        return got

    def _jobs(self) -> list[slurm_sync.JobView]:
        self.world.job_looks[self.proc.label] = self.world.loop.time()
        self.ended_jobs = self.model.ended_views()
        return self.model.job_views()

    async def running_jobs(self) -> list[slurm_sync.JobView]:
        got = await self._read("GET /jobs", self._jobs)
        assert isinstance(got, list)
        return got

    async def running_jobs_if_changed(self, since: float) -> list[slurm_sync.JobView] | None:
        m = self.model
        got = await self._read(
            "GET /jobs?update_time",
            lambda: None if m.jobs_changed <= since else self._jobs(),
        )
        assert got is None or isinstance(got, list)
        return got


class Scontrol(ScontrolPort):
    """scontrol as one process runs it."""

    def __init__(self, world: World, proc: Proc) -> None:
        self.world = world
        self.proc = proc
        self.model = world.slurm

    async def _write(self, what: str, fn: Callable[[], None]) -> None:
        await self.world.port_call(
            self.proc, "slurm", what, fn, writes=True, error=_unavailable, key=True
        )

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        names = [node] if isinstance(node, str) else list(node)
        await self._write(
            f"scontrol drain {','.join(names)} '{reason}'", lambda: self.model.drain(names, reason)
        )

    async def undrain(self, node: str | Sequence[str]) -> None:
        names = [node] if isinstance(node, str) else list(node)
        await self._write(f"scontrol undrain {','.join(names)}", lambda: self.model.undrain(names))

    async def requeue(self, job_ids: Sequence[int]) -> None:
        ids = list(job_ids)
        await self._write(
            f"scontrol requeue {','.join(map(str, ids))}", lambda: self.model.requeue(ids)
        )

    async def signal_steps(self, job_id: int, signal: str) -> None:
        await self._write(
            f"scancel --signal={signal} {job_id}", lambda: self.model.signal(job_id, signal)
        )

    async def reconfigure(self) -> None:
        await self._write("scontrol reconfigure", lambda: self.model._ctld("reconfigure"))


def _unavailable(what: str) -> SlurmError:
    return SlurmUnavailable(f"{what}: no answer (dst)")
