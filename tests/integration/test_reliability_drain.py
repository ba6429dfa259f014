"""Reliability: no reboot under a running Slurm job, fail closed when Slurm is down, held
faults kept under a budget. Real apiserver, real Slurm daemons and syncer, Redfish BMCs; the
tests play the node agent (conditions and request answers), as the controller tests do.

docs/reliability.md lists these cases with their outcomes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    Api,
    answer_request,
    bmc_counters,
    policy_spec,
    put_policy,
    report_fault,
    reset_node,
    running,
    wait_for,
)
from fleet import Fleet
from slurm_support import RunningSyncer, Slurm

from gpufleet.domain import conditions, well_known
from gpufleet.domain.emptiness import SlurmWork
from gpufleet.domain.faults import Subsystem
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(fleet: Fleet) -> Iterator[tuple[ClusterInfo, Api, Slurm, Path]]:
    slurm = Slurm(fleet.info)
    try:
        yield fleet.info, fleet.api, slurm, fleet.logs
    finally:
        slurm.cancel_all()
        slurm.undrain_all()


@pytest.fixture
def syncer(env: Any) -> Iterator[RunningSyncer]:
    info, api, slurm, _ = env
    s = RunningSyncer(info, SyncSettings(poll_interval_s=0.5, hold_taint=True)).start()
    try:
        yield s
    finally:
        s.stop()
        slurm.cancel_all()
        slurm.undrain_all()
        for node in info.node_names:
            reset_node(api, node)


def resets(info: ClusterInfo, node: str) -> int:
    return int(bmc_counters(info, node)["ResetCount"])


def submit_sleep(slurm: Slurm, node: str, seconds: float) -> int:
    out = slurm.run(
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        "-w",
        node,
        "-N",
        "1",
        f"--wrap=sleep {seconds}",
        "--requeue",
    )
    return int(out.strip().split(";")[0])


def job_state(slurm: Slurm, job_id: int) -> str:
    out = slurm.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False)
    return out.strip() or "GONE"


def events_of(api: Api, node: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.events(node) if e.get("reason") == reason]


def finish_verification(api: Api, node: str) -> None:
    wait_for("verification request", lambda: api.state(node) == "verifying", timeout=60)
    answer_request(api, node, passed=True)
    wait_for("back in production", lambda: api.state(node) == "production", timeout=30)


def test_let_finish_rule_waits_for_the_slurm_job_before_the_reboot(env: Any, syncer: Any) -> None:
    info, api, slurm, logs = env
    node = info.node_names[0]
    spec = policy_spec(slurm="auto")
    rules = [r for r in spec["rules"] if r["match"].get("xid") != 79]
    rules.insert(0, {"match": {"xid": 79}, "action": "reboot", "requeue": "let-finish"})
    spec["rules"] = rules
    put_policy(api, "let-finish", spec)
    wait_for("slurm taint", lambda: well_known.TAINT_SLURM in _taints(api, node), timeout=20)
    before = resets(info, node)
    with running(info, logs, policy="let-finish"):
        job = submit_sleep(slurm, node, 12)
        wait_for("job running", lambda: job_state(slurm, job) == "RUNNING", timeout=20)
        report_fault(api, node, 79)
        wait_for("slurm drain", lambda: (slurm.drained(node) or "").startswith("gpufleet:"), 15)
        # The job runs on; Kubernetes has no pod on the node, so only Slurm can say wait.
        for _ in range(16):
            assert resets(info, node) == before, "rebooted under a running Slurm job"
            assert api.state(node) == "draining"
            if job_state(slurm, job) != "RUNNING":
                break
            time.sleep(0.5)
        work = SlurmWork.from_annotation(
            api.node(node)["metadata"]["annotations"].get(well_known.ANNOTATION_SLURM_WORK)
        )
        assert work is not None and work.drained
        waiting = [e["message"] for e in events_of(api, node, "DrainWaiting")]
        assert any("running jobs" in m or "waiting for Slurm" in m for m in waiting), waiting
        wait_for("job finished", lambda: job_state(slurm, job) == "GONE", timeout=30)
        ended = time.monotonic()
        wait_for("reboot after the job", lambda: resets(info, node) == before + 1, timeout=30)
        assert time.monotonic() >= ended
        finish_verification(api, node)
    assert resets(info, node) == before + 1


def test_slurmctld_down_no_reboot_until_slurm_confirms_then_requeue_first(
    env: Any, syncer: Any
) -> None:
    info, _, slurm, _ = env
    node = info.node_names[1]
    job = _job_on(env, node)
    slurm.signal("slurmctld", signal.SIGTERM)
    wait_for("slurmctld stopped", lambda: slurm.pid_of("slurmctld") is None, timeout=20)
    ctld = None

    def restart() -> None:
        nonlocal ctld
        ctld = slurm.start_slurmctld()

    try:
        # squeue cannot answer while slurmctld is down: the job is not looked at then.
        _fault_while_slurm_is_out(env, node, job, "ctld-down", restart, drain_within=60)
    finally:
        if slurm.pid_of("slurmctld") is None:
            restart()
        assert ctld is None or ctld.poll() is None
        wait_for("slurmctld answers", lambda: _ping(slurm), timeout=60)


def test_held_fault_survives_its_condition_clearing_and_is_repaired_later(env: Any) -> None:
    info, api, _, logs = env
    first, second = info.node_names[2], info.node_names[3]
    spec = policy_spec()  # no syncer in this test: Kubernetes alone says the nodes are empty
    spec["safety"]["budget"] = {"maxNodes": 1, "maxPercent": 100, "minNodes": 1}
    put_policy(api, "budget-one", spec)
    before = resets(info, second)
    with running(info, logs, policy="budget-one") as ctl:
        report_fault(api, first, 79)
        wait_for("first taken out", lambda: api.state(first) not in (None, "production"), 15)
        report_fault(api, second, 79)
        wait_for(
            "second held",
            lambda: (api.record(second) or _none()).pending is not None,
            timeout=15,
        )
        # Its condition clears three seconds later (the GPU came back): still pending.
        time.sleep(3)
        api.set_condition(second, conditions.healthy(Subsystem.PCIE))
        ctl.wait_ticks(5)  # five retries of the held fault after its condition cleared
        rec = api.record(second)
        assert rec is not None and rec.pending is not None and api.state(second) == "production"
        assert len(events_of(api, second, "ActionWithheld")) == 1  # not one per tick
        finish_verification(api, first)
        wait_for("second taken out", lambda: api.state(second) != "production", timeout=30)
        finish_verification(api, second)
    assert resets(info, second) == before + 1


def test_slurmrestd_frozen_no_reboot_until_it_answers(env: Any, syncer: Any) -> None:
    """slurmrestd hangs (SIGSTOP): the syncer's view is unknown, so nothing is reported and the
    controller waits; once it answers again, drain and requeue come first, then one reboot."""
    info, _, slurm, _ = env
    node = info.node_names[2]
    job = _job_on(env, node)
    slurm.signal("slurmrestd", signal.SIGSTOP)
    try:
        _fault_while_slurm_is_out(
            env,
            node,
            job,
            "rest-down",
            lambda: slurm.signal("slurmrestd", signal.SIGCONT),
            drain_within=30,
            job_visible=True,
        )
    finally:
        slurm.signal("slurmrestd", signal.SIGCONT)


def _job_on(env: Any, node: str) -> int:
    """A Slurm node (the syncer's taint on it) running a long batch job."""
    _, api, slurm, _ = env
    wait_for("slurm taint", lambda: well_known.TAINT_SLURM in _taints(api, node), timeout=20)
    job = submit_sleep(slurm, node, 300)
    wait_for("job running", lambda: job_state(slurm, job) == "RUNNING", timeout=20)
    return job


def _fault_while_slurm_is_out(
    env: Any,
    node: str,
    job: int,
    policy: str,
    restore: Callable[[], None],
    *,
    drain_within: float,
    job_visible: bool = False,
) -> None:
    """XID 79 while Slurm cannot be asked: cordoned, nothing rebooted, "failing closed";
    once ``restore`` brings Slurm back: drain, requeue, then exactly one reboot."""
    info, api, slurm, logs = env
    put_policy(api, policy, policy_spec(slurm="auto"))
    before = resets(info, node)
    with running(info, logs, policy=policy):
        report_fault(api, node, 79)
        wait_for("cordon", lambda: api.node(node)["spec"].get("unschedulable"), timeout=15)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert resets(info, node) == before, "power action while Slurm was unreachable"
            time.sleep(0.5)
        assert api.state(node) == "draining"
        if job_visible:
            assert job_state(slurm, job) == "RUNNING"
        waiting = [e["message"] for e in events_of(api, node, "DrainWaiting")]
        assert any("failing closed" in m for m in waiting), waiting
        restore()
        wait_for(
            "slurm drain",
            lambda: (slurm.drained(node) or "").startswith("gpufleet:"),
            timeout=drain_within,
        )
        wait_for("job requeued", lambda: job_state(slurm, job) != "RUNNING", timeout=30)
        wait_for("reboot once Slurm is empty", lambda: resets(info, node) > before, 60)
        finish_verification(api, node)
    assert resets(info, node) == before + 1


class _none:
    pending = None


def _taints(api: Api, node: str) -> set[str]:
    return {t["key"] for t in api.node(node)["spec"].get("taints") or []}


def _ping(slurm: Slurm) -> bool:
    out = slurm.run("scontrol", "ping", check=False)
    return "UP" in out
