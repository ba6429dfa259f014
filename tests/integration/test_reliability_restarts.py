"""Reliability: the controller killed at each step of the ladder, and the apiserver frozen
mid-repair. Each case ends with the node back in production after exactly the actions one
decision asked for (BMC resets counted by the Redfish emulator; agent requests by their id).

docs/reliability.md lists these cases with their outcomes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
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

from gpufleet.domain import conditions, well_known
from gpufleet.domain.faults import Subsystem
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

NS = "reliability-restarts"


@pytest.fixture(scope="module")
def env(fleet: Fleet) -> Iterator[tuple[ClusterInfo, Api, Path]]:
    api = fleet.api
    api.post("/api/v1/namespaces", {"metadata": {"name": NS}}, ok=(201, 409))
    try:
        yield fleet.info, api, fleet.logs
    finally:
        api.delete(f"/api/v1/namespaces/{NS}")
        for name in ("restart-ladder", "restart-drain", "restart-frozen"):
            # A killed controller leaves its finalizer on the policy: lift it, then delete.
            path = f"{GV}/fleetpolicies/{name}"
            if api.http.get(path).status_code == 200:
                api.patch(path, {"metadata": {"finalizers": None}})
                api.delete(path)


def resets(info: ClusterInfo, node: str) -> int:
    return int(bmc_counters(info, node)["ResetCount"])


def request_id(api: Api, node: str) -> str | None:
    text = (api.node(node)["metadata"].get("annotations") or {}).get(
        well_known.ANNOTATION_AGENT_REQUEST
    )
    request = conditions.decode_request(text)
    return request.id if request is not None else None


def test_killed_at_every_step_of_a_gpu_reset_ladder_each_step_happens_once(env: Any) -> None:
    info, api, logs = env
    node = info.node_names[0]
    put_policy(api, "restart-ladder", policy_spec())
    before = resets(info, node)
    with running(info, logs, policy="restart-ladder") as ctl:
        report_fault(api, node, 48, Subsystem.GPU)  # XID 48: GPU reset, asked of the agent
        wait_for("gpu reset requested", lambda: api.state(node) == "remediating", timeout=20)
        asked = wait_for("request", lambda: request_id(api, node), timeout=10)
        ctl.kill()
    with running(info, logs, policy="restart-ladder") as ctl:
        ctl.wait_ticks(3)  # several passes: a restarted controller must not ask again
        assert request_id(api, node) == asked
        assert api.state(node) == "remediating"
        assert answer_request(api, node, passed=True) == "gpu-reset"
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=20)
        checks = request_id(api, node)
        ctl.kill()
    with running(info, logs, policy="restart-ladder") as ctl:
        ctl.wait_ticks(3)
        assert request_id(api, node) == checks
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production", timeout=20)
    rec = api.record(node)
    assert rec is not None
    assert [t.target.value for t in rec.history][-4:] == [
        "draining",
        "remediating",
        "verifying",
        "production",
    ]
    assert resets(info, node) == before  # a GPU reset never touches the BMC
    reset_node(api, node)


def pdb_blocked_pod(api: Api, node: str) -> None:
    labels = {"app": "guarded"}
    api.post(
        f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
        {
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        },
    )
    api.post(
        f"/api/v1/namespaces/{NS}/pods",
        {
            "metadata": {"name": "guarded", "labels": labels},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "example.invalid/none"}],
                "tolerations": [{"operator": "Exists"}],
            },
        },
    )


def test_killed_while_draining_the_drain_resumes_and_reboots_once(env: Any) -> None:
    info, api, logs = env
    node = info.node_names[1]
    pdb_blocked_pod(api, node)
    put_policy(api, "restart-drain", policy_spec())
    before = resets(info, node)
    with running(info, logs, policy="restart-drain") as ctl:
        report_fault(api, node, 79)
        wait_for("draining", lambda: api.state(node) == "draining", timeout=20)
        ctl.wait_ticks(5)  # the PDB refuses the eviction: the drain goes on
        assert api.state(node) == "draining" and resets(info, node) == before
        ctl.kill()
    api.delete(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/guarded")
    with running(info, logs, policy="restart-drain"):
        wait_for("rebooted", lambda: api.state(node) == "verifying", timeout=60)
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production", timeout=20)
    assert resets(info, node) == before + 1
    reset_node(api, node)


def apiserver_pid(info: ClusterInfo) -> int:
    root = str(info.run_dir.resolve()).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"kube-apiserver" and root in b" ".join(argv):
            return int(entry.name)
    raise AssertionError("kube-apiserver of the test cluster not found")


def test_apiserver_frozen_mid_repair_ends_with_one_reboot(env: Any) -> None:
    info, api, logs = env
    node = info.node_names[2]
    put_policy(api, "restart-frozen", policy_spec())
    before = resets(info, node)
    pid = apiserver_pid(info)
    with running(info, logs, policy="restart-frozen"):
        report_fault(api, node, 79)
        wait_for("rebooted", lambda: resets(info, node) == before + 1, timeout=30)
        os.kill(pid, signal.SIGSTOP)  # every request now hangs: an unreachable apiserver
        try:
            time.sleep(8)
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production", timeout=30)
    assert resets(info, node) == before + 1
    reset_node(api, node)
