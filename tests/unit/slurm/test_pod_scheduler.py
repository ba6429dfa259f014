"""The pod scheduler's passes against an in-memory apiserver and Slurm: what each pass reads,
what it writes where, and what it leaves alone when a read fails, it may not act, or it
only logs (dry run)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpufleet.clock import ManualClock
from gpufleet.domain import pod_groups as pg
from gpufleet.domain import well_known
from gpufleet.kubeapi import (
    EVENTS,
    NODES,
    PODS,
    Conflict,
    Forbidden,
    Json,
    KubePort,
    NotFound,
    ObjectList,
    Patch,
    Resource,
)
from gpufleet.kubeapi.resources import NAMESPACES
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmUnavailable
from gpufleet.slurm.pod_jobs import PodJobPort, SubmitRefused
from gpufleet.slurm.pod_scheduler import JOBS, PodScheduler, SchedulerSettings

from ..fakes import UnmodelledKube

NAME = well_known.POD_SCHEDULER_NAME


def pod(
    name: str,
    *,
    ns: str = "team",
    gpus: int = 8,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    scheduler: str = NAME,
) -> Json:
    meta: Json = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{name}",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {"kind": owner[0], "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}
        ]
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "main", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
        "status": {"phase": "Pending"},
    }


def job_pods(job: str, n: int, *, ns: str = "team") -> list[Json]:
    return [
        pod(
            f"{job}-{i}",
            ns=ns,
            labels={
                "batch.kubernetes.io/job-name": job,
                "batch.kubernetes.io/controller-uid": f"uid-{job}",
                "batch.kubernetes.io/job-completion-index": str(i),
            },
            owner=("Job", job),
        )
        for i in range(n)
    ]


def train(kube: Cluster, pods: int, *, parallelism: int | None = None) -> None:
    """A Job ``train`` of ``parallelism`` (default: ``pods``) and its first ``pods`` pods."""
    kube.jobs["team/train"] = {"spec": {"parallelism": parallelism or pods}, "status": {}}
    kube.add(*job_pods("train", pods))


def node(name: str, **spec: Any) -> Json:
    return {"metadata": {"name": name, "labels": {}}, "spec": dict(spec)}


class Cluster(UnmodelledKube):
    """The apiserver as far as the pod scheduler uses it."""

    def __init__(self) -> None:
        self.pods: dict[str, Json] = {}
        self.nodes: dict[str, Json] = {n: node(n) for n in ("node-a", "node-b", "node-c")}
        self.namespaces: dict[str, Json] = {"team": {"metadata": {"name": "team"}}}
        self.jobs: dict[str, Json] = {}
        self.events: list[Json] = []
        self.evicted: list[str] = []
        self.bound: list[tuple[str, str]] = []
        self.writes = 0
        self.fail_list = False
        self.refuse_patch_of: set[str] = set()

    def add(self, *pods: Json) -> None:
        for p in pods:
            self.pods[f"{p['metadata']['namespace']}/{p['metadata']['name']}"] = p

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        if self.fail_list:
            raise Forbidden(f"list {resource}", 403, "forbidden")
        if resource == PODS:
            want = field_selector.removeprefix("spec.schedulerName=")
            items = [p for p in self.pods.values() if p["spec"]["schedulerName"] == want]
            return ObjectList(items, "7")
        if resource == NODES:
            return ObjectList(list(self.nodes.values()), "7")
        raise NotImplementedError(f"list {resource}")

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        found = {
            NAMESPACES: self.namespaces.get(name),
            JOBS: self.jobs.get(f"{namespace}/{name}"),
        }.get(resource)
        if found is None:
            raise NotFound(f"get {resource} {name}", 404, "not found")
        return found

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json:
        if resource == EVENTS:
            return {}
        assert resource == PODS
        key = f"{namespace}/{name}"
        if key in self.refuse_patch_of:
            raise Forbidden(f"patch pod {key}", 403, "forbidden")
        p = self.pods[key]
        self.writes += 1
        if status:
            assert kind is Patch.STRATEGIC
            conds = [
                c
                for c in p["status"].get("conditions", [])
                if c["type"] not in {x["type"] for x in patch["status"]["conditions"]}
            ]
            p["status"]["conditions"] = conds + list(patch["status"]["conditions"])
        else:
            p["metadata"]["annotations"].update(patch["metadata"]["annotations"])
        return p

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        p = self.pods[f"{namespace}/{name}"]
        assert p["metadata"]["uid"] == uid
        if p["spec"].get("nodeName"):
            raise Conflict(f"bind {name}", 409, "already bound")
        p["spec"]["nodeName"] = node
        p["status"]["phase"] = "Running"
        self.bound.append((f"{namespace}/{name}", node))
        self.writes += 1

    async def evict(self, namespace: str, name: str) -> None:
        self.evicted.append(f"{namespace}/{name}")
        self.pods[f"{namespace}/{name}"]["metadata"]["deletionTimestamp"] = "now"
        self.writes += 1

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.events.append(dict(event))


class Slurm:
    """This scheduler's jobs as squeue would list them."""

    def __init__(self) -> None:
        self.listed: dict[int, pg.SlurmJob] = {}
        self.requests: list[pg.JobRequest] = []
        self.cancelled: list[int] = []
        self.requeued: list[int] = []
        self.down = False
        self.refuse = ""
        self.next_id = 100
        self.reads = 0
        self.excluded: tuple[str, ...] = ()

    async def jobs(self) -> list[pg.SlurmJob]:
        self.reads += 1
        if self.down:
            raise SlurmUnavailable("squeue: Unable to contact slurm controller")
        return list(self.listed.values())

    async def submit(self, request: pg.JobRequest) -> int:
        if self.refuse:
            raise SubmitRefused(self.refuse)
        self.requests.append(request)
        self.next_id += 1
        self.listed[self.next_id] = pg.SlurmJob(self.next_id, request.key, "PENDING")
        return self.next_id

    def run(self, job_id: int, *nodes: str) -> None:
        self.listed[job_id] = replace(self.listed[job_id], state="RUNNING", nodes=nodes)

    async def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)
        self.listed[job_id] = replace(self.listed[job_id], state="CANCELLED")

    async def requeue(self, job_id: int, exclude: Sequence[str] = ()) -> None:
        self.requeued.append(job_id)
        self.excluded = tuple(exclude)
        self.listed[job_id] = replace(self.listed[job_id], state="PENDING", nodes=())


_kube: type[KubePort] = Cluster
_slurm: type[PodJobPort] = Slurm


def scheduler(
    kube: Cluster, slurm: Slurm, *, dry_run: bool = False, acting: list[bool] | None = None
) -> PodScheduler:
    flag = acting if acting is not None else [True]
    return PodScheduler(
        kube,
        slurm,
        SchedulerSettings(interval_s=0.01, dry_run=dry_run, max_backoff_s=0.01),
        may_act=lambda: flag[0],
        clock=ManualClock(1_000.0),
    )


_LOOP = asyncio.new_event_loop()
"""One loop for every pass of a test: the scheduler's wake-up Event and its Event
recorder's lock belong to the loop that first used them, as in the running command."""


def run(coro: Any) -> Any:
    return _LOOP.run_until_complete(coro)


def test_a_single_pod_is_submitted_then_bound_where_slurm_runs_its_job() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo"))
    s = scheduler(kube, slurm)
    first = run(s.run_pass())
    assert first.submitted == 1 and not kube.bound
    (req,) = slurm.requests
    assert (req.job_name, req.nodes, req.gpus_per_node) == ("team/solo", 1, 8)
    run(s.run_pass())  # still pending in Slurm: nothing more, and no second job
    assert len(slurm.requests) == 1 and not kube.bound
    slurm.run(101, "node-b")
    second = run(s.run_pass())
    assert second.bound == 1 and kube.bound == [("team/solo", "node-b")]
    ann = kube.pods["team/solo"]["metadata"]["annotations"]
    assert ann[well_known.ANNOTATION_SLURM_JOB] == "101"
    assert ann[well_known.ANNOTATION_SLURM_NODE] == "node-b"
    (event,) = [e for e in kube.events if e["reason"] == "Scheduled"]
    assert "node-b" in event["message"] and "Slurm job 101" in event["message"]


def test_a_jobs_pods_are_one_slurm_job_bound_all_at_once_in_index_order() -> None:
    kube, slurm = Cluster(), Slurm()
    train(kube, 2)
    s = scheduler(kube, slurm)
    run(s.run_pass())
    (req,) = slurm.requests
    assert req.nodes == 2 and req.key.kind == "job"
    slurm.run(101, "node-c", "node-a")
    run(s.run_pass())
    assert sorted(kube.bound) == [("team/train-0", "node-a"), ("team/train-1", "node-c")]


def test_a_group_waits_for_every_pod_its_job_runs_at_once() -> None:
    kube, slurm = Cluster(), Slurm()
    train(kube, 2, parallelism=3)
    run(scheduler(kube, slurm).run_pass())
    assert not slurm.requests


def test_a_plan_that_cannot_be_written_binds_nobody_of_the_group() -> None:
    kube, slurm = Cluster(), Slurm()
    train(kube, 2)
    s = scheduler(kube, slurm)
    run(s.run_pass())
    slurm.run(101, "node-a", "node-b")
    kube.refuse_patch_of = {"team/train-1"}
    result = run(s.run_pass())
    assert not kube.bound and result.failed
    kube.refuse_patch_of = set()
    run(s.run_pass())
    assert len(kube.bound) == 2


def test_slurm_refusing_a_group_says_so_on_its_pods_once_and_waits_for_a_change() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo", annotations={"slurm.gpufleet.io/partition": "nope"}))
    slurm.refuse = "Invalid partition name specified"
    s = scheduler(kube, slurm)
    run(s.run_pass())
    cond = kube.pods["team/solo"]["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "PodScheduled",
        "False",
        "SlurmRejected",
    )
    assert "Invalid partition name specified" in cond["message"]
    assert [e["reason"] for e in kube.events] == ["SlurmRejected"]
    writes = kube.writes
    slurm.refuse = ""
    run(s.run_pass())  # nothing changed: not submitted again, nothing written again
    assert not slurm.requests and kube.writes == writes
    kube.pods["team/solo"]["metadata"]["annotations"]["slurm.gpufleet.io/partition"] = "gpu"
    run(s.run_pass())
    assert len(slurm.requests) == 1 and slurm.requests[0].partition == "gpu"


def test_a_pod_with_an_invalid_group_is_told_why_and_nothing_is_submitted() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("odd", labels={well_known.LABEL_POD_GROUP: ""}))
    kube.add(pod("sized", labels={well_known.LABEL_POD_GROUP: "g"}))
    run(scheduler(kube, slurm).run_pass())
    assert not slurm.requests
    reasons = {
        k: p["status"]["conditions"][0]["reason"]
        for k, p in kube.pods.items()
        if p["status"].get("conditions")
    }
    assert reasons == {"team/odd": "InvalidPodGroup", "team/sized": "InvalidPodGroup"}


def test_a_job_slurm_ended_evicts_its_pods_with_an_event() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo"))
    s = scheduler(kube, slurm)
    run(s.run_pass())
    slurm.run(101, "node-a")
    run(s.run_pass())
    slurm.listed[101] = replace(slurm.listed[101], state="CANCELLED")
    run(s.run_pass())
    assert kube.evicted == ["team/solo"]
    (event,) = [e for e in kube.events if e["reason"] == "SlurmJobEnded"]
    assert "101" in event["message"] and event["type"] == "Warning"


def test_pods_that_finished_cancel_their_job() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo"))
    s = scheduler(kube, slurm)
    run(s.run_pass())
    slurm.run(101, "node-a")
    run(s.run_pass())
    kube.pods["team/solo"]["status"]["phase"] = "Succeeded"
    run(s.run_pass())
    assert slurm.cancelled == [101] and not kube.evicted


def test_a_job_missing_from_one_listing_changes_nothing_two_listings_apart_it_ended() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo"))
    s = scheduler(kube, slurm)
    run(s.run_pass())
    slurm.run(101, "node-a")
    run(s.run_pass())
    del slurm.listed[101]
    run(s.run_pass())
    assert not kube.evicted and not slurm.requests[1:]
    s.clock.advance(pg.ABSENT_GRACE_S)  # type: ignore[attr-defined]
    run(s.run_pass())
    assert kube.evicted == ["team/solo"]


def test_a_failed_read_changes_nothing_and_the_loop_backs_off_and_carries_on() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo"))
    s = scheduler(kube, slurm)
    slurm.down = True
    run(s.loop(passes=3))
    assert not slurm.requests and kube.writes == 0 and not kube.events
    assert s.metrics.passes.labels("skipped")._value.get() == 3
    kube.fail_list, slurm.down = True, False
    run(s.loop(passes=1))
    assert not slurm.requests
    kube.fail_list = False
    run(s.loop(passes=1))
    assert len(slurm.requests) == 1


def test_dry_run_decides_and_does_nothing() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo"), pod("bad", labels={well_known.LABEL_POD_GROUP: ""}))
    s = scheduler(kube, slurm, dry_run=True)
    result = run(s.run_pass())
    assert {type(a).__name__ for a in result.actions} == {"Submit", "Reject"}
    assert not slurm.requests and kube.writes == 0 and not kube.events


def test_a_replica_that_does_not_hold_the_lease_reads_and_writes_nothing() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("solo"))
    acting = [False]
    s = scheduler(kube, slurm, acting=acting)

    async def standby() -> None:
        task = asyncio.create_task(s.loop())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(standby())
    assert slurm.reads == 0 and kube.writes == 0
    acting[0] = True
    run(s.loop(passes=1))
    assert len(slurm.requests) == 1


def test_only_pods_of_this_schedulers_name_are_read() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("theirs", scheduler="default-scheduler"))
    run(scheduler(kube, slurm).run_pass())
    assert not slurm.requests


def test_an_unfit_node_in_the_allocation_requeues_the_job_and_binds_nobody() -> None:
    kube, slurm = Cluster(), Slurm()
    train(kube, 2)
    kube.nodes["node-b"]["spec"]["unschedulable"] = True
    s = scheduler(kube, slurm)
    run(s.run_pass())
    slurm.run(101, "node-a", "node-b")
    run(s.run_pass())
    assert slurm.requeued == [101] and not kube.bound and kube.writes == 0
    assert slurm.excluded == ("node-b",)


def test_slurm_refusing_a_cancel_is_logged_and_the_pass_goes_on() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(pod("done"), pod("next"))
    s = scheduler(kube, slurm)
    run(s.run_pass())
    kube.pods["team/done"]["status"]["phase"] = "Succeeded"

    async def refuse(job_id: int) -> None:
        raise SlurmCommandFailed(["scancel", str(job_id)], 1, "Job/step already completing")

    slurm.cancel = refuse  # type: ignore[method-assign]
    slurm.run(102, "node-a")
    result = run(s.run_pass())
    assert result.failed and kube.bound == [("team/next", "node-a")]


def test_a_job_slurm_accepted_but_will_never_start_is_cancelled_and_its_pods_told_why() -> None:
    kube, slurm = Cluster(), Slurm()
    kube.add(
        *(
            pod(
                f"huge-{i}",
                labels={well_known.LABEL_POD_GROUP: "huge"},
                annotations={well_known.ANNOTATION_POD_GROUP_SIZE: "5"},
            )
            for i in range(5)
        )
    )
    s = scheduler(kube, slurm)
    run(s.run_pass())
    # Slurm 22.05 accepts more nodes than the partition has, and keeps the job pending
    slurm.listed[101] = replace(slurm.listed[101], reason="PartitionNodeLimit")
    run(s.run_pass())
    assert slurm.cancelled == [101] and not kube.bound
    cond = kube.pods["team/huge-0"]["status"]["conditions"][0]
    assert cond["reason"] == "SlurmRejected" and "PartitionNodeLimit" in cond["message"]
    writes = kube.writes
    run(s.run_pass())  # refused like an sbatch refusal: not submitted again, nothing rewritten
    assert len(slurm.requests) == 1 and kube.writes == writes
