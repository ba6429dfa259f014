"""The pod scheduler when things go wrong, on real components: the session's apiserver,
KWOK nodes and real Slurm daemons, the scheduler as a process (decision 0257).

- slurmctld stopped while one group is bound and another is pending: the bound pods keep
  running, nothing is cancelled, evicted or bound; slurmctld back, the pending group is
  bound, and each group has exactly one Slurm job.
- the scheduler SIGKILLed right after it submitted a group Slurm cannot start yet; the
  nodes freed while no scheduler runs; a restarted one binds the pods where Slurm ran that
  job and never submits a second.
- groups too big for the cluster (pods asking more GPUs than a node has; more pods than
  there are nodes) and a pod with a bad annotation: a ``PodScheduled=False`` condition
  (``SlurmRejected`` with Slurm's words, ``InvalidPodGroup`` naming the annotation) and an
  Event on their pods, not tried again every pass, the same process still binding another
  pod.
- twenty low-priority pods fill the nodes and the queue, then a group asking for the
  high-priority partition arrives: Slurm preempts two running low-priority jobs for it, the
  scheduler evicts their pods with an Event and binds the group there; the sixteen waiting
  low-priority jobs stay waiting (decision 0266).

The module's scheduler runs under a name of its own (``--scheduler-name``): another
scheduler on the same cluster (the local cluster's own) neither binds these pods nor reads
their Slurm jobs (their comment prefix is the name's, :func:`pod_jobs.comment_prefix`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pod_scheduler_support
import pytest
from prometheus_client.parser import text_string_to_metric_families
from slurm_support import Kube, Slurm
from waiting import wait_for

from gpufleet.domain import hostlist, well_known
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local.cluster import ClusterInfo, pod_scheduler_process
from gpufleet.local.processes import free_ports
from gpufleet.slurm.pod_jobs import comment_prefix

pytestmark = pytest.mark.integration

SCHEDULER = "gpufleet-slurm-failures"
"""This module's scheduler name: only its pods, only its Slurm jobs."""
PREFIX = comment_prefix(SCHEDULER)
INTERVAL_S = 0.5
NS = f"pod-failures-{uuid.uuid4().hex[:6]}"
"""Its own name each run: the Slurm jobs (named ``<namespace>/<group>``) of an earlier
run, still listed for MinJobAge, are not this run's."""
GPUS = "8"
"""Every pod asks for a whole node's GPUs: one pod per node in Slurm."""


# ------------------------------------------------------------------ the scheduler process


class Scheduler:
    """``gpufleet pod-scheduler`` as a process of its own, as it runs in a pod."""

    def __init__(self, info: ClusterInfo, log: Path) -> None:
        self.info, self.log = info, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> Scheduler:
        self.port = free_ports(1)[0]
        args = pod_scheduler_process(
            self.info, self.port, interval_s=INTERVAL_S, scheduler_name=SCHEDULER
        ).argv
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_for("the pod scheduler serving metrics", self._serving, timeout=60)
        return self

    def _serving(self) -> bool:
        self.alive()
        return self.passes() is not None

    def alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"pod scheduler exited: {self.log.read_text()[-3000:]}")

    def passes(self, result: str | None = None) -> float | None:
        """Passes so far (``result``: only those that were ``done`` or ``skipped``); None
        while /metrics does not answer."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return None
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "gpufleet_pod_scheduler_passes_total" and (
                    result is None or sample.labels.get("result") == result
                ):
                    total += sample.value
        return total

    def wait_passes(self, count: int = 3, result: str | None = None, timeout: float = 30) -> None:
        """Wait until ``count`` more passes ran: what a test asserts next ("nothing
        changed") is what the scheduler decided, not what it had no time to do."""
        start = self.passes(result) or 0.0

        def ran() -> bool:
            self.alive()
            return (self.passes(result) or 0.0) >= start + count

        wait_for(f"{count} more pod scheduler passes ({result or 'any'})", ran, timeout)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as a crashed pod."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


# ------------------------------------------------------------------ pods and Slurm jobs


def pod(
    name: str,
    *,
    group: str | None = None,
    size: int | None = None,
    annotations: dict[str, str] | None = None,
    gpus: str = GPUS,
) -> dict[str, Any]:
    """A pod of this module's scheduler, asking for a whole node's GPUs unless told."""
    return pod_scheduler_support.pod(
        name,
        NS,
        SCHEDULER,
        group=group,
        size=size,
        annotations=annotations,
        gpus=gpus,
        memory="1Gi",
    )


@dataclass(frozen=True)
class Job:
    """One line of ``squeue`` for a job of this module's scheduler."""

    job_id: int
    state: str
    priority: int
    nodes: str
    name: str
    reason: str


class Env:
    """The module's view of the cluster: pods in its namespace, its Slurm jobs."""

    def __init__(self, info: ClusterInfo, api: SyncKube, slurm: Slurm) -> None:
        self.info, self.api, self.slurm = info, api, slurm

    def create(self, *pods: dict[str, Any]) -> None:
        for p in pods:
            self.api.create(f"/api/v1/namespaces/{NS}/pods", p, exist_ok=False)

    def pods(self) -> dict[str, dict[str, Any]]:
        items = self.api.get(f"/api/v1/namespaces/{NS}/pods").get("items") or []
        return {p["metadata"]["name"]: p for p in items}

    def node_of(self, name: str) -> str | None:
        p = self.pods().get(name)
        return None if p is None else p["spec"].get("nodeName")

    def placements(self) -> dict[str, str]:
        """Every bound pod of the module and its node."""
        return {
            n: p["spec"]["nodeName"] for n, p in self.pods().items() if p["spec"].get("nodeName")
        }

    def bound(self, *names: str) -> dict[str, str] | None:
        """Each pod's node, when every one of them is bound; else None."""
        pods = self.pods()
        nodes = {n: (pods.get(n) or {}).get("spec", {}).get("nodeName") for n in names}
        return nodes if all(nodes.values()) else None  # type: ignore[return-value]

    def delete_all(self) -> None:
        for name in self.pods():
            self.api.delete(f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")
        wait_for("the module's pods gone", lambda: not self.pods(), 30)

    def jobs(self) -> list[Job]:
        """This scheduler's Slurm jobs in every state Slurm still lists (MinJobAge=300:
        a job cancelled during the module is still there), highest priority first."""
        out = self.slurm.run(
            "squeue", "-h", "--states=all", "--sort=-p,i", "-o", "%i|%T|%Q|%N|%j|%r|%k"
        )
        found = []
        for line in out.splitlines():
            f = line.split("|", 6)
            if len(f) == 7 and f[6].startswith(PREFIX):
                found.append(Job(int(f[0]), f[1], int(f[2]), f[3], f[4], f[5]))
        return found

    def jobs_named(self, name: str) -> list[Job]:
        return [j for j in self.jobs() if j.name == f"{NS}/{name}"]

    def condition(self, name: str) -> dict[str, Any] | None:
        p = self.pods().get(name) or {}
        for c in p.get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled":
                return c  # type: ignore[no-any-return]
        return None

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.api.get(
            f"/api/v1/namespaces/{NS}/events",
            params={"fieldSelector": f"involvedObject.name={name}"},
        ).get("items")
        return list(items or [])

    def evictions(self) -> list[str]:
        """The scheduler's Events that say a pod was evicted because its job ended."""
        items = self.api.get(
            f"/api/v1/namespaces/{NS}/events", params={"fieldSelector": "reason=SlurmJobEnded"}
        ).get("items")
        return [f"{e['involvedObject']['name']}: {e.get('message')}" for e in items or []]

    def quiet(self) -> None:
        """No pod of the module left, none of its Slurm jobs pending or running."""
        self.delete_all()
        wait_for(
            "the module's Slurm jobs ended",
            lambda: all(j.state not in ("PENDING", "RUNNING", "CONFIGURING") for j in self.jobs()),
            30,
        )


@pytest.fixture(scope="module")
def env(local_cluster: ClusterInfo) -> Iterator[Env]:
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    api = SyncKube(local_cluster.apiserver_url, local_cluster.token, local_cluster.ca_file)
    for n in local_cluster.node_names:
        kube.reset_node(n)  # start clean, whatever earlier tests left
    slurm.cancel_all()
    slurm.undrain_all()
    api.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    try:
        yield Env(local_cluster, api, slurm)
    finally:
        for name in Env(local_cluster, api, slurm).pods():
            api.delete(f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")
        api.delete(f"/api/v1/namespaces/{NS}")
        slurm.cancel_all()
        api.close()


@pytest.fixture
def scheduler(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    """A scheduler for one test; after it, the test's pods and Slurm jobs are gone."""
    log = tmp_path_factory.mktemp("pod-scheduler") / "pod-scheduler.log"
    s = Scheduler(env.info, log).start()
    try:
        yield s
        s.alive()  # no test may leave it crashed
        env.quiet()
    finally:
        s.stop()
        env.slurm.cancel_all()


def ctld_answers(slurm: Slurm) -> bool:
    r = subprocess.run(
        ["scontrol", "ping"], env=slurm.env, capture_output=True, text=True, timeout=10
    )
    return "UP" in r.stdout


# ------------------------------------------------------------------ the tests


def test_slurmctld_down_keeps_bound_pods_and_the_pending_group_waits(
    env: Env, scheduler: Scheduler
) -> None:
    env.create(*(pod(f"steady-{i}", group="steady", size=2) for i in range(2)))
    placed = wait_for("group steady bound", lambda: env.bound("steady-0", "steady-1"), 30)
    (steady_job,) = env.jobs_named("steady")
    uids = {n: env.pods()[n]["metadata"]["uid"] for n in placed}
    env.slurm.run("scontrol", "shutdown", "slurmctld")
    wait_for("slurmctld stopped", lambda: env.slurm.pid_of("slurmctld") is None, 20)
    try:
        env.create(*(pod(f"later-{i}", group="later", size=2) for i in range(2)))
        # Passes that could not list Slurm (skipped, backing off): they change nothing.
        scheduler.wait_passes(3, "skipped")
        pods = env.pods()
        for name, node in placed.items():
            assert pods[name]["spec"].get("nodeName") == node
            assert pods[name]["metadata"]["uid"] == uids[name]
            assert "deletionTimestamp" not in pods[name]["metadata"], f"{name} evicted"
        assert env.bound("later-0") is None and env.bound("later-1") is None
    finally:
        env.slurm.start_slurmctld()
        wait_for("slurmctld answers", lambda: ctld_answers(env.slurm), 60, step=0.5)
    later = wait_for("group later bound", lambda: env.bound("later-0", "later-1"), 60)
    assert not set(later.values()) & set(placed.values())
    scheduler.wait_passes(3)
    # Exactly one Slurm job per group; steady's is the one it had, still running there.
    assert [(j.job_id, j.state) for j in env.jobs_named("steady")] == [
        (steady_job.job_id, "RUNNING")
    ]
    assert [j.state for j in env.jobs_named("later")] == ["RUNNING"]
    assert env.bound("steady-0", "steady-1") == placed
    assert not env.evictions()


def test_a_scheduler_killed_after_submitting_is_replaced_and_binds_from_slurms_job(
    env: Env, scheduler: Scheduler
) -> None:
    nodes = len(env.info.node_names)
    # Every node's GPUs busy with someone's sbatch job: the gang's job waits in Slurm.
    blocker = env.slurm.run(
        "sbatch", "--parsable", f"--nodes={nodes}", f"--gres=gpu:{GPUS}", "--mem=1",
        "-o", "/dev/null", "--wrap", "sleep 300",
    ).strip()  # fmt: skip
    wait_for("the blocker running", lambda: "RUNNING" in env.slurm.run(
        "squeue", "-h", "-j", blocker, "-o", "%T"), 30)  # fmt: skip
    env.create(*(pod(f"gang-{i}", group="gang", size=2) for i in range(2)))
    (submitted,) = wait_for("the gang's job submitted", lambda: env.jobs_named("gang"), 30)
    assert submitted.state == "PENDING"
    scheduler.kill()
    # While no scheduler runs, the nodes free up and Slurm starts the gang's job.
    env.slurm.run("scancel", blocker)
    wait_for(
        "Slurm running the gang's job",
        lambda: [j.state for j in env.jobs_named("gang")] == ["RUNNING"],
        30,
    )
    assert env.bound("gang-0") is None and env.bound("gang-1") is None
    scheduler.start()
    placed = wait_for(
        "the gang bound by the new scheduler", lambda: env.bound("gang-0", "gang-1"), 30
    )
    scheduler.wait_passes(3)
    (job,) = env.jobs_named("gang")  # never a second one
    assert (job.job_id, job.state) == (submitted.job_id, "RUNNING")
    assert sorted(placed.values()) == hostlist.expand(job.nodes)
    for name in placed:
        notes = env.pods()[name]["metadata"].get("annotations") or {}
        assert notes.get(well_known.ANNOTATION_SLURM_JOB) == str(job.job_id)


def test_a_group_too_big_and_a_bad_annotation_get_a_condition_and_the_rest_is_served(
    env: Env, scheduler: Scheduler
) -> None:
    wide = ["wide-0", "wide-1"]  # 16 GPUs each: no node has that many, Slurm refuses the job
    env.create(*(pod(name, group="wide", size=2, gpus="16") for name in wide))
    bad = {f"{well_known.SLURM_POD_ANNOTATION_PREFIX}time-limit": "soon"}
    env.create(pod("odd", annotations=bad))
    size = len(env.info.node_names) + 1
    many = [f"many-{i}" for i in range(size)]
    env.create(*(pod(name, group="many", size=size) for name in many))
    env.create(pod("fine"))
    wait_for("the good pod bound", lambda: env.bound("fine"), 30)

    def reason(name: str) -> str | None:
        c = env.condition(name)
        return c.get("reason") if c is not None and c.get("status") == "False" else None

    for name in [*wide, *many]:
        wait_for(f"{name} SlurmRejected", lambda n=name: reason(n) == "SlurmRejected", 30)  # type: ignore[misc]
    wait_for("odd InvalidPodGroup", lambda: reason("odd") == "InvalidPodGroup", 30)
    # Slurm's own words; the annotation named
    assert "node configuration" in (env.condition("wide-0") or {}).get("message", "")
    assert "time-limit" in (env.condition("odd") or {}).get("message", "")

    def reasons(name: str) -> list[str]:
        return [str(e.get("reason")) for e in env.events(name)]

    wait_for("an Event on wide-0", lambda: "SlurmRejected" in reasons("wide-0"), 10)
    wait_for("an Event on odd", lambda: "InvalidPodGroup" in reasons("odd"), 10)
    wait_for("an Event on many-0", lambda: "SlurmRejected" in reasons("many-0"), 10)
    watched = ("wide-0", "odd", "many-0")
    counts = {n: sum(int(e.get("count") or 1) for e in env.events(n)) for n in watched}
    scheduler.wait_passes(6)
    # Not tried again every pass (only when the pods change, or every ten minutes).
    assert {n: sum(int(e.get("count") or 1) for e in env.events(n)) for n in counts} == counts
    # At most one record of each refused group in Slurm, ended, never a second try: 22.05
    # keeps a refused sbatch as FAILED (BadConstraints), and takes a job of more nodes than
    # its partition has only to hold it (PartitionNodeLimit), which the scheduler cancels.
    assert [j.state for j in env.jobs_named("wide")] in ([], ["FAILED"])
    assert [j.state for j in env.jobs_named("many")] in ([], ["CANCELLED"])
    assert env.jobs_named("odd") == []
    assert not set(env.placements()) & {*wide, *many, "odd"}
    scheduler.alive()


def test_many_low_priority_pods_do_not_starve_a_high_priority_group(
    env: Env, scheduler: Scheduler
) -> None:
    """The local cluster's Slurm (slurm.conf of gpufleet.local.slurm): priority/basic,
    partitions ``batch`` (default, PriorityTier 1, PreemptMode REQUEUE) and ``high``
    (PriorityTier 10, never preempted), PreemptType partition_prio. A group asking for
    ``high`` is Slurm's first choice and takes running ``batch`` jobs' nodes."""
    nodes = len(env.info.node_names)
    low = [f"low-{i:02d}" for i in range(20)]
    env.create(*(pod(name) for name in low))

    def lows() -> list[Job]:
        return [j for j in env.jobs() if j.name.startswith(f"{NS}/low-")]

    wait_for(
        "every low pod's job submitted, one per node running",
        lambda: len(lows()) == len(low) and sum(j.state == "RUNNING" for j in lows()) == nodes,
        60,
    )
    first = wait_for(
        "the running low pods bound",
        lambda: len(env.placements()) == nodes and env.placements(),
        30,
    )
    high = {f"{well_known.SLURM_POD_ANNOTATION_PREFIX}partition": "high"}
    env.create(*(pod(f"urgent-{i}", group="urgent", size=2, annotations=high) for i in range(2)))
    (job,) = wait_for("the urgent group's job submitted", lambda: env.jobs_named("urgent"), 20)
    placed = wait_for("the urgent group bound", lambda: env.bound("urgent-0", "urgent-1"), 60)
    (job,) = env.jobs_named("urgent")
    assert job.state == "RUNNING" and sorted(placed.values()) == hostlist.expand(job.nodes)
    # Slurm took the nodes of two running low jobs; their pods were evicted with an Event,
    # the other low pods kept theirs; none of the sixteen waiting ones jumped ahead.
    preempted = sorted(n for n, node in first.items() if node in placed.values())
    assert len(preempted) == 2

    def gone(name: str) -> bool:
        p = env.pods().get(name)
        return p is None or "deletionTimestamp" in p["metadata"]

    wait_for("the preempted low pods evicted", lambda: all(gone(n) for n in preempted), 30)
    assert all(any(n in e for e in env.evictions()) for n in preempted), env.evictions()
    kept = {n: env.node_of(n) for n in first if n not in preempted}
    assert kept == {n: first[n] for n in kept}
    scheduler.wait_passes(3)
    assert set(env.placements()) == {*kept, "urgent-0", "urgent-1"}
    assert sum(j.state == "PENDING" for j in lows()) == len(low) - nodes
