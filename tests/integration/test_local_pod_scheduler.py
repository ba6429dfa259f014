"""The local cluster's pod scheduler (``gpufleet local up`` runs it; docs/pod-scheduler.md):
``kubectl apply`` of a Pod with ``schedulerName: gpufleet-slurm`` on the session's cluster is
scheduled by Slurm.

The scheduler is started exactly as the local cluster starts it
(:func:`gpufleet.local.cluster.pod_scheduler_process`: the cluster's kubeconfig, slurm.conf
and Slurm commands, the default scheduler name, no Lease) and is ready as the cluster judges
it (a pass done). The Pod takes its time limit from its Namespace's annotation; Slurm shows
its job under the Pod's name with the default comment prefix, and deleting the Pod ends the
job. The other pod scheduler tests run under names of their own, so this is the one that
serves the name users write. Against a cluster of ``gpufleet local up``
(``GPUFLEET_TEST_CLUSTER``), start that cluster with ``--no-pod-scheduler``: its own scheduler
serves the same name.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
import yaml
from slurm_support import Slurm
from test_local_cluster import kubectl
from waiting import wait_for

from gpufleet.domain import well_known
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local.cluster import PASSES_METRIC, ClusterInfo, pod_scheduler_process
from gpufleet.local.processes import ManagedProcess, free_ports

pytestmark = pytest.mark.integration

NS = f"local-pods-{uuid.uuid4().hex[:6]}"
"""A name of its own each run: Slurm still lists an earlier run's jobs for MinJobAge."""


@pytest.fixture(scope="module")
def scheduler(
    local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    port = free_ports(1)[0]
    log = tmp_path_factory.mktemp("local-pod-scheduler") / "pod-scheduler.log"
    proc = pod_scheduler_process(local_cluster, port, log=log)
    proc.start()
    try:
        with httpx.Client(timeout=2) as http:
            url = f"http://127.0.0.1:{port}/metrics"
            proc.wait_ready(lambda: PASSES_METRIC in http.get(url).text, timeout=90)
        yield proc
    finally:
        proc.stop()


def test_kubectl_apply_of_a_pod_for_gpufleet_slurm_is_scheduled_by_slurm(
    local_cluster: ClusterInfo, scheduler: ManagedProcess
) -> None:
    info = local_cluster
    api = SyncKube(info.apiserver_url, info.token, info.ca_file)
    slurm = Slurm(info)
    manifests = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NS,
                "annotations": {well_known.SLURM_POD_ANNOTATION_PREFIX + "time-limit": "10"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train", "namespace": NS},
            "spec": {
                "schedulerName": well_known.POD_SCHEDULER_NAME,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "train",
                        "image": "example.invalid/train:1",
                        "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "2"}},
                    }
                ],
            },
        },
    ]
    job_id = 0
    try:
        kubectl(info, "apply", "-f", "-", stdin=yaml.safe_dump_all(manifests))

        def bound() -> dict[str, str] | None:
            assert scheduler.poll() is None, scheduler.log.read_text()[-3000:]
            pod = api.get(f"/api/v1/namespaces/{NS}/pods/train")
            if not pod["spec"].get("nodeName"):
                return None
            return {"node": pod["spec"]["nodeName"], **pod["metadata"]["annotations"]}

        placed = wait_for("the pod bound by the pod scheduler", bound, timeout=60, step=0.3)
        job_id = int(placed[well_known.ANNOTATION_SLURM_JOB])
        assert placed[well_known.ANNOTATION_SLURM_NODE] == placed["node"]
        line = slurm.run("squeue", "-h", "-j", str(job_id), "-o", "%j|%T|%N|%l|%b|%k").strip()
        name, state, node, limit, gres, comment = line.split("|", 5)
        assert (name, state, node) == (f"{NS}/train", "RUNNING", placed["node"])
        assert limit == "10:00"  # the Namespace's slurm.gpufleet.io/time-limit
        assert "gpu:2" in gres
        assert comment.startswith(f"{well_known.POD_JOB_COMMENT_PREFIX}{NS}/pod/train/")

        kubectl(info, "delete", "pod", "train", "-n", NS, "--wait=false")

        def ended() -> bool:
            out = slurm.run("squeue", "-h", "--states=all", "-j", str(job_id), "-o", "%T")
            return out.strip() in ("", "CANCELLED", "COMPLETED", "COMPLETING")

        wait_for("the Slurm job ended with its pod", ended, timeout=60, step=0.3)
    finally:
        if job_id:
            slurm.run("scancel", str(job_id), check=False)
        api.delete(f"/api/v1/namespaces/{NS}")
        api.close()
