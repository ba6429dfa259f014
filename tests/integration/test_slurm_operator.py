"""The SlurmCluster operator against the real apiserver and Slurm: render, reconfigure, status."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
import yaml
from slurm_support import Kube

from gpufleet.api import slurmcluster as crd
from gpufleet.clock import ManualClock
from gpufleet.domain import well_known
from gpufleet.kubeapi import KubeApi
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.operator import ClusterOperator, OperatorSettings
from gpufleet.slurm.restapi import RestConfig, SlurmRest
from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig

pytestmark = pytest.mark.integration
NS = "slurm-operator-test"


def research_cluster(info: ClusterInfo, kube: Kube, ns: str) -> str:
    """The SlurmCluster CRD installed (Established), and in namespace ``ns`` the SlurmCluster
    ``research`` (every GPU node in pool h100, one partition); returns its collection path."""
    subprocess.run(
        [str(info.kubectl), "apply", "--server-side", "-f", "-"],
        input=yaml.safe_dump(crd.crd_manifest()),
        env=info.kube_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    subprocess.run(
        [
            str(info.kubectl),
            "wait",
            "--for=condition=Established",
            f"crd/{crd.PLURAL}.{well_known.GROUP}",
        ],
        env=info.kube_env(),
        check=True,
        capture_output=True,
    )
    kube.http.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
    body = {
        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
        "kind": crd.KIND,
        "metadata": {"name": "research", "namespace": ns},
        "spec": {
            "nodePools": [{"name": "h100", "nodeSelector": {"nvidia.com/gpu.present": "true"}}],
            "partitions": [{"name": "batch", "pools": ["h100"], "default": True}],
        },
    }
    base = f"/apis/{well_known.GROUP}/{well_known.VERSION}/namespaces/{ns}/{crd.PLURAL}"
    r = kube.http.post(base, json=body)
    assert r.status_code == 201, r.text
    return base


def test_slurmcluster_is_rendered_reconfigured_and_reported(local_cluster: ClusterInfo) -> None:
    info = local_cluster
    kube = Kube(info)
    base = research_cluster(info, kube, NS)
    bad = {
        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
        "kind": crd.KIND,
        "metadata": {"name": "bad", "namespace": NS},
        "spec": {"nodePools": [{"name": "x", "cpus": -1}], "partitions": []},
    }
    assert kube.http.post(base, json=bad).status_code == 422  # the schema rejects it

    async def reconcile() -> dict:
        api = await KubeApi.connect(str(info.kubeconfig))
        assert info.slurmrestd_url and info.slurm_jwt
        rest = SlurmRest(RestConfig(info.slurmrestd_url, "root", info.slurm_jwt))
        scontrol = Scontrol(ScontrolConfig(env={"SLURM_CONF": str(info.slurm_conf)}))
        op = ClusterOperator(kube=api, scontrol=scontrol, rest=rest)
        try:
            first = await op.reconcile(NS, "research")
            second = await op.reconcile(NS, "research")
        finally:
            await rest.aclose()
        assert first is not None and second is not None
        assert second["lastReconfigure"] == first["lastReconfigure"]  # unchanged: no reconfigure
        return second

    try:
        status = asyncio.run(reconcile())
        assert status["nodes"] == len(info.node_names)
        assert status["nodesByState"] == {"drained": 0, "idle": len(info.node_names)}
        assert status["lastReconfigure"]
        obj = kube.get(f"{base}/research")
        assert obj["status"]["conditions"][0]["status"] == "True"
        cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/research-slurm-config")
        assert set(cm["data"]) == {"slurm.conf", "gres.conf", "cgroup.conf", "topology.conf"}
        for name in info.node_names:
            assert f"NodeName={name} " in cm["data"]["slurm.conf"]
            labels = kube.node(name)["metadata"]["labels"]
            assert labels[well_known.LABEL_SLURM_CLUSTER] == f"{NS}.research"
        assert "SwitchName=ib-leaf-000" in cm["data"]["topology.conf"]
    finally:
        kube.http.delete(f"/api/v1/namespaces/{NS}")
        for name in info.node_names:
            kube.patch_node(name, {"metadata": {"labels": {well_known.LABEL_SLURM_CLUSTER: None}}})


class CountingScontrol(Scontrol):
    """The real scontrol, counting the reconfigures asked of it."""

    reconfigures = 0

    async def reconfigure(self) -> None:
        self.reconfigures += 1
        await super().reconfigure()


def test_a_failed_reconfigure_is_not_retried_every_pass(local_cluster: ClusterInfo) -> None:
    """scontrol cannot reach slurmctld (a config naming a port nothing listens on): the
    reconfigure fails, and the passes after it do not send another (a reconfigure restarts
    a 24.11 slurmctld: resent every pass, a slow one never came back) until
    reconfigure_retry_s has passed; then it is tried again, and succeeds once slurmctld
    is reachable."""
    info = local_cluster
    kube = Kube(info)
    ns = f"{NS}-retry"
    research_cluster(info, kube, ns)
    assert info.slurm_conf is not None
    unreachable = info.slurm_conf.parent / "unreachable-slurm.conf"
    text = info.slurm_conf.read_text()
    port = next(line for line in text.splitlines() if line.startswith("SlurmctldPort="))
    unreachable.write_text(text.replace(port, "SlurmctldPort=9"))  # discard: nothing there

    async def passes() -> list[dict]:
        api = await KubeApi.connect(str(info.kubeconfig))
        clock = ManualClock(1_800_000_000.0)
        settings = OperatorSettings(reconfigure_retry_s=120.0)
        failing = CountingScontrol(ScontrolConfig(env={"SLURM_CONF": str(unreachable)}))
        op = ClusterOperator(kube=api, scontrol=failing, rest=None, settings=settings,
                             clock=clock)  # fmt: skip
        seen = [await op.reconcile(ns, "research")]
        clock.advance(60)
        seen.append(await op.reconcile(ns, "research"))
        assert failing.reconfigures == 1, "a second reconfigure within reconfigure_retry_s"
        clock.advance(61)
        seen.append(await op.reconcile(ns, "research"))
        assert failing.reconfigures == 2
        working = CountingScontrol(ScontrolConfig(env={"SLURM_CONF": str(info.slurm_conf)}))
        op.scontrol = working
        seen.append(await op.reconcile(ns, "research"))  # still within the wait: not tried
        clock.advance(121)
        seen.append(await op.reconcile(ns, "research"))
        assert working.reconfigures == 1
        return [s or {} for s in seen]

    try:
        first, waiting, again, still, done = asyncio.run(passes())
        reasons = [s["conditions"][0]["reason"] for s in (first, waiting, again, still, done)]
        assert reasons == ["ReconfigureFailed", "ReconfigurePending", "ReconfigureFailed",
                           "ReconfigurePending", "Reconciled"], reasons  # fmt: skip
        assert "next try in 60 s" in waiting["conditions"][0]["message"]
        assert not first["configHash"] and not still["configHash"]
        assert done["configHash"] and done["lastReconfigure"]
    finally:
        kube.http.delete(f"/api/v1/namespaces/{ns}")
        for name in info.node_names:
            kube.patch_node(name, {"metadata": {"labels": {well_known.LABEL_SLURM_CLUSTER: None}}})


def test_without_reconfigure_ready_waits_for_slurmctld_to_know_every_node(
    local_cluster: ClusterInfo,
) -> None:
    """The chart's operator runs with ``reconfigure=False`` (slurmctld's pod reloads by
    itself once the new files are in its volume): it sends no reconfigure and its status
    claims none. A Node joins the pool that slurmctld does not know (its config not loaded
    yet): the SlurmCluster is not Ready (``NodesNotInSlurm``) — its users could not get
    that node — until slurmctld knows every member (here: the Node leaves the pool)."""
    info = local_cluster
    kube = Kube(info)
    ns = f"{NS}-late"
    research_cluster(info, kube, ns)
    late = "gpu-node-late"
    node = {"metadata": {"name": late, "labels": {"nvidia.com/gpu.present": "true"}}}
    assert kube.http.post("/api/v1/nodes", json=node).status_code == 201

    async def passes() -> tuple[dict, dict, int]:
        api = await KubeApi.connect(str(info.kubeconfig))
        assert info.slurmrestd_url and info.slurm_jwt
        rest = SlurmRest(RestConfig(info.slurmrestd_url, "root", info.slurm_jwt))
        counting = CountingScontrol(ScontrolConfig(env={"SLURM_CONF": str(info.slurm_conf)}))
        op = ClusterOperator(kube=api, scontrol=counting, rest=rest,
                             settings=OperatorSettings(reconfigure=False))  # fmt: skip
        try:
            pending = await op.reconcile(ns, "research")
            cm = kube.get(f"/api/v1/namespaces/{ns}/configmaps/research-slurm-config")
            assert f"NodeName={late} " in cm["data"]["slurm.conf"], "rendered all the same"
            kube.patch_node(late, {"metadata": {"labels": {"nvidia.com/gpu.present": None}}})
            known = await op.reconcile(ns, "research")
        finally:
            await rest.aclose()
        return pending or {}, known or {}, counting.reconfigures

    try:
        pending, known, reconfigures = asyncio.run(passes())
        ready = pending["conditions"][0]
        assert (ready["status"], ready["reason"]) == ("False", "NodesNotInSlurm"), ready
        assert f"does not know 1 of the {len(info.node_names) + 1} nodes" in ready["message"]
        assert pending["nodesByState"]["missing"] == 1
        ready = known["conditions"][0]
        assert (ready["status"], ready["reason"]) == ("True", "Reconciled"), ready
        assert known["configHash"] != pending["configHash"]
        assert reconfigures == 0 and not known["lastReconfigure"]
    finally:
        kube.http.delete(f"/api/v1/nodes/{late}")
        kube.http.delete(f"/api/v1/namespaces/{ns}")
        for name in info.node_names:
            kube.patch_node(name, {"metadata": {"labels": {well_known.LABEL_SLURM_CLUSTER: None}}})
