"""The local cluster does what issue 3 promises, against the real daemons."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from waiting import wait_for

from gpufleet.local import processes
from gpufleet.local.cluster import STATE_FILE, TEMP_PREFIX, ClusterInfo, load_info, reap_orphans

pytestmark = pytest.mark.integration


def kubectl(info: ClusterInfo, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(info.kubectl), *args],
        env=info.kube_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def kubectl_json(info: ClusterInfo, *args: str) -> Any:
    return json.loads(kubectl(info, *args, "-o", "json"))


def slurm(info: ClusterInfo, *args: str) -> str:
    result = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


def test_apiserver_reports_its_real_version(local_cluster: ClusterInfo) -> None:
    version = httpx.get(
        f"{local_cluster.apiserver_url}/version",
        headers={"Authorization": f"Bearer {local_cluster.token}"},
        verify=ssl.create_default_context(cafile=str(local_cluster.ca_file)),
    ).json()
    assert version["gitVersion"].startswith("v1.")
    assert int(version["minor"]) >= 33
    assert "master" not in version["gitVersion"]


def test_kubectl_shows_the_gpu_nodes(local_cluster: ClusterInfo) -> None:
    nodes = kubectl_json(local_cluster, "get", "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(local_cluster.node_names)
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        labels = node["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"]
        assert labels["network.topology.kubernetes.io/block"].startswith("ib-leaf-")
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


def test_gpu_pod_is_scheduled_onto_a_kwok_node_and_runs(local_cluster: ClusterInfo) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "example.invalid/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ]
        },
    }
    kubectl(local_cluster, "apply", "-f", "-", stdin=json.dumps(pod))
    try:

        def running() -> dict[str, Any] | None:
            p = kubectl_json(local_cluster, "get", "pod", "gpu-pod")
            return p if p["status"].get("phase") == "Running" else None

        p = wait_for("the GPU pod to run", running, timeout=60)
        assert p["spec"]["nodeName"] in local_cluster.node_names
    finally:
        kubectl(local_cluster, "delete", "pod", "gpu-pod", "--wait=false")


def test_controller_manager_runs_jobs_and_collects_garbage(local_cluster: ClusterInfo) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gc-check", "namespace": "default"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "example.invalid/c:1"}],
                }
            }
        },
    }
    kubectl(local_cluster, "apply", "-f", "-", stdin=json.dumps(job))
    wait_for(
        "the Job to succeed",
        lambda: (
            kubectl_json(local_cluster, "get", "job", "gc-check")["status"].get("succeeded") == 1
        ),
        timeout=60,
    )
    assert kubectl_json(local_cluster, "get", "pods", "-l", "job-name=gc-check")["items"]
    kubectl(local_cluster, "delete", "job", "gc-check", "--cascade=background")
    wait_for(
        "the garbage collector to delete the Job's pods",
        lambda: not kubectl_json(local_cluster, "get", "pods", "-l", "job-name=gc-check")["items"],
        timeout=60,
    )


def test_drain_evicts_a_deployment_pod_which_comes_back_elsewhere(
    local_cluster: ClusterInfo,
) -> None:
    """Deployments, the Eviction API and rescheduling all work (kubectl drain uses them)."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "evict-check", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "evict-check"}},
            "template": {
                "metadata": {"labels": {"app": "evict-check"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "example.invalid/c:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }

    def running_pod_nodes() -> list[str]:
        pods = kubectl_json(local_cluster, "get", "pods", "-l", "app=evict-check")["items"]
        return [
            p["spec"]["nodeName"]
            for p in pods
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    kubectl(local_cluster, "apply", "-f", "-", stdin=json.dumps(deployment))
    drained: str | None = None
    try:
        drained = wait_for("the Deployment's pod to run", running_pod_nodes, timeout=60)[0]
        kubectl(local_cluster, "drain", drained, "--ignore-daemonsets", "--timeout=60s")
        moved = wait_for(
            "the evicted pod to be replaced on another node",
            lambda: [n for n in running_pod_nodes() if n != drained],
            timeout=60,
        )
        assert moved and drained not in running_pod_nodes()
    finally:
        if drained is not None:
            kubectl(local_cluster, "uncordon", drained)
        kubectl(local_cluster, "delete", "deployment", "evict-check", "--wait=false")


def test_sinfo_shows_idle_gpu_nodes(local_cluster: ClusterInfo) -> None:
    lines = slurm(local_cluster, "sinfo", "-h", "-N", "-p", "batch", "-o", "%N %t %G").splitlines()
    assert sorted(lines) == sorted(f"{n} idle gpu:8" for n in local_cluster.node_names)


def test_two_node_gpu_job_sees_cuda_visible_devices(local_cluster: ClusterInfo) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "job.out"
        script = "srun -l bash -c 'echo $SLURMD_NODENAME CVD=$CUDA_VISIBLE_DEVICES'"
        submitted = slurm(
            local_cluster,
            "sbatch",
            "--parsable",
            "-N2",
            "--gres=gpu:8",
            f"--output={out}",
            "--wrap",
            script,
        )
        job_id = submitted.strip().split(";")[0]

        def finished() -> str | None:
            state = slurm(local_cluster, "squeue", "-h", "-j", job_id, "-o", "%T").strip()
            return "done" if state in ("", "COMPLETED") else None

        wait_for(f"job {job_id} to finish", finished, timeout=60)
        lines = sorted(
            wait_for(
                "the job output",
                lambda: out.exists() and out.read_text().split("\n"),
                timeout=60,
            )
        )
        lines = [line for line in lines if line]
    assert len(lines) == 2, lines
    nodes = {line.split()[1] for line in lines}
    assert nodes <= set(local_cluster.node_names) and len(nodes) == 2
    assert all(line.endswith("CVD=0,1,2,3,4,5,6,7") for line in lines)


def test_slurmrestd_answers_with_the_jwt(local_cluster: ClusterInfo) -> None:
    url = f"{local_cluster.slurmrestd_url}/slurm/{local_cluster.slurm_api_version}/nodes"
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": local_cluster.slurm_jwt or ""}
    nodes = httpx.get(url, headers=headers, timeout=10).json()["nodes"]
    assert sorted(n["name"] for n in nodes) == sorted(local_cluster.node_names)
    assert {n["gres"] for n in nodes} == {"gpu:8"}
    assert httpx.get(url, timeout=10).status_code == 401


def test_redfish_power_cycle_is_seen_on_that_bmc_only(local_cluster: ClusterInfo) -> None:
    target, *others = local_cluster.node_names

    def system(node: str) -> dict[str, Any]:
        bmc = local_cluster.bmcs[node]
        resp = httpx.get(bmc.system_url, auth=(bmc.user, bmc.password), timeout=5)
        resp.raise_for_status()
        return resp.json()  # type: ignore[no-any-return]

    before = {n: system(n)["Oem"]["Gpufleet"]["ResetCount"] for n in local_cluster.node_names}
    bmc = local_cluster.bmcs[target]
    assert httpx.get(bmc.system_url, timeout=5).status_code == 401
    auth = (bmc.user, bmc.password)
    patch = {"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}
    assert httpx.patch(bmc.system_url, json=patch, auth=auth, timeout=5).status_code == 204
    reset = httpx.post(
        f"{bmc.system_url}/Actions/ComputerSystem.Reset",
        json={"ResetType": "PowerCycle"},
        auth=auth,
        timeout=5,
    )
    assert reset.status_code == 204

    after = system(target)
    assert after["PowerState"] == "On"
    assert after["Oem"]["Gpufleet"]["ResetCount"] == before[target] + 1
    assert after["Oem"]["Gpufleet"]["LastBootSource"] == "Pxe"
    assert after["Boot"]["BootSourceOverrideEnabled"] == "Disabled"
    log = httpx.get(f"{bmc.system_url}/LogServices/EventLog/Entries", auth=auth, timeout=5).json()
    assert any("PowerCycle" in e["Message"] for e in log["Members"])
    for node in others:
        assert system(node)["Oem"]["Gpufleet"]["ResetCount"] == before[node]


def test_second_cluster_runs_beside_the_first_and_down_leaves_nothing(
    local_cluster: ClusterInfo,
) -> None:
    """The CLI starts a second cluster; both answer; ``down`` leaves no process behind."""
    run_dir = Path(tempfile.mkdtemp(prefix="gpufleet-second-"))
    run_dir.chmod(0o755)
    cli = [sys.executable, "-m", "gpufleet.cli.main", "local"]
    up = subprocess.run(
        [*cli, "up", "--nodes", "2", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        assert "export KUBECONFIG=" in up.stdout and "export SLURM_CONF=" in up.stdout
        second = load_info(run_dir)
        assert second.apiserver_url != local_cluster.apiserver_url
        nodes = kubectl_json(second, "get", "nodes")["items"]
        assert len(nodes) == 2
        idle = slurm(second, "sinfo", "-h", "-N", "-p", "batch", "-o", "%N %t").split("\n")
        assert len([line for line in idle if line.endswith(" idle")]) == 2
        # The first cluster is untouched.
        assert len(kubectl_json(local_cluster, "get", "nodes")["items"]) == len(
            local_cluster.node_names
        )
        status = subprocess.run([*cli, "status", "--run-dir", str(run_dir)], capture_output=True)
        assert status.returncode == 0
    finally:
        down = subprocess.run(
            [*cli, "down", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=60
        )
    assert down.returncode == 0, down.stderr
    assert not any(p.alive() for p in second.processes)
    assert processes.processes_using(run_dir) == []
    status = subprocess.run([*cli, "status", "--run-dir", str(run_dir)], capture_output=True)
    assert status.returncode == 3
    shutil.rmtree(run_dir)


def test_a_cluster_whose_owner_died_is_reaped_by_the_next_start() -> None:
    run_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    sleeper = processes.ManagedProcess("sleeper", ["sleep", "120"], run_dir / "logs" / "s.log")
    sleeper.start()
    assert sleeper.record is not None
    info = ClusterInfo(
        run_dir=run_dir,
        node_names=[],
        gpus_per_node=8,
        kubeconfig=run_dir / "kubeconfig",
        apiserver_url="https://127.0.0.1:1",
        token="t",
        ca_file=run_dir / "ca",
        etcd_url="http://127.0.0.1:2",
        processes=[sleeper.record],
        owner=processes.ProcessRecord("owner", 1, -1, ""),  # pid 1 with another start time: gone
    )
    (run_dir / STATE_FILE).write_text(info.to_json())
    try:
        assert run_dir in reap_orphans(Path(tempfile.gettempdir()))
        assert not sleeper.record.alive()
        assert not run_dir.exists()
    finally:
        sleeper.stop(grace=0.5)
