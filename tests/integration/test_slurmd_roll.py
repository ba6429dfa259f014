"""The slurmd roll on real Slurm daemons and a real apiserver: a job runs through an upgrade.

A cluster of its own (3 KWOK nodes, real slurmctld, slurmrestd and one slurmd per node, of
Slurm 24.11, the chart's release: decision 0218 says what differs from 22.05).
The chart's slurmd DaemonSet, as helm renders it (``updateStrategy: OnDelete``), is
applied, then rendered again with another Slurm image tag and applied: what a
``helm upgrade`` sends. The real kube-controller-manager replaces nothing by itself;
``gpufleet slurm operator --slurmd-daemonset`` (a process, as in the chart) does.

KWOK plays the kubelet, so a pod runs no process: :class:`SlurmdPods` ties each node's
slurmd to its pod as a kubelet would (the pod deleted: that slurmd is stopped with its
process group, job steps included; a new pod: a new slurmd). It also records any moment
a pod went while Slurm listed a running job on its node, and how many nodes the roll's
drain held at once.

Checked: a job running on a node is not killed (it completes, exit 0); its node is drained
by the roll while it runs and its pod replaced after it ended; an idle node is drained,
replaced and resumed once its new slurmd registered; a node an admin drained keeps that
drain (its pod replaced, never resumed); never more than ``--slurmd-max-unavailable``
nodes out for the roll at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurm_support import Kube
from test_slurm_24_11 import node_state, run
from test_slurm_chart import CHART, helm_binary
from waiting import wait_for

from gpufleet.domain.slurm_reasons import NOT_RESPONDING_SUFFIX, ROLL_REASON, is_roll_reason
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.local.processes import ManagedProcess, ProcessRecord, stop_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NS = "slurmd-roll"
DS = "roll-gpufleet-slurmd"
ADMIN = "admin: bios update"
JOB_S = 30


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    spec = ClusterSpec(nodes=3, redfish=False, slurm_version="24.11")
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        yield info
    assert not processes.processes_using(info.run_dir)


def daemonset(tag: str) -> str:
    """The chart's slurmd DaemonSet, as helm renders it for release ``roll``."""
    helm = helm_binary()
    assert helm is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    r = subprocess.run(
        [
            helm, "template", "roll", str(CHART), "--namespace", NS,
            "--show-only", "templates/slurmd.yaml", "--set", f"slurmImage.tag={tag}",
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return r.stdout


def apply(info: ClusterInfo, manifest: str) -> None:
    subprocess.run(
        [str(info.kubectl), "apply", "--server-side", "--force-conflicts", "-f", "-"],
        input=manifest, env=info.kube_env(), check=True, capture_output=True, text=True,
    )  # fmt: skip


class SlurmdPods:
    """Each node's slurmd lives and dies with its slurmd pod, as under a kubelet."""

    def __init__(self, info: ClusterInfo, kube: Kube) -> None:
        self.info, self.kube = info, kube
        self.records: dict[str, ProcessRecord] = {
            p.name.removeprefix("slurmd "): p
            for p in info.processes
            if p.name.startswith("slurmd ")
        }
        self.argv = {
            n: Path(f"/proc/{r.pid}/cmdline").read_bytes() for n, r in self.records.items()
        }
        self.started: list[ManagedProcess] = []
        self.pods: dict[str, str] = {}
        self.killed_under_a_job: list[str] = []
        self.most_out = 0
        self.replaced: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SlurmdPods:
        self.pods = self._pods()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for p in self.started:
            p.stop()

    def _pods(self) -> dict[str, str]:
        items = self.kube.get(f"/api/v1/namespaces/{NS}/pods")["items"]
        return {
            p["spec"]["nodeName"]: p["metadata"]["name"]
            for p in items
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        }

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            now = self._pods()
            out = [n for n in self.records if rolling(self.info, n)]
            self.most_out = max(self.most_out, len(out))
            for node in self.records:
                if now.get(node) != self.pods.get(node) and self.pods.get(node):
                    self._pod_gone(node)
                if now.get(node) and now.get(node) != self.pods.get(node):
                    self._pod_new(node)
            self.pods = now

    def _pod_gone(self, node: str) -> None:
        running = run(self.info, "squeue", "-h", "-w", node, "-t", "R", "-o", "%i")
        if running:
            self.killed_under_a_job.append(f"{node}: jobs {running.split()}")
        stop_records([self.records[node]], grace=2)

    def _pod_new(self, node: str) -> None:
        argv = [a.decode() for a in self.argv[node].split(b"\0") if a]
        proc = ManagedProcess(
            f"slurmd {node}",
            argv,
            self.info.logs_dir / f"slurmd-{node}-pod.log",
            env=self.info.slurm_env(),
        ).start()
        assert proc.record is not None
        self.records[node] = proc.record
        self.started.append(proc)
        self.replaced.append(node)


def operator(info: ClusterInfo, log: Path) -> subprocess.Popen[bytes]:
    assert info.slurmrestd_url and info.slurm_conf
    args = [
        sys.executable, "-m", "gpufleet.cli.main", "slurm", "operator",
        "--kubeconfig", str(info.kubeconfig),
        "--slurmrestd-url", info.slurmrestd_url,
        "--jwt-key-file", str(info.slurm_conf.parent / "jwt_hs256.key"),
        "--slurm-conf", str(info.slurm_conf),
        "--slurmd-daemonset", f"{NS}/{DS}",
        "--slurmd-max-unavailable", "1",
        "--interval", "1",
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )


def test_a_job_runs_through_a_slurmd_upgrade(cluster: ClusterInfo) -> None:
    info = cluster
    kube = Kube(info)
    busy, idle, admin = info.node_names
    kube.http.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
    first = daemonset("24.11.5")
    spec = yaml.safe_load(first)["spec"]
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    for n in info.node_names:  # as the SlurmCluster operator labels its members
        kube.patch_node(n, {"metadata": {"labels": spec["template"]["spec"]["nodeSelector"]}})
    apply(info, first)
    wait_for("a slurmd pod Running on each node", lambda: running_pods(kube) == 3, 60)

    run(info, "scontrol", "update", f"nodename={admin}", "state=drain", f"reason={ADMIN}")
    job = run(
        info, "sbatch", "--parsable", "-o", "/dev/null", "-w", busy, "--wrap", f"sleep {JOB_S}"
    )
    wait_for(f"job {job} running", lambda: job_state(info, job) == "RUNNING", 30)

    pods = SlurmdPods(info, kube).start()
    op = operator(info, info.logs_dir / "slurmd-roll-operator.log")
    try:
        apply(info, daemonset("24.11.6"))  # what `helm upgrade --set slurmImage.tag=...` sends

        def busy_draining() -> bool:
            return node_state(info, busy) == ("draining", ROLL_REASON)

        wait_for(f"{busy} drained by the roll while job {job} runs", busy_draining, 60)
        assert job_state(info, job) == "RUNNING"
        assert busy not in pods.replaced, "its pod went while its job ran"
        assert idle in pods.replaced
        # Just resumed, a node shows idle* until slurmctld's next ping.
        wait_for(f"{idle} back in service before {busy}", lambda: in_service(info, idle), 30)
        wait_for("the admin's drain kept", lambda: admin_drained(info, admin), 30)

        def rolled() -> bool:
            return current_pods(kube) == 3 and in_service(info, busy)

        wait_for("every slurmd pod replaced and the busy node resumed", rolled, JOB_S + 60)
        assert job_state(info, job) == "COMPLETED"
        assert run(info, "scontrol", "show", "job", job).count("ExitCode=0:0") == 1
        assert pods.killed_under_a_job == []
        assert sorted(pods.replaced) == sorted(info.node_names)
        wait_for("the admin's drain kept", lambda: admin_drained(info, admin))
        wait_for(f"{idle} back in service", lambda: in_service(info, idle))
        assert pods.most_out == 1
    finally:
        op.terminate()
        op.wait(10)
        pods.stop()
        run(info, "scontrol", "update", f"nodename={admin}", "state=resume")


def rolling(info: ClusterInfo, node: str) -> bool:
    """Drained by the roll: its reason, or with Slurm 24.11's `` : Not responding`` once
    the node went unanswered while its pod was replaced (decision 0218)."""
    state, reason = node_state(info, node)
    return state.startswith("drain") and is_roll_reason(reason)


def in_service(info: ClusterInfo, node: str) -> bool:
    """Idle and not drained, answering slurmctld's pings (``idle``, not ``idle*``). Slurm
    24.11 without accounting storage keeps a resumed node's reason (SchedMD issue 50933):
    the roll's is left, or none."""
    state, reason = node_state(info, node)
    return state == "idle" and (reason == "none" or is_roll_reason(reason))


def admin_drained(info: ClusterInfo, node: str) -> bool:
    """Still drained with the admin's reason (24.11 appends `` : Not responding`` to it
    while the node's slurmd is away past SlurmdTimeout)."""
    state, reason = node_state(info, node)
    return state == "drained" and reason in (ADMIN, ADMIN + NOT_RESPONDING_SUFFIX)


def running_pods(kube: Kube) -> int:
    items = kube.get(f"/api/v1/namespaces/{NS}/pods")["items"]
    return sum(1 for p in items if p["status"].get("phase") == "Running")


def current_pods(kube: Kube) -> int:
    """Running pods made from the DaemonSet's current template."""
    ds = kube.get(f"/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}")
    generation = ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"]
    items = kube.get(f"/api/v1/namespaces/{NS}/pods")["items"]
    return sum(
        1
        for p in items
        if p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["labels"].get("pod-template-generation") == generation
    )


def job_state(info: ClusterInfo, job: str) -> str:
    out = run(info, "scontrol", "show", "job", job)
    field: Any = next(f for f in out.split() if f.startswith("JobState="))
    return str(field.removeprefix("JobState="))
