"""Safe by construction (issue 33): each defect the gate work fixed, broken on purpose, live.

Real apiserver and etcd, KWOK nodes, real Slurm daemons and the syncer (a thread of this
process), the Redfish emulator with its misbehaviour switches, the controller as a real
process (``kill()`` is SIGKILL). Every disruptive act passes the one gate
(:mod:`gpufleet.gate`): these tests put work on a node after its drain, forge gpufleet's
records, start two controllers, pause, lose answers and kill the controller where the old
code went wrong, and count what the BMC received (``ResetPosts``: Reset POSTs, performed or
not). Each test says in a comment what the code before the gate did there.

docs/reliability.md lists the cases and outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from controller_harness import (
    GV,
    WELL_BEHAVED_BMC,
    Api,
    ControllerProcess,
    answer_request,
    bmc_control,
    bmc_counters,
    policy_spec,
    put_policy,
    report_fault,
    reset_node,
    running,
)
from fleet import Fleet
from slurm_support import RunningSyncer, Slurm
from waiting import wait_for

from gpufleet.domain import emptiness, well_known
from gpufleet.domain.ladder import Step
from gpufleet.domain.operator import OperatorRequest
from gpufleet.domain.records import Incident, NodeRecord, StepAttempt, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.local.cluster import ClusterInfo
from gpufleet.remediate.evidence import ActionMark, ResetEvidence
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

NS = "safety-gate"
RUN = secrets.token_hex(3)
"""Names the Leases of this run: a Lease a killed controller of an earlier run left
held never delays this one."""
POLICIES: list[str] = []
LEASES: list[str] = []


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def env(fleet: Fleet) -> Iterator[tuple[ClusterInfo, Api, Path]]:
    api = fleet.api

    def gone_or_live() -> bool:  # an earlier run's namespace may still be terminating
        r = api.http.get(f"/api/v1/namespaces/{NS}")
        return r.status_code == 404 or not r.json()["metadata"].get("deletionTimestamp")

    wait_for(f"namespace {NS} usable", gone_or_live, timeout=60)
    api.post("/api/v1/namespaces", {"metadata": {"name": NS}}, ok=(201, 409))
    try:
        yield fleet.info, api, fleet.logs
    finally:
        api.delete(f"/api/v1/namespaces/{NS}")
        for name in POLICIES:
            path = f"{GV}/fleetpolicies/{name}"
            if api.http.get(path).status_code == 200:
                # A killed controller leaves its finalizer on the policy: lift it, then delete.
                api.patch(path, {"metadata": {"finalizers": None}})
                api.delete(path)
        for name in LEASES:
            api.delete(f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{name}")


@pytest.fixture
def slurm(env: Any) -> Iterator[Slurm]:
    """Slurm as the next test expects it: no job, no drain (before and after)."""
    info, _, _ = env
    s = Slurm(info)
    s.cancel_all()
    s.undrain_all()
    try:
        yield s
    finally:
        s.cancel_all()
        s.undrain_all()


@pytest.fixture(autouse=True)
def clean_nodes(env: Any) -> Iterator[None]:
    """Every node with a well-behaved BMC and no gpufleet mark, before and after a test."""
    info, api, _ = env

    def clean() -> None:
        for node in info.node_names:
            bmc_control(info, node, **WELL_BEHAVED_BMC, osShutdownSeconds=3.0)
            # Its status patch is guarded by resourceVersion: a heartbeat in between is a 409.
            wait_for(f"{node} reset", lambda node=node: attempt(reset_node, api, node), 10)

    clean()
    try:
        yield
    finally:
        clean()


def attempt(action: Callable[..., None], *args: Any) -> bool:
    """Whether ``action`` went through (an assertion of the harness failing is a no)."""
    try:
        action(*args)
    except AssertionError:
        return False
    return True


@contextlib.contextmanager
def syncer(info: ClusterInfo, **settings: Any) -> Iterator[RunningSyncer]:
    s = RunningSyncer(info, SyncSettings(**{"poll_interval_s": 0.5, **settings})).start()
    try:
        yield s
    finally:
        s.stop()


# ------------------------------------------------------------------- helpers


def spec(
    *,
    slurm: str = "never",
    action: str = "reboot",
    ladder: list[dict[str, Any]] | None = None,
    **changes: Any,
) -> dict[str, Any]:
    """The harness's policy (short timeouts) with XID 79 -> ``action`` and XID 119 ->
    reboot (two faults the tests tell apart); with ``ladder``, a rule naming a step the
    ladder lacks names its first rung instead."""
    s = policy_spec(slurm=slurm, **changes)
    for rule in s["rules"]:
        if rule["match"].get("xid") == 79:
            rule["action"] = action
        elif rule["match"].get("xid") == 119:
            rule["action"] = "reboot"
    if ladder is not None:
        s["ladder"] = ladder
        rungs = {e["step"] for e in ladder}
        steps = ("gpu-reset", "reboot", "power-cycle", "reimage")
        for rule in s["rules"]:
            if rule["action"] in steps and rule["action"] not in rungs:
                rule["action"] = ladder[0]["step"]
            repeat = rule.get("repeat")
            if repeat and repeat["then"] in steps and repeat["then"] not in rungs:
                repeat["then"] = ladder[0]["step"]
    return s


def policy(api: Api, name: str, body: dict[str, Any]) -> str:
    POLICIES.append(name)
    put_policy(api, name, body)
    return name


def lease(name: str) -> str:
    LEASES.append(f"{name}-{RUN}")
    return LEASES[-1]


def posts(info: ClusterInfo, node: str) -> int:
    return int(bmc_counters(info, node)["ResetPosts"])


def posts_by_type(info: ClusterInfo, node: str) -> dict[str, int]:
    return dict(bmc_counters(info, node)["ResetPostsByType"])


def grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {t: n - before.get(t, 0) for t, n in after.items() if n - before.get(t, 0)}


def tried(api: Api, node: str) -> list[StepAttempt]:
    rec = api.record(node)
    return list(rec.incident.tried) if rec is not None and rec.incident is not None else []


def pending(api: Api, node: str) -> bool:
    """Whether the node's record holds a fault back (budget, breaker, ...)."""
    rec = api.record(node)
    return rec is not None and rec.pending is not None


def node_annotations(api: Api, node: str) -> dict[str, str]:
    return dict(api.node(node)["metadata"].get("annotations") or {})


def seen_events(api: Api, node: str) -> dict[str, int]:
    """The controller's Events about ``node`` so far: name -> count."""
    return {e["metadata"]["name"]: int(e.get("count") or 1) for e in api.events(node)}


def events_since(api: Api, node: str, reason: str, before: dict[str, int]) -> list[str]:
    """Messages of the Events with ``reason`` posted (or counted again) since ``before``."""
    return [
        e["message"]
        for e in api.events(node)
        if e["reason"] == reason and int(e.get("count") or 1) > before.get(e["metadata"]["name"], 0)
    ]


def wait_event(
    api: Api, node: str, reason: str, before: dict[str, int], timeout: float = 30
) -> list[str]:
    found: list[str] = wait_for(
        f"a {reason} Event about {node}",
        lambda: events_since(api, node, reason, before),
        timeout=timeout,
    )
    return found


def put_pod(api: Api, node: str, name: str) -> None:
    """A pod bound to ``node`` by name (no scheduler asked) that tolerates every taint: what
    an admin's test pod or a DaemonSet-less agent of another team looks like."""
    api.post(
        f"/api/v1/namespaces/{NS}/pods",
        {
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "example.invalid/none"}],
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )


def pod_exists(api: Api, name: str) -> bool:
    return api.http.get(f"/api/v1/namespaces/{NS}/pods/{name}").status_code == 200


def no_post_while(
    info: ClusterInfo,
    node: str,
    allowed: int,
    present: Callable[[], bool],
    what: str,
    timeout: float = 60,
) -> int:
    """Until ``present()`` turns False: the POSTs counted *before* each look are ``allowed``
    (so a POST seen while the work was still there fails). Returns the samples taken."""
    deadline = time.monotonic() + timeout
    samples = 0
    while True:
        counted = posts(info, node)
        if not present():
            return samples
        assert counted == allowed, f"Reset POSTed to {node} while {what} was on it"
        samples += 1
        assert time.monotonic() < deadline, f"{what} still on {node} after {timeout:.0f} s"
        time.sleep(0.2)


def gpufleet(info: ClusterInfo, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, as a person runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", *args, "--kubeconfig", str(info.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def verify(api: Api, node: str, *, passed: bool = True) -> None:
    wait_for(f"{node} verifying", lambda: api.state(node) == "verifying", timeout=60)
    assert answer_request(api, node, passed=passed, detail="" if passed else "GEMM slow") == (
        "checks"
    )


def submit(slurm: Slurm, node: str, seconds: float, *extra: str) -> int:
    out = slurm.run(
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        "-w",
        node,
        "-N",
        "1",
        *extra,
        f"--wrap=sleep {seconds}",
    )
    return int(out.strip().split(";")[0])


def job_state(slurm: Slurm, job: int) -> str:
    return slurm.run("squeue", "-h", "-j", str(job), "-o", "%T", check=False).strip() or "GONE"


def system(info: ClusterInfo, node: str) -> dict[str, Any]:
    bmc = info.bmcs[node]
    data: dict[str, Any] = httpx.get(
        bmc.system_url, auth=(bmc.user, bmc.password), timeout=30
    ).json()
    return data


def work_report(api: Api, node: str) -> emptiness.SlurmWork | None:
    return emptiness.SlurmWork.from_annotation(
        node_annotations(api, node).get(well_known.ANNOTATION_SLURM_WORK)
    )


# ------------------------------------------------------ defect 1: emptiness at the act


def test_a_pod_that_lands_after_the_drain_stops_the_next_rung_until_it_is_evicted(
    env: Any,
) -> None:
    """Defect 1 (a). The old code read pods only in the drain loop: a failed verification
    started the next rung (power-cycle) and its POST went out with the pod running."""
    info, api, logs = env
    node = info.node_names[0]
    name = policy(api, "gate-pod", spec())
    p0 = posts(info, node)
    with running(info, logs, policy=name, lease=lease(name)):
        report_fault(api, node, 79)
        wait_for("the reboot", lambda: posts(info, node) == p0 + 1, timeout=60)
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
        # A pod lands on the repaired node (nodeName set, every taint tolerated).
        put_pod(api, node, "lands-after-drain")
        wait_for("the pod on the node", lambda: pod_exists(api, "lands-after-drain"))
        before = seen_events(api, node)
        verify(api, node, passed=False)  # the ladder goes on: power-cycle, with the pod there
        refused = wait_event(api, node, "ActRefused", before)
        assert any("power-cycle" in m and "lands-after-drain" in m for m in refused), refused
        no_post_while(info, node, p0 + 1, lambda: pod_exists(api, "lands-after-drain"), "a pod")
        rec = api.record(node)
        assert rec is not None
        assert any(
            t.target is NodeState.DRAINING and "power-cycle not started" in t.reason
            for t in rec.history
        ), [t.reason for t in rec.history]
        verify(api, node)  # evicted, drained again, power-cycled once
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 2  # the reboot, then exactly one power cycle


def test_an_admins_resume_and_a_slurm_job_after_the_drain_stop_the_next_rung(
    env: Any, slurm: Slurm
) -> None:
    """Defect 1 (b). An admin resumes the drained node in Slurm and a job starts on it
    while gpufleet verifies; verification fails. The old code posted the next rung's reset
    at once (no look at Slurm after the drain loop); the gate asks Slurm, fresh."""
    info, api, logs = env
    node = info.node_names[1]
    name = policy(api, "gate-slurm", spec(slurm="auto"))
    p0, by0 = posts(info, node), posts_by_type(info, node)
    with (
        syncer(info, poll_interval_s=4.0) as sync,
        running(info, logs, policy=name, lease=lease(name)),
    ):
        report_fault(api, node, 79)
        wait_for("the reboot", lambda: posts(info, node) == p0 + 1, timeout=60)
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
        assert (slurm.drained(node) or "").startswith("gpufleet:")
        # The admin, right after a poll of the syncer (which drains the node again at its
        # next one): a job waiting for this node, then `scontrol update state=resume`.
        start = polls(sync)
        # A poll every 3 s; a loaded machine (the full suite on two cores) has stretched
        # one past 10 s.
        wait_for("a poll", lambda: polls(sync) > start, timeout=30, step=0.02)
        job = submit(slurm, node, 10, "--no-requeue")
        slurm.resume(node)
        wait_for("the job running", lambda: job_state(slurm, job) == "RUNNING", timeout=20)
        before = seen_events(api, node)
        verify(api, node, passed=False)
        refused = wait_event(api, node, "ActRefused", before)
        assert any("power-cycle" in m and str(job) in m for m in refused), refused
        samples = no_post_while(
            info, node, p0 + 1, lambda: job_state(slurm, job) == "RUNNING", "a Slurm job"
        )
        assert samples > 5  # the job ran on for seconds after the refusal, unharmed
        verify(api, node)
        wait_for("production", lambda: api.state(node) == "production")
    assert grew(by0, posts_by_type(info, node)) == {"GracefulRestart": 1, "PowerCycle": 1}


def test_a_return_from_maintenance_whose_verification_fails_is_not_rebooted_under_a_pod(
    env: Any,
) -> None:
    """Defect 1 (c). After maintenance (an admin's test pod still on the node) the return
    is verified, fails, and the ladder restarts at its first rung: the old code rebooted the
    node under the pod; the gate refuses, the node is drained again, then rebooted once."""
    info, api, logs = env
    node = info.node_names[2]
    ladder = [
        {"step": "reboot", "timeoutSeconds": 60, "attempts": 1, "onFailure": None},
        {"step": "power-cycle", "timeoutSeconds": 60, "attempts": 1, "onFailure": "triage"},
    ]
    name = policy(api, "gate-return", spec(ladder=ladder))
    p0 = posts(info, node)
    with running(info, logs, policy=name, lease=lease(name)):
        wait_for("adopted", lambda: api.state(node) == "production")
        out = gpufleet(info, "node", "maintenance", node, "--reason", "swap a NIC")
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for("maintenance", lambda: api.state(node) == "maintenance", timeout=30)
        put_pod(api, node, "admin-test-pod")  # the admin's own check, left running
        out = gpufleet(info, "node", "return", node, "--reason", "NIC swapped")
        assert out.returncode == 0, out.stdout + out.stderr
        before = seen_events(api, node)
        verify(api, node, passed=False)
        refused = wait_event(api, node, "ActRefused", before)
        assert any("reboot" in m and "admin-test-pod" in m for m in refused), refused
        no_post_while(info, node, p0, lambda: pod_exists(api, "admin-test-pod"), "a pod")
        verify(api, node)
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 1


# ------------------------------------------- defect 2: records only the controller writes


def forged_attempt(record: NodeRecord, at: float) -> NodeRecord:
    """``record`` claiming a reboot attempt in progress (what another identity would write to
    make the controller reset the node)."""
    inc = Incident(
        key="xid-79",
        description="forged",
        opened_at=at,
        plan=Step.REBOOT,
        drained=True,
        current=Step.REBOOT,
        tried=(StepAttempt(step=Step.REBOOT, attempt=1, started_at=at),),
    )
    return replace(record, state=NodeState.REMEDIATING, since=at, incident=inc)


def forge_record(api: Api, node: str, record: NodeRecord, signature: str | None) -> None:
    api.patch(
        f"/api/v1/nodes/{node}",
        {
            "metadata": {
                "labels": {well_known.LABEL_STATE: "remediating"},
                "annotations": {
                    well_known.ANNOTATION_RECORD: record_to_json(record),
                    well_known.ANNOTATION_RECORD_SIGNATURE: signature,
                },
            }
        },
    )


def test_records_and_marks_written_by_another_identity_are_never_acted_on(env: Any) -> None:
    """Defect 2. The old code believed any ``gpufleet.io/record`` on a Node: a record
    claiming a reboot in progress made it POST a reset (past budget and breaker), and an
    unsigned ``bmc-action`` mark was read as proof that a reset had been posted."""
    info, api, logs = env
    node, other = info.node_names[0], info.node_names[3]
    ladder = [{"step": "reboot", "timeoutSeconds": 60, "attempts": 1, "onFailure": "triage"}]
    name = policy(api, "gate-records", spec(ladder=ladder))
    p0, q0 = posts(info, node), posts(info, other)
    # (1) The controller runs and holds the node's record: a forged one is written over.
    first = ControllerProcess(info, logs, policy=name, lease=lease(name))
    try:
        first.start()
        wait_for("adopted", lambda: api.state(node) == "production")
        genuine = api.record(node)
        assert genuine is not None
        before = seen_events(api, node)
        forge_record(api, node, forged_attempt(genuine, time.time()), "v1:0123456789ab:" + "0" * 64)
        restored = wait_event(api, node, "RecordRestored", before)
        assert "signature does not verify" in restored[0], restored
        wait_for("its own record back", lambda: api.state(node) == "production")
        rec = api.record(node)
        assert rec is not None and rec.incident is None
        first.wait_ticks(5)
        assert posts(info, node) == p0
        # (2) A real reboot of the other node, stopped before its POST (slow BMC reads).
        bmc_control(info, other, getDelaySeconds=3.0)
        report_fault(api, other, 79)

        def started() -> StepAttempt | None:
            return next((a for a in tried(api, other) if a.outcome is None), None)

        attempt = wait_for("the reboot recorded as started", started, timeout=30)
    finally:
        first.kill()
    assert posts(info, other) == q0
    # While no controller runs: a forged record on the first node (no signature) and an
    # unsigned mark on the other claiming its reset was posted (and, by its baseline, done).
    forge_record(api, node, forged_attempt(genuine, time.time()), None)
    mark = ActionMark(
        step="reboot",
        attempt=attempt.attempt,
        started_at=attempt.started_at,
        reset_type="ForceRestart",
        baseline=ResetEvidence(last_reset_time="2000-01-01T00:00:00.000000Z", power_state="On"),
        posted_at=time.time(),
    )
    api.patch(
        f"/api/v1/nodes/{other}",
        {"metadata": {"annotations": {well_known.ANNOTATION_BMC_ACTION: mark.to_json()}}},
    )
    bmc_control(info, other, getDelaySeconds=0.0)
    seen = {n: seen_events(api, n) for n in (node, other)}
    # A restarted controller (a Lease of its own: the killed one's is not waited out here).
    with running(info, logs, policy=name, lease=lease(name + "-2")) as second:
        untrusted = wait_event(api, node, "RecordUntrusted", seen[node])
        assert "carries no signature" in untrusted[0], untrusted
        wait_for("triage", lambda: api.state(node) == "triage")
        assert api.node(node)["spec"].get("unschedulable") is True
        wait_for("the other node's step ended", lambda: api.state(other) == "triage", timeout=30)
        (step,) = tried(api, other)
        assert step.outcome is not None and step.outcome.value == "failed", step
        assert "cannot be trusted" in step.detail and "nothing posted" in step.detail, step
        second.wait_ticks(5)
    assert posts(info, node) == p0 and posts(info, other) == q0


# ------------------------------------- defect 5: Slurm's word read after the drain and now


class HeldDrain:
    """The syncer's Slurm writes with one drain held back: it has read the node (idle) and
    is about to drain it when the test lets a job start there. What slurmctld does between a
    read and a write, widened from microseconds to the seconds a test can act in."""

    def __init__(self, inner: Any, node: str) -> None:
        self.inner, self.node = inner, node
        self.reached = threading.Event()
        self.release = threading.Event()
        self._used = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        names = [node] if isinstance(node, str) else list(node)
        if self.node in names and not self._used:
            self._used = True
            self.reached.set()
            await asyncio.to_thread(self.release.wait, 30)
        await self.inner.drain(node, reason)


def polls(s: RunningSyncer) -> float:
    assert s.syncer is not None
    r = s.syncer.metrics.registry
    return sum(
        r.get_sample_value("gpufleet_syncer_poll_reads_total", {"read": k}) or 0.0
        for k in ("full", "changed", "unchanged")
    )


def test_a_job_allocated_between_the_syncers_read_and_its_drain_is_seen(
    env: Any, slurm: Slurm
) -> None:
    """Defect 5. The old syncer reported the node ``idle+DRAIN`` from the read it took
    before its drain, with the job list of its last poll: a job allocated in between was
    invisible, and the controller rebooted under it. Now the node is read again after the
    drain, and the gate's probe is answered from Slurm as it is at the act."""
    info, api, logs = env
    node = info.node_names[2]
    name = policy(api, "gate-probe", spec(slurm="auto"))
    p0 = posts(info, node)
    with (
        syncer(info, poll_interval_s=3.0) as sync,
        running(info, logs, policy=name, lease=lease(name)),
    ):
        assert sync.syncer is not None
        held = HeldDrain(sync.syncer.scontrol, node)
        sync.syncer.scontrol = held
        report_fault(api, node, 79)
        assert held.reached.wait(30), "the syncer never came to drain the node"
        # Right after a poll (its job list then lacks the job until the next one, and the
        # poll's pass waits for this node's drain), a job is allocated on the idle node.
        start = polls(sync)
        # A poll every 3 s; a loaded machine (the full suite on two cores) has stretched
        # one past 10 s.
        wait_for("a poll", lambda: polls(sync) > start, timeout=30, step=0.02)
        job = submit(slurm, node, 6, "--no-requeue")
        wait_for("the job running", lambda: job_state(slurm, job) == "RUNNING", timeout=10)
        held.release.set()
        wait_for("Slurm drained", lambda: (slurm.drained(node) or "").startswith("gpufleet:"))
        first = wait_for("the first report", lambda: work_report(api, node), timeout=10)
        assert first.drained and not first.idle, first  # read after the drain: not idle
        answers: list[tuple[str | None, emptiness.SlurmWork | None]] = []

        def running_job() -> bool:
            ann = node_annotations(api, node)
            answers.append(
                (
                    ann.get(well_known.ANNOTATION_SLURM_PROBE),
                    emptiness.SlurmWork.from_annotation(ann.get(well_known.ANNOTATION_SLURM_WORK)),
                )
            )
            return job_state(slurm, job) == "RUNNING"

        no_post_while(info, node, p0, running_job, "a Slurm job")
        wait_for("the reboot", lambda: posts(info, node) == p0 + 1, timeout=30)
        probe = emptiness.Probe.from_annotation(
            node_annotations(api, node).get(well_known.ANNOTATION_SLURM_PROBE)
        )
        assert probe is not None
        answered = work_report(api, node)
        # The act was proven by an answer to its own probe, read after the probe.
        assert answered is not None and answered.probe == probe.id, (probe, answered)
        assert answered.empty and answered.at >= probe.at, answered
        assert all(w is None or w.probe != probe.id for _, w in answers)  # not during the job
        verify(api, node)
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 1


# --------------------------------------------------------------- defect 6: held faults


def test_held_faults_are_folded_into_a_later_incident_or_let_go_with_a_notice(env: Any) -> None:
    """Defect 6. Budget 1. The old code dropped a held fault without a word when a later
    fault took the node out (``_isolate`` replaced it) and when the node came back from
    triage (``_to_production`` cleared it). The tick is slowed to an hour here so that the
    later fault, not a retry of the held one, is what takes the node out."""
    info, api, logs = env
    a, b, c = info.node_names[:3]
    body = spec()
    body["safety"]["budget"] = {"maxNodes": 1, "maxPercent": 100, "minNodes": 1}
    body["safety"]["breaker"]["minNodes"] = 10  # three faults are no storm here
    name = policy(api, "gate-held", body)
    with running(info, logs, policy=name, lease=lease(name), extra_args=("--tick", "3600")):
        report_fault(api, a, 79)
        wait_for("a out", lambda: api.state(a) not in (None, "production"), timeout=15)
        for n in (b, c):
            report_fault(api, n, 79)
            wait_for(f"{n} held", lambda n=n: pending(api, n), timeout=15)
        verify(api, a)
        wait_for("a back", lambda: api.state(a) == "production")
        # A later, different fault takes b out: its held XID 79 goes with it, said so.
        before = seen_events(api, b)
        report_fault(api, b, 119)
        notices = wait_event(api, b, "Notice", before)
        assert any(
            "held fault xid-79 (step reboot) is handled by this incident (xid-119)" in m
            for m in notices
        ), notices
        # The Notice is posted before the write that drops the held fault (killed between
        # the two, nothing would be said): the record follows it.
        rec = wait_for(
            "b's record with the new incident",
            lambda: (r := api.record(b)) is not None and r.incident is not None and r,
            timeout=15,
        )
        assert rec.pending is None and rec.incident.key == "xid-119"
        verify(api, b)
        wait_for("b back", lambda: api.state(b) == "production")
        # c goes to triage with its fault still held, and comes back: let go, said so.
        before = seen_events(api, c)
        out = gpufleet(info, "node", "triage", c, "--reason", "look at it")
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for("c in triage", lambda: api.state(c) == "triage", timeout=30)
        assert pending(api, c)
        out = gpufleet(info, "node", "return", c, "--reason", "looked")
        assert out.returncode == 0, out.stdout + out.stderr
        verify(api, c)
        wait_for("c back", lambda: api.state(c) == "production")
        notices = wait_event(api, c, "Notice", before)
        assert any("held fault xid-79 let go" in m for m in notices), notices
        assert not pending(api, c)


# ------------------------------------------- defect 7: drain.slurm auto needs Slurm's word


def test_auto_without_the_hold_taint_waits_for_slurm_before_a_reboot(
    env: Any, slurm: Slurm
) -> None:
    """Defect 7. ``drain.slurm: auto`` and a syncer run with ``holdTaint: false`` (no taint
    on the node). The old code took a node without gpufleet's Slurm mark for a node Slurm
    does not use and rebooted it once its pods were gone, under the running job."""
    info, api, logs = env
    node = info.node_names[3]
    name = policy(api, "gate-auto", spec(slurm="auto"))
    p0 = posts(info, node)
    with (
        syncer(info, hold_taint=False),
        running(info, logs, policy=name, lease=lease(name)),
    ):
        job = submit(slurm, node, 6, "--no-requeue")
        wait_for("the job running", lambda: job_state(slurm, job) == "RUNNING", timeout=20)
        taints = {t["key"] for t in api.node(node)["spec"].get("taints") or []}
        assert well_known.TAINT_SLURM not in taints
        before = seen_events(api, node)
        report_fault(api, node, 79)
        samples = no_post_while(
            info, node, p0, lambda: job_state(slurm, job) == "RUNNING", "a Slurm job"
        )
        assert samples > 5
        waiting = events_since(api, node, "DrainWaiting", before)
        assert any(str(job) in m for m in waiting), waiting
        wait_for("the reboot after the job", lambda: posts(info, node) == p0 + 1, timeout=30)
        verify(api, node)
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 1


# ---------------------------------------------- defect 9: a GracefulRestart is posted once


def test_a_graceful_restart_slower_than_the_settle_time_is_posted_once(env: Any) -> None:
    """Defect 9. A GracefulRestart whose answer is lost (performed, answered 500) while the
    emulated OS takes longer to shut down (12 s, 16 s) than the 10 s a plain reset is given
    to show (the controller's graceful settle time here: 20 s); on the second node the
    controller is SIGKILLed in that window and restarted. The old code judged the reset
    "not performed" after 10 s (the next rung then power-cycled the node: a second POST),
    and after the restart posted it again."""
    info, api, logs = env
    lost, killed = info.node_names[0], info.node_names[1]
    name = policy(api, "gate-graceful", spec())
    before = {n: posts_by_type(info, n) for n in (lost, killed)}
    counters = {n: bmc_counters(info, n) for n in (lost, killed)}
    bmc_control(info, lost, osShutdownSeconds=12.0, failAfterReset=1)  # the answer is lost
    bmc_control(info, killed, osShutdownSeconds=16.0, failAfterReset=1)
    with running(info, logs, policy=name, lease=lease(name)):
        report_fault(api, lost, 79)
        wait_for("verifying", lambda: api.state(lost) == "verifying", timeout=60)
        (step,) = tried(api, lost)
        assert step.outcome is not None and step.outcome.value == "succeeded", step
        assert "answer lost" in step.detail and "shows the reset happened" in step.detail
        verify(api, lost)
        wait_for("production", lambda: api.state(lost) == "production")
    assert grew(before[lost], posts_by_type(info, lost)) == {"GracefulRestart": 1}
    # Killed while the OS of the other node shuts down, restarted within that window.
    first = ControllerProcess(info, logs, policy=name, lease=lease(name + "-k"))
    try:
        first.start()
        report_fault(api, killed, 79)
        wait_for(
            "the POST",
            lambda: sum(posts_by_type(info, killed).values()) > sum(before[killed].values()),
            timeout=60,
        )
    finally:
        first.kill()
    assert well_known.ANNOTATION_BMC_ACTION in node_annotations(api, killed)
    with running(info, logs, policy=name, lease=lease(name + "-k2")):
        booted = bmc_counters(info, killed)["BootCount"]
        assert booted == counters[killed]["BootCount"], "restarted after the OS was down"
        wait_for("verifying", lambda: api.state(killed) == "verifying", timeout=60)
        (step,) = tried(api, killed)
        assert step.outcome is not None and step.outcome.value == "succeeded", step
        assert "controller restart" in step.detail
        verify(api, killed)
        wait_for("production", lambda: api.state(killed) == "production")
    assert grew(before[killed], posts_by_type(info, killed)) == {"GracefulRestart": 1}
    for n in (lost, killed):
        after = bmc_counters(info, n)
        assert after["ResetCount"] == counters[n]["ResetCount"] + 1
        assert after["BootCount"] == counters[n]["BootCount"] + 1


# ------------------------------------------------ defect 10: driven live, broken on purpose


def test_two_controllers_with_one_command_line_post_once_per_decision(env: Any) -> None:
    """Defect 10 (a). Two processes, the same command line (same ``--lease``), faults on two
    nodes at once. Before the Lease, both acted: two POSTs per node, 0.25 s apart."""
    info, api, logs = env
    nodes = info.node_names[:2]
    body = spec()
    body["safety"]["budget"] = {"maxNodes": 4, "maxPercent": 100, "minNodes": 1}
    name = policy(api, "gate-twins", body)
    before = {n: posts(info, n) for n in nodes}
    leader = "gpufleet_controller_leader"
    with (
        running(info, logs, policy=name, lease=lease(name)) as one,
        running(info, logs, policy=name, lease=lease(name), wait_policy=False) as two,
    ):
        wait_for(
            "one replica holds the lease",
            lambda: sorted((one.metric(leader) or 0.0, two.metric(leader) or 0.0)) == [0.0, 1.0],
        )
        for n in nodes:
            report_fault(api, n, 79)
        for n in nodes:
            wait_for(f"{n} verifying", lambda n=n: api.state(n) == "verifying", timeout=60)
        time.sleep(2)  # a second replica's POST would come within a fraction of a second
        assert {n: posts(info, n) for n in nodes} == {n: before[n] + 1 for n in nodes}
        acted = 'gpufleet_actions_total{action="bmc-reboot",result="ok"}'
        assert sorted((one.metric(acted) or 0.0, two.metric(acted) or 0.0)) == [0.0, 2.0]
        for n in nodes:
            verify(api, n)
            wait_for(f"{n} production", lambda n=n: api.state(n) == "production")


def redfish_patches(info: ClusterInfo, node: str, offset: int) -> int:
    """PATCHes of the node's ComputerSystem answered by its BMC since ``offset`` of the log."""
    log = (info.logs_dir / "redfish.log").read_bytes()[offset:].decode(errors="replace")
    return sum(
        1
        for line in log.splitlines()
        if line.startswith(f"[{node}]") and '"PATCH /redfish/v1/Systems/1 ' in line
    )


def test_a_reimage_killed_after_its_one_time_boot_leaves_no_network_boot_armed(
    env: Any,
) -> None:
    """Defect 10 (b). The controller is killed right after it set the reimage's one-time
    PXE boot, before the power cycle; the attempt then times out into triage. The old code
    left the override armed: the next power action, by anyone, network-booted the node."""
    info, api, logs = env
    node = info.node_names[3]
    ladder = [{"step": "reimage", "timeoutSeconds": 10, "attempts": 1, "onFailure": "triage"}]
    name = policy(api, "gate-pxe", spec(action="reimage", ladder=ladder))
    p0 = posts(info, node)
    assert system(info, node)["Boot"]["BootSourceOverrideEnabled"] == "Disabled"
    bmc_control(info, node, getDelaySeconds=1.5)  # reads slow: seconds between boot and POST
    offset = (info.logs_dir / "redfish.log").stat().st_size
    first = ControllerProcess(info, logs, policy=name, lease=lease(name))
    try:
        first.start()
        report_fault(api, node, 79)
        wait_for(
            "the one-time boot set",
            lambda: redfish_patches(info, node, offset),
            timeout=60,
            step=0.05,
        )
    finally:
        first.kill()
    boot = system(info, node)["Boot"]
    assert (boot["BootSourceOverrideEnabled"], boot["BootSourceOverrideTarget"]) == ("Once", "Pxe")
    assert posts(info, node) == p0  # killed before the power cycle
    bmc_control(info, node, getDelaySeconds=0.0)
    (attempt,) = tried(api, node)
    # Restarted once the attempt's 10 s are over: it times out into triage.
    time.sleep(max(0.0, attempt.started_at + 10.5 - time.time()))
    with running(info, logs, policy=name, lease=lease(name + "-2")):
        wait_for("triage", lambda: api.state(node) == "triage", timeout=30)
        wait_for(
            "the one-time boot removed",
            lambda: system(info, node)["Boot"]["BootSourceOverrideEnabled"] == "Disabled",
            timeout=30,
        )
        (step,) = tried(api, node)
        assert step.outcome is not None and step.outcome.value == "timed-out", step
    assert posts(info, node) == p0
    # Someone power-cycles the node by hand: it boots from its disk, not the network.
    bmc = info.bmcs[node]
    r = httpx.post(
        bmc.system_url + "/Actions/ComputerSystem.Reset",
        json={"ResetType": "ForceRestart"},
        auth=(bmc.user, bmc.password),
        timeout=10,
    )
    assert r.status_code in (200, 202, 204), r.text
    assert bmc_counters(info, node)["LastBootSource"] == "Hdd"


def test_a_triage_while_a_reimage_boots_leaves_the_network_boot_to_the_firmware(
    env: Any,
) -> None:
    """Decision 0255. The reimage's PowerCycle goes out and the machine takes 25 s to boot
    (the BMC shows it off meanwhile; the firmware reads the one-time boot at the end). An
    operator's triage (the request ``gpufleet node triage`` writes) lands during the boot.
    The old code ran the ended attempt's cleanup beside the reimage's own task, which was
    still waiting for the machine: it removed the override, and the machine booted its old
    disk."""
    info, api, logs = env
    node = info.node_names[2]
    ladder = [{"step": "reimage", "timeoutSeconds": 120, "attempts": 1, "onFailure": "triage"}]
    name = policy(api, "gate-pxe-triage", spec(action="reimage", ladder=ladder))
    p0, boots0 = posts(info, node), int(bmc_counters(info, node)["BootCount"])
    bmc_control(info, node, bootSeconds=25.0)
    with running(info, logs, policy=name, lease=lease(name)):
        report_fault(api, node, 79)
        wait_for("the reimage's reset", lambda: posts(info, node) > p0, timeout=60, step=0.05)
        assert system(info, node)["Boot"]["BootSourceOverrideEnabled"] == "Once"
        request = OperatorRequest("triage", "looking at it by hand", "alice", time.time(), "t1")
        annotation = {well_known.ANNOTATION_OPERATOR_REQUEST: request.encode()}
        api.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": annotation}})
        wait_for("triage", lambda: api.state(node) == "triage", timeout=20, step=0.1)
        assert int(bmc_counters(info, node)["BootCount"]) == boots0, "booted before the triage"
        wait_for(
            "the machine booted",
            lambda: int(bmc_counters(info, node)["BootCount"]) > boots0,
            timeout=30,
        )
        assert bmc_counters(info, node)["LastBootSource"] == "Pxe"
        wait_for(
            "the reimage's mark removed",
            lambda: well_known.ANNOTATION_BMC_ACTION not in node_annotations(api, node),
            timeout=30,
        )
        assert system(info, node)["Boot"]["BootSourceOverrideEnabled"] == "Disabled"
    assert posts(info, node) == p0 + 1


def test_retries_of_held_faults_do_not_keep_the_breaker_open(env: Any) -> None:
    """Defect 10 (c). The breaker (more than one faulting node in 8 s) opens on the second
    of three faults; the held ones are retried every tick. The old code counted each retry
    as a new fault: the status listed the held nodes as faulting again and the breaker
    never closed by its cooldown."""
    info, api, logs = env
    nodes = info.node_names[:3]
    body = spec()
    body["safety"]["budget"] = {"maxNodes": 4, "maxPercent": 100, "minNodes": 1}
    body["safety"]["breaker"] = {
        "maxNodes": 1,
        "maxPercent": 100,
        "minNodes": 1,
        "windowSeconds": 8,
        "cooldownSeconds": 3,
    }
    name = policy(api, "gate-breaker", body)

    def breaker() -> dict[str, Any]:
        status = api.get(f"{GV}/fleetpolicies/{name}").get("status") or {}
        found: dict[str, Any] = status.get("breaker") or {}
        return found

    with running(info, logs, policy=name, lease=lease(name)) as ctl:
        for n in nodes:
            report_fault(api, n, 79)
        opened = wait_for(
            "the breaker open, the three faults counted",
            lambda: (b := breaker()).get("open") and len(b["recent"]) == len(nodes) and b,
            15,
        )
        held = [n for n in nodes if pending(api, n)]
        assert len(held) >= 2, "the faults after the trip were not held"
        first = {x["node"]: x["at"] for x in opened["recent"]}
        assert set(first) == set(nodes)
        ctl.wait_ticks(6)  # six retries of every held fault
        now = breaker()
        if now.get("open"):  # still within the window: nothing counted again
            assert sorted(x["node"] for x in now["recent"]) == sorted(nodes), now
            assert {x["node"]: x["at"] for x in now["recent"]} == first, now
            assert now["lastFaultAt"] == opened["lastFaultAt"]
        wait_for("the breaker closed by its cooldown", lambda: breaker().get("open") is False, 30)
        for n in held:  # and the held faults go ahead
            wait_for(f"{n} taken out", lambda n=n: api.state(n) != "production", timeout=30)


# ----------------------------------------------------- pause stops in-flight acting


def test_a_pause_stops_a_bmc_step_in_flight_until_unpaused(env: Any) -> None:
    """Pause. A reboot is on its way to the BMC (slow reads) when the FleetPolicy is
    paused. The old code checked pause only when a task started: the task in flight went
    on and posted the reset under a paused policy."""
    info, api, logs = env
    node = info.node_names[1]
    name = policy(api, "gate-pause", spec())
    p0 = posts(info, node)
    bmc_control(info, node, getDelaySeconds=2.0)
    with running(info, logs, policy=name, lease=lease(name)) as ctl:
        report_fault(api, node, 79)
        wait_for("the reboot started", lambda: api.state(node) == "remediating", timeout=30)
        api.patch(f"{GV}/fleetpolicies/{name}", {"spec": {"paused": True}})
        wait_for("paused", lambda: "paused=True" in ctl.log.read_text(), timeout=10)
        time.sleep(10)  # five slow reads: far past where the step would have posted
        assert posts(info, node) == p0
        assert api.state(node) == "remediating"
        bmc_control(info, node, getDelaySeconds=0.0)
        ctl.wait_ticks(3)
        assert posts(info, node) == p0  # ticks while paused resume nothing
        api.patch(f"{GV}/fleetpolicies/{name}", {"spec": {"paused": False}})
        verify(api, node)
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 1
