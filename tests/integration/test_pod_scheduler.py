"""Slurm schedules Kubernetes pods, on real components: the shared test cluster's apiserver
and KWOK nodes, its real Slurm daemons, and ``gpufleet pod-scheduler`` as a process holding
its Lease (decision 0257).

- a single pod is bound to the node where Slurm runs its job, and ``squeue`` shows that
  job under the pod's own name; ``scancel`` of the job evicts the pod, with an Event;
- an Indexed Job of two is one Slurm job of two nodes, both pods bound to them at once;
  when the pods finish, the Slurm job ends too;
- a pod asking for a partition Slurm does not have gets ``PodScheduled=False`` with
  Slurm's own reason (``SlurmRejected``) and an Event, and the scheduler carries on.

The scheduler runs under a name of its own (``--scheduler-name``): another scheduler on
the cluster neither binds these pods nor reads their Slurm jobs, whose comment prefix is
the name's (:func:`gpufleet.slurm.pod_jobs.comment_prefix`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pod_scheduler_support
import pytest
from slurm_support import Slurm
from waiting import wait_for

from gpufleet.domain import hostlist, pod_groups, well_known
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local.cluster import ClusterInfo, pod_scheduler_process
from gpufleet.local.processes import free_ports
from gpufleet.slurm.pod_jobs import comment_prefix

pytestmark = pytest.mark.integration

SCHEDULER = "gpufleet-slurm-it"
PREFIX = comment_prefix(SCHEDULER)
NS = f"pod-sched-{uuid.uuid4().hex[:6]}"
"""Its own name each run: the jobs of an earlier run, still listed for MinJobAge, are not
this run's (Slurm names a job ``<namespace>/<group>``)."""


class Env:
    """The scheduler process, and this module's view of its pods and Slurm jobs."""

    def __init__(self, info: ClusterInfo, log: Path) -> None:
        self.info, self.log = info, log
        self.api = SyncKube(info.apiserver_url, info.token, info.ca_file)
        self.slurm = Slurm(info)
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = pod_scheduler_process(
            self.info, self.port, interval_s=0.5, scheduler_name=SCHEDULER, lease_namespace=NS
        ).argv
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        wait_for(
            "the pod scheduler holding its Lease",
            lambda: self.metric("gpufleet_pod_scheduler_leader"),
            timeout=60,
        )

    def alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"pod scheduler exited: {self.log.read_text()[-3000:]}")

    def metric(self, name: str) -> float:
        """The sum of a metric's samples (0 while /metrics does not answer)."""
        self.alive()
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return 0.0
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith((name + " ", name + "{"))
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    # -- pods ---------------------------------------------------------------------

    def pod(self, name: str) -> dict[str, Any]:
        return self.api.get(f"/api/v1/namespaces/{NS}/pods/{name}")

    def pods(self, **params: str) -> list[dict[str, Any]]:
        return list(self.api.get(f"/api/v1/namespaces/{NS}/pods", params=params)["items"])

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        items = self.api.get(
            f"/api/v1/namespaces/{NS}/events",
            params={"fieldSelector": f"involvedObject.name={name},reason={reason}"},
        )["items"]
        return list(items)

    def gone_or_leaving(self, name: str) -> bool:
        found = [p for p in self.pods() if p["metadata"]["name"] == name]
        return not found or bool(found[0]["metadata"].get("deletionTimestamp"))

    # -- Slurm --------------------------------------------------------------------

    def job(self, job_id: int) -> tuple[str, str, list[str]]:
        """(name, state, nodes) of a job as ``squeue`` shows it, in any state."""
        line = self.slurm.run(
            "squeue", "-h", "--states=all", "-j", str(job_id), "-o", "%j|%T|%N"
        ).strip()
        name, state, nodes = line.split("|")
        return name, state, hostlist.expand(nodes) if nodes else []

    def our_jobs(self) -> list[int]:
        out = self.slurm.run("squeue", "-h", "--states=all", "-o", "%i|%T|%k")
        return [
            int(i)
            for i, state, comment in (ln.split("|", 2) for ln in out.splitlines() if ln.count("|"))
            if comment.startswith(PREFIX) and state in ("PENDING", "RUNNING")
        ]


def pod_spec() -> dict[str, Any]:
    return pod_scheduler_support.pod_spec(SCHEDULER)


def bare_pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return pod_scheduler_support.pod(name, NS, SCHEDULER, annotations=annotations)


@pytest.fixture(scope="module")
def env(local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(local_cluster, tmp_path_factory.mktemp("pod-scheduler") / "pod-scheduler.log")
    e.api.create("/api/v1/namespaces", {"metadata": {"name": NS}}, exist_ok=False)
    try:
        e.start()
        yield e
    finally:
        e.stop()
        for job_id in e.our_jobs():
            e.slurm.run("scancel", str(job_id), check=False)
        e.api.delete(f"/api/v1/namespaces/{NS}")
        e.api.close()


def test_a_pod_is_bound_where_slurm_runs_its_job_and_evicted_when_it_is_cancelled(
    env: Env,
) -> None:
    env.api.create(f"/api/v1/namespaces/{NS}/pods", bare_pod("solo"))
    node = wait_for("the pod bound", lambda: env.pod("solo")["spec"].get("nodeName"))
    annotations = env.pod("solo")["metadata"]["annotations"]
    job_id = int(annotations[well_known.ANNOTATION_SLURM_JOB])
    assert annotations[well_known.ANNOTATION_SLURM_NODE] == node
    assert env.job(job_id) == (f"{NS}/solo", "RUNNING", [node])
    assert env.events("solo", "Scheduled")

    env.slurm.run("scancel", str(job_id))
    wait_for("the pod evicted", lambda: env.gone_or_leaving("solo"))
    (event,) = env.events("solo", "SlurmJobEnded")
    # "ended: CANCELLED", or "is COMPLETING" when the pass saw it on its way out
    assert f"Slurm job {job_id} " in event["message"] and event["type"] == "Warning"


def test_an_indexed_job_of_two_is_one_slurm_job_bound_at_once_and_ends_with_its_pods(
    env: Env,
) -> None:
    template = {"metadata": {"labels": {"app": "train"}}, "spec": pod_spec()}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": NS},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": template,
        },
    }
    env.api.create(f"/apis/batch/v1/namespaces/{NS}/jobs", job)

    def both_bound() -> list[dict[str, Any]] | None:
        pods = env.pods(labelSelector="batch.kubernetes.io/job-name=train")
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for("both pods of the Job bound", both_bound)
    jobs = {p["metadata"]["annotations"][well_known.ANNOTATION_SLURM_JOB] for p in pods}
    assert len(jobs) == 1, f"one Slurm job for the group, not {jobs}"
    job_id = int(jobs.pop())
    name, _, allocated = env.job(job_id)
    assert name == f"{NS}/train"
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(allocated)
    assert len(set(allocated)) == 2
    # KWOK finishes a Job's running pods at once: the group has nobody left, its job ends
    wait_for(
        "the Slurm job ended with its pods",
        lambda: env.job(job_id)[1] in pod_groups.ENDED_STATES,
    )


def test_a_partition_slurm_lacks_is_a_condition_and_an_event_never_a_crash(env: Env) -> None:
    partition = {pod_groups.PARTITION: "no-such-partition"}
    env.api.create(f"/api/v1/namespaces/{NS}/pods", bare_pod("lost", partition))

    def rejected() -> dict[str, Any] | None:
        for c in env.pod("lost")["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return c  # type: ignore[no-any-return]
        return None

    condition = wait_for("PodScheduled=False on the pod", rejected)
    assert condition["reason"] == "SlurmRejected"
    assert "Invalid partition" in condition["message"]
    assert env.events("lost", "SlurmRejected")
    passes = env.metric("gpufleet_pod_scheduler_passes_total")
    wait_for(
        "the scheduler passing on",
        lambda: env.metric("gpufleet_pod_scheduler_passes_total") >= passes + 3,
    )
    assert not env.pod("lost")["spec"].get("nodeName")


def test_a_node_cordoned_in_kubernetes_gets_no_pod_the_job_is_requeued_off_it(
    env: Env,
) -> None:
    # Slurm gives an idle cluster's first node first; Kubernetes has it cordoned, which Slurm
    # does not know: the job is requeued, kept off it, and the pod bound where it lands next.
    first = env.info.node_names[0]
    env.api.patch(f"/api/v1/nodes/{first}", {"spec": {"unschedulable": True}})
    try:
        env.api.create(f"/api/v1/namespaces/{NS}/pods", bare_pod("careful"))
        node = wait_for("the pod bound", lambda: env.pod("careful")["spec"].get("nodeName"))
        assert node != first
        job_id = int(env.pod("careful")["metadata"]["annotations"][well_known.ANNOTATION_SLURM_JOB])
        shown = env.slurm.run("scontrol", "-o", "show", "job", str(job_id))
        assert f"ExcNodeList={first}" in shown and f" NodeList={node}" in shown
    finally:
        env.api.patch(f"/api/v1/nodes/{first}", {"spec": {"unschedulable": None}})
