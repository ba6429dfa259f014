"""A high-priority Pod takes a node from Slurm; the job is requeued, completes; the node returns."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from slurm_support import Kube, RunningSyncer, Slurm, wait_for
from test_slurm_requeue import events, job, submit_training

from gpufleet.domain import hostlist, well_known
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

THRESHOLD = 1_000_000
NS = "slurm-preempt-test"


@pytest.fixture(scope="module")
def env(local_cluster: ClusterInfo) -> Iterator[tuple[Kube, Slurm, RunningSyncer]]:
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    for n in local_cluster.node_names:
        kube.reset_node(n)  # start clean, whatever earlier tests left
        kube.set_state(n, "production")
    kube.http.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
    kube.http.post(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        json={"metadata": {"name": "gpufleet-test-high"}, "value": 2 * THRESHOLD},
    )
    syncer = RunningSyncer(
        local_cluster,
        SyncSettings(poll_interval_s=0.5, hold_taint=True, preempt_priority=THRESHOLD),
    )
    syncer.start()
    try:
        yield kube, slurm, syncer
    finally:
        syncer.stop()
        slurm.cancel_all()
        slurm.undrain_all()
        kube.http.delete(f"/api/v1/namespaces/{NS}")
        kube.http.delete("/apis/scheduling.k8s.io/v1/priorityclasses/gpufleet-test-high")
        for n in local_cluster.node_names:
            kube.reset_node(n)


def pod_manifest(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "priorityClassName": "gpufleet-test-high",
            "containers": [
                {
                    "name": "infer",
                    "image": "example.invalid/inference:1",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }


def test_high_priority_pod_takes_a_slurm_node_and_gives_it_back(env, local_cluster, tmp_path):
    kube, slurm, syncer = env
    names = local_cluster.node_names
    wait_for(
        "held taints",
        lambda: all(
            any(t["key"] == well_known.TAINT_SLURM for t in kube.node(n)["spec"].get("taints", []))
            for n in names
        ),
        10,
    )
    # Two nodes run jobs that cannot be requeued (never lent); the other two run a
    # low-priority training job that checkpoints.
    for n in names[2:]:
        slurm.run(
            "sbatch", "--no-requeue", f"--nodelist={n}", "--output=/dev/null", "--wrap=sleep 300"
        )
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job_id = submit_training(slurm, ckpt, 30, "--nice=100")
    wait_for("first checkpoint", lambda: (ckpt / "step-00000005.json").exists(), 60)
    training_nodes = hostlist.expand(job(slurm, job_id)["nodes"])
    assert sorted(training_nodes) == sorted(names[:2])

    created = time.monotonic()
    r = kube.http.post(f"/api/v1/namespaces/{NS}/pods", json=pod_manifest("infer"))
    assert r.status_code == 201, r.text
    pod = wait_for(
        "pod Running",
        lambda: (
            (p := kube.get(f"/api/v1/namespaces/{NS}/pods/infer"))["status"].get("phase")
            == "Running"
            and p
        ),
        30,
    )
    running = time.monotonic() - created
    lent = pod["spec"]["nodeName"]
    assert lent in training_nodes
    node = kube.node(lent)
    assert node["metadata"]["annotations"][well_known.ANNOTATION_LENT_TO] == f"{NS}/infer"
    assert {"key": well_known.TAINT_SLURM, "value": "lent", "effect": "NoSchedule"} in node["spec"][
        "taints"
    ]
    assert slurm.drained(lent) == "gpufleet: lent to kubernetes"
    state = job(slurm, job_id)["job_state"]
    assert state in ("PENDING", "REQUEUED", "REQUEUE_HOLD"), state
    assert syncer.syncer is not None and syncer.syncer.lender is not None
    t = syncer.syncer.lender.stats.timings[f"{NS}/infer"]
    print(
        f"\npod pending->Running {running:.2f} s; syncer: locked {t.locked - t.seen:.3f} s, "
        f"drained+requeued {t.drained - t.seen:.3f} s, empty {t.empty - t.seen:.3f} s, "
        f"bound {t.bound - t.seen:.3f} s after it saw the pod"
    )

    kube.http.delete(f"/api/v1/namespaces/{NS}/pods/infer", params={"gracePeriodSeconds": 0})
    wait_for("node returned", lambda: slurm.drained(lent) is None, 20)
    node = kube.node(lent)
    assert well_known.ANNOTATION_LENT_TO not in (node["metadata"].get("annotations") or {})
    assert {"key": well_known.TAINT_SLURM, "value": "held", "effect": "NoSchedule"} in node["spec"][
        "taints"
    ]
    wait_for("COMPLETED", lambda: job(slurm, job_id).get("job_state") == "COMPLETED", 90, 0.5)
    starts = [e for e in events(ckpt) if e["kind"] == "start"]
    assert len(starts) == 2 and starts[1]["step"] > 0
    assert [e for e in events(ckpt) if e["kind"] == "done"][-1]["step"] == 30
