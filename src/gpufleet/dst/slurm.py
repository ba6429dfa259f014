"""In-memory Slurm behind the syncer's ports (:mod:`gpufleet.slurm.ports`).

slurmctld's part that matters to gpufleet's safety: nodes with a base state, flags
and a drain reason; running jobs allocated onto idle, undrained nodes at times the
scenario picks (so a job can land between the syncer's read and its DRAIN);
requeue; an administrator's drain and ``scontrol update state=resume`` (which
clears any drain, gpufleet's included); a node that reboots (down, its jobs lost,
then idle again with its drain kept); slurmctld or slurmrestd down.

:class:`SlurmRest` and :class:`Scontrol` are the syncer's clients for one process,
every call a scheduling point of the run (:meth:`World.port_call`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpufleet.domain import slurm_sync
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


@dataclass(frozen=True)
class Job:
    id: int
    node: str
    requeueable: bool = True
    uses_gpu: bool = True
    """False: the job is still in its prolog (no GPU process yet)."""
    started: float = 0.0
    """Wall time it was allocated."""


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
        if n.booting:
            return
        busy = any(j.node == name for j in self.jobs.values())
        n.state = "allocated" if busy else "idle"

    def view(self, name: str) -> slurm_sync.SlurmView:
        n = self.nodes[name]
        return slurm_sync.SlurmView(n.state, frozenset(n.flags), n.reason)

    def jobs_on(self, name: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.node == name]

    def candidates(self) -> list[str]:
        """Nodes a new job can start on: idle, not drained, not down."""
        return [
            name
            for name, n in self.nodes.items()
            if n.state == "idle" and "DRAIN" not in n.flags and not n.booting
        ]

    # ------------------------------------------------------- the scheduler

    def start_job(self, node: str, *, requeueable: bool = True, uses_gpu: bool = True) -> Job:
        self._next_id += 1
        job = Job(self._next_id, node, requeueable, uses_gpu, self._now())
        self.jobs[job.id] = job
        self._settle(node)
        self._touch_nodes()
        self._touch_jobs()
        return job

    def end_job(self, job_id: int) -> Job | None:
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self._settle(job.node)
            self._touch_nodes()
            self._touch_jobs()
        return job

    def reboot(self, name: str) -> list[Job]:
        """The node goes down (its jobs are lost); :meth:`booted` brings it back."""
        lost = self.jobs_on(name)
        for j in lost:
            del self.jobs[j.id]
        n = self.nodes[name]
        n.booting = True
        n.state = "down"
        n.flags.add("NOT_RESPONDING")
        self._touch_nodes()
        self._touch_jobs()
        return lost

    def booted(self, name: str) -> None:
        n = self.nodes[name]
        n.booting = False
        n.flags.discard("NOT_RESPONDING")
        self._settle(name)
        self._touch_nodes()

    # ----------------------------------------------------------- the admin

    def admin_drain(self, name: str, reason: str) -> None:
        n = self.nodes[name]
        if "DRAIN" not in n.flags:
            self.drained_at[name] = self._now()
        n.flags.add("DRAIN")
        n.reason = reason
        self._touch_nodes()

    def admin_resume(self, name: str) -> None:
        """``scontrol update nodename=X state=resume``: clears any drain."""
        n = self.nodes[name]
        n.flags.discard("DRAIN")
        n.reason = None
        self.resumed_at[name] = self._now()
        self._touch_nodes()

    # --------------------------------------------------- what the ports do

    def drain(self, names: Sequence[str], reason: str) -> None:
        self._ctld("scontrol drain")
        unknown = [n for n in names if n not in self.nodes]
        if unknown:
            raise SlurmCommandFailed(["scontrol", "update"], 1, "Invalid node name specified")
        for name in names:
            self.admin_drain(name, reason)

    def undrain(self, names: Sequence[str]) -> None:
        self._ctld("scontrol undrain")
        for name in names:
            n = self.nodes[name]
            n.flags.discard("DRAIN")
            n.reason = None
        self._touch_nodes()

    def requeue(self, job_ids: Sequence[int]) -> None:
        self._ctld("scontrol requeue")
        for jid in job_ids:
            job = self.jobs.get(jid)
            if job is None:
                raise SlurmCommandFailed(["scontrol", "requeue"], 1, "Job is pending execution")
            if not job.requeueable:
                raise SlurmCommandFailed(["scontrol", "requeue"], 1, "Requeue of job disabled")
            self.end_job(jid)

    def job_views(self) -> list[slurm_sync.JobView]:
        return [
            slurm_sync.JobView(j.id, 100, j.requeueable, frozenset({j.node}))
            for j in self.jobs.values()
        ]


class SlurmRest(SlurmRestPort):
    """slurmrestd as one process sees it."""

    def __init__(self, world: World, proc: Proc) -> None:
        self.world = world
        self.proc = proc
        self.model = world.slurm
        self._version: str | None = None

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

    async def nodes(self) -> dict[str, slurm_sync.SlurmView]:
        m = self.model
        got = await self._read("GET /nodes", lambda: {n: m.view(n) for n in m.nodes})
        assert isinstance(got, dict)
        return got

    async def nodes_if_changed(self, since: float) -> dict[str, slurm_sync.SlurmView] | None:
        m = self.model
        got = await self._read(
            "GET /nodes?update_time",
            lambda: None if m.nodes_changed <= since else {n: m.view(n) for n in m.nodes},
        )
        assert got is None or isinstance(got, dict)
        return got

    async def node(self, name: str) -> slurm_sync.SlurmView | None:
        m = self.model
        got = await self._read(
            f"GET /node/{name}", lambda: m.view(name) if name in m.nodes else None
        )
        assert got is None or isinstance(got, slurm_sync.SlurmView)
        return got

    async def running_jobs(self) -> list[slurm_sync.JobView]:
        got = await self._read("GET /jobs", self.model.job_views)
        assert isinstance(got, list)
        return got

    async def running_jobs_if_changed(self, since: float) -> list[slurm_sync.JobView] | None:
        m = self.model
        got = await self._read(
            "GET /jobs?update_time",
            lambda: None if m.jobs_changed <= since else m.job_views(),
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

    async def reconfigure(self) -> None:
        await self._write("scontrol reconfigure", lambda: self.model._ctld("reconfigure"))


def _unavailable(what: str) -> SlurmError:
    return SlurmUnavailable(f"{what}: no answer (dst)")
