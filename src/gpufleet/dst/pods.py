"""The pod scheduler in the simulation: pod groups, their Slurm jobs, the real loop.

With ``Config(pod_scheduler=True)`` (:func:`gpufleet.dst.scenario.with_pod_scheduler`)
the run has a process ``pod-scheduler`` that runs the real
:class:`~gpufleet.slurm.pod_scheduler.PodScheduler` (its watch, its passes, the real
:func:`~gpufleet.domain.pod_groups.plan` and :func:`~gpufleet.domain.pod_groups.node_fit`)
on its own :class:`~gpufleet.dst.kube.KubeClient` and :class:`PodJobs`, the simulated
Slurm behind :class:`~gpufleet.slurm.pod_jobs.PodJobPort`. Every call is a scheduling
point of the run, so its passes fall between the controller's, the syncer's and the
agents' steps where the seed says, and it can die at any of them.

The environment's ``pod-group`` event creates one or two pods of an explicit group
(``gpufleet.io/pod-group``) for the scheduler; they succeed (or, never bound, are
deleted by their owner) after their lifetime. slurmctld's part (:class:`PodQueue`): a
job is pending until as many nodes as it asks are idle, not drained, not down and not
in its ``ExcNodeList`` (:meth:`SlurmModel.candidates`, the rule the simulation's other
jobs start by), at submission and every :data:`CYCLE_S`; a running job is a
:class:`~gpufleet.dst.slurm.Job` on its nodes (invariant 1 counts it); a requeue puts
it back pending under its id; a node that stops ends it (``NODE_FAIL``); an ended job is
listed for :data:`MIN_JOB_AGE_S`, as Slurm's ``MinJobAge``. ``sbatch`` is one RPC from a
process the scheduler starts: a second delivery of one submission is not modelled.

Invariants (:class:`PodChecks`, docs/dst.md):

14. a pod of the scheduler is bound only onto a node that was fit (:func:`node_fit`) in
    the scheduler's last Node listing before the bind; a node that turned unfit after
    that listing is traced ``in flight`` (the drain then evicts the pod, invariant 1
    judges any reset);
15. never two live (pending or running) Slurm jobs for one group key;
16. the scheduler writes (binds, evicts, plans, rejects) only pods of its own
    ``schedulerName`` (16a) and cancels or requeues only jobs whose comment is its own
    (16b).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.domain import pod_groups as pg
from gpufleet.domain import well_known
from gpufleet.dst.kube import KubeClient, Write
from gpufleet.dst.world import GPU_ANNOTATION, Proc, ProcSpec, Violation
from gpufleet.kubeapi import NODES, PODS, ObjectList, Resource
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmError, SlurmUnavailable
from gpufleet.slurm.pod_jobs import SubmitRefused, comment_prefix
from gpufleet.slurm.pod_scheduler import COMPONENT, PodScheduler, SchedulerSettings

if TYPE_CHECKING:
    from gpufleet.dst.world import World

PROC = "pod-scheduler"
SETTINGS = SchedulerSettings()
"""Production's: a pass every 2 s, and every 0.25 s for 5 s after a submission."""
PREFIX = comment_prefix(SETTINGS.scheduler_name)
CYCLE_S = 2.0
"""slurmctld's scheduling cycle: a pending job that can start does, at the latest, then."""
MIN_JOB_AGE_S = 300.0
"""How long an ended job is still listed (Slurm's default ``MinJobAge``)."""
WORK_NS = "work"
LIVE = ("PENDING", "RUNNING")


@dataclass
class QueuedJob:
    id: int
    comment: str
    nodes: int
    gpu: bool
    state: str = "PENDING"
    exclude: set[str] = field(default_factory=set)
    ended_at: float | None = None


class PodQueue:
    """slurmctld's view of the pod scheduler's jobs, beside :class:`SlurmModel`'s."""

    def __init__(self, world: World, checks: PodChecks) -> None:
        self.world = world
        self.checks = checks
        self.jobs: dict[int, QueuedJob] = {}
        world.slurm.on_end.append(self._ended)
        world.slurm.on_requeue.append(self._requeued)

    def _ended(self, job_id: int, state: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.state == "RUNNING":
            job.state, job.ended_at = state, self.world.loop.time()

    def _requeued(self, job_id: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.state = "PENDING"

    def cycle(self) -> None:
        """Start every pending job that fits now, oldest first."""
        slurm = self.world.slurm
        for job in sorted(self.jobs.values(), key=lambda j: j.id):
            if job.state != "PENDING" or slurm.ctld_down:
                continue
            free = sorted(n for n in slurm.candidates() if n not in job.exclude)
            if len(free) < job.nodes:
                continue
            chosen = free[: job.nodes]
            slurm.start_job(chosen[0], uses_gpu=job.gpu, job_id=job.id, also=tuple(chosen[1:]))
            job.state = "RUNNING"
            self.world.trace.add(
                "slurmctld", f"job {job.id} ({job.comment})", f"started on {chosen}", key=True
            )

    def listing(self) -> list[pg.SlurmJob]:
        now = self.world.loop.time()
        out = []
        for job in sorted(self.jobs.values(), key=lambda j: j.id):
            if job.ended_at is not None and now - job.ended_at > MIN_JOB_AGE_S:
                continue
            key = pg.GroupKey.from_tag(job.comment[len(PREFIX) :])
            if key is None:
                continue
            running = self.world.slurm.jobs.get(job.id)
            out.append(
                pg.SlurmJob(
                    job.id,
                    key,
                    job.state,
                    running.nodes if running is not None else (),
                    "Resources" if job.state == "PENDING" else "",
                )
            )
        return out

    def submit(self, request: pg.JobRequest) -> int:
        slurm = self.world.slurm
        slurm._ctld("sbatch")
        if request.nodes > len(slurm.nodes):
            raise SubmitRefused("Requested node configuration is not available")
        comment = PREFIX + request.key.tag
        self.checks.submitted(comment, self.jobs)
        job = QueuedJob(slurm.new_id(), comment, request.nodes, request.gpus_per_node > 0)
        self.jobs[job.id] = job
        self.cycle()  # Slurm tries to start a job as it is submitted
        return job.id

    def _own(self, what: str, job_id: int) -> QueuedJob:
        job = self.jobs.get(job_id)
        if job is None:
            if job_id in self.world.slurm.jobs:
                self.checks.not_own_job(what, job_id)
            raise SlurmCommandFailed([what], 1, "Invalid job id specified")
        return job

    def cancel(self, job_id: int) -> None:
        self.world.slurm._ctld("scancel")
        job = self._own("scancel", job_id)
        if job.state not in LIVE:
            raise SlurmCommandFailed(["scancel"], 1, "Job/step already completing or completed")
        self.world.slurm.end_job(job_id)
        job.state, job.ended_at = "CANCELLED", self.world.loop.time()

    def requeue(self, job_id: int) -> None:
        self.world.slurm._ctld("scontrol requeue")
        job = self._own("scontrol requeue", job_id)
        if job.state != "RUNNING":
            raise SlurmCommandFailed(["scontrol", "requeue"], 1, "Job is pending execution")
        self.world.slurm.requeue([job_id])  # on_requeue: pending again, same id

    def exclude(self, job_id: int, names: Sequence[str]) -> None:
        self.world.slurm._ctld("scontrol update")
        job = self._own("scontrol update", job_id)
        if job.state != "PENDING":
            raise SlurmCommandFailed(["scontrol", "update"], 1, "Job is no longer pending")
        job.exclude |= set(names)


def _unavailable(what: str) -> SlurmError:
    return SlurmUnavailable(f"{what}: no answer (dst)")


class PodJobs:
    """:class:`~gpufleet.slurm.pod_jobs.PodJobPort` as one process's tools reach slurmctld."""

    def __init__(self, world: World, proc: Proc, queue: PodQueue) -> None:
        self.world = world
        self.proc = proc
        self.queue = queue

    async def _call(self, what: str, fn: Any, *, writes: bool) -> Any:
        return await self.world.port_call(
            self.proc, "slurm", what, fn, writes=writes, error=_unavailable, key=writes
        )

    async def jobs(self) -> list[pg.SlurmJob]:
        def effect() -> list[pg.SlurmJob]:
            self.world.slurm._ctld("squeue")
            return self.queue.listing()

        got: list[pg.SlurmJob] = await self._call("squeue", effect, writes=False)
        return got

    async def submit(self, request: pg.JobRequest) -> int:
        done: list[int] = []

        def once() -> int:  # one sbatch: delivered once (see the module's docstring)
            if not done:
                done.append(self.queue.submit(request))
            return done[0]

        job_id: int = await self._call(f"sbatch {request.job_name}", once, writes=True)
        return job_id

    async def cancel(self, job_id: int) -> None:
        await self._call(f"scancel {job_id}", lambda: self.queue.cancel(job_id), writes=True)

    async def requeue(self, job_id: int, exclude: Sequence[str] = ()) -> None:
        await self._call(
            f"scontrol requeue {job_id}", lambda: self.queue.requeue(job_id), writes=True
        )
        if exclude:
            names = sorted(exclude)
            await self._call(
                f"scontrol update JobId={job_id} ExcNodeList={','.join(names)}",
                lambda: self.queue.exclude(job_id, names),
                writes=True,
            )


class ViewedKube(KubeClient):
    """The scheduler's client; keeps what each Node listing it got said of every node's
    fitness, the view its next binds are decided on (invariant 14)."""

    def __init__(self, world: World, proc: Proc, checks: PodChecks) -> None:
        super().__init__(world, proc)
        self.checks = checks

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        got = await super().list(
            resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
        )
        if resource == NODES:
            self.checks.viewed[self.proc.label] = {
                str(n["metadata"]["name"]): pg.node_fit(n).fit for n in got.items
            }
        return got


@dataclass
class PodChecks:
    """Invariants 14-16 (the module's docstring)."""

    world: World
    viewed: dict[str, dict[str, bool]] = field(default_factory=dict)
    """Scheduler incarnation -> node -> fit, as its last Node listing said."""
    binds: int = 0
    in_flight: int = 0

    def _fail(self, inv: str, node: str, text: str, category: str) -> None:
        w = self.world
        w.violate(Violation(inv, w.loop.time(), node, text, {"category": category}))

    def on_write(self, w: Write) -> None:
        if w.resource != str(PODS) or w.identity != COMPONENT:
            return
        pod = w.before or w.after or {}
        name = f"{w.namespace}/{w.name}"
        if (pod.get("spec") or {}).get("schedulerName") != SETTINGS.scheduler_name:
            self._fail("16a", "", f"the pod scheduler wrote ({w.verb}) {name}, not its pod", "16a")
            return
        if w.verb != "bind":
            return
        node = str(((w.after or {}).get("spec") or {}).get("nodeName") or "")
        self.binds += 1
        proc = self.world.procs.get(PROC)
        label = proc.label if proc is not None else ""
        if not self.viewed.get(label, {}).get(node, False):
            self._fail(
                "14",
                node,
                f"{label} bound {name} onto {node}, unfit or unknown in its last Node listing",
                "14/unfit-in-view",
            )
            return
        if not pg.node_fit(self.world.api.find(NODES, node)).fit:
            self.in_flight += 1
            self.world.trace.add(
                "invariant", "in flight", f"{name} bound onto {node}, unfit since the listing"
            )

    def submitted(self, comment: str, jobs: Mapping[int, QueuedJob]) -> None:
        live = [j.id for j in jobs.values() if j.comment == comment and j.state in LIVE]
        if live:
            self._fail("15", "", f"a second job for {comment} while job(s) {live} live", "15")

    def not_own_job(self, what: str, job_id: int) -> None:
        self._fail("16b", "", f"the pod scheduler ran {what} on job {job_id}, not its own", "16b")


def install(world: World) -> PodChecks:
    """The queue, its scheduling cycle, the kubelet's part for bound pods, the checks and
    the scheduler's process (started)."""
    checks = PodChecks(world)
    queue = PodQueue(world, checks)
    world.api.on_write.append(checks.on_write)

    def cycle() -> None:
        queue.cycle()
        world.loop.call_later(CYCLE_S, cycle)

    world.loop.call_later(CYCLE_S, cycle)

    def kubelet(w: Write) -> None:
        if w.resource == str(PODS) and w.verb == "bind":
            world.loop.call_later(0.5, lambda: _running(world, w.namespace, w.name))

    world.api.on_write.append(kubelet)

    async def main(world: World, proc: Proc) -> None:
        sched = PodScheduler(
            ViewedKube(world, proc, checks),
            PodJobs(world, proc, queue),
            SETTINGS,
            clock=world.clock,
            identity=proc.label,
        )
        proc.obj = sched
        await sched.run()

    world.add_process(PROC, ProcSpec(identity=COMPONENT, main=main, restart_s=5.0))
    world.start(PROC)
    return checks


def _phase(world: World, namespace: str, name: str, phase: str) -> None:
    world.api.patch(
        "kubelet", PODS, name, {"status": {"phase": phase}}, namespace=namespace, status=True
    )


def _running(world: World, namespace: str, name: str) -> None:
    """The kubelet starts a bound pod's containers."""
    pod = world.api.find(PODS, name, namespace)
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return
    if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
        _phase(world, namespace, name, "Running")


def pod_group(world: World, size: int, gpu: bool, lifetime: float) -> str:
    """The environment event: a group of ``size`` pods for the scheduler, which end
    ``lifetime`` seconds later (bound ones succeed, the others are deleted)."""
    group = f"g{int(world.loop.time() * 1000)}"
    names = [f"{group}-{i}" for i in range(size)]
    for i, name in enumerate(names):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {well_known.LABEL_POD_GROUP: group},
                "annotations": {
                    well_known.ANNOTATION_POD_GROUP_SIZE: str(size),
                    GPU_ANNOTATION: "true" if gpu else "false",
                    pg.JOB_INDEX_ANNOTATION: str(i),
                },
            },
            "spec": {
                "schedulerName": SETTINGS.scheduler_name,
                "containers": [
                    {
                        "name": "main",
                        "image": "train",
                        "resources": {"requests": {pg.GPU_RESOURCE: "8" if gpu else "0"}},
                    }
                ],
            },
            "status": {"phase": "Pending"},
        }
        world.api.create("owner", PODS, body, WORK_NS)

    def end() -> None:
        for name in names:
            pod = world.api.find(PODS, name, WORK_NS)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            if (pod.get("spec") or {}).get("nodeName"):
                _phase(world, WORK_NS, name, "Succeeded")
            else:
                world.api.delete("owner", PODS, name, WORK_NS)
        world.trace.add("env", f"pod group {group}", "ended", key=True)

    world.loop.call_later(lifetime, end)
    return f"pod group {WORK_NS}/{group} of {size} for {SETTINGS.scheduler_name} (gpu={gpu})"
