"""The SlurmCluster operator against the real apiserver and Slurm: render, reconfigure, status."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
import yaml
from slurm_support import Kube

from gpufleet.api import slurmcluster as crd
from gpufleet.domain import well_known
from gpufleet.kubeapi import KubeApi
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.operator import ClusterOperator
from gpufleet.slurm.restapi import RestConfig, SlurmRest
from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig

pytestmark = pytest.mark.integration
NS = "slurm-operator-test"


def test_slurmcluster_is_rendered_reconfigured_and_reported(local_cluster: ClusterInfo) -> None:
    info = local_cluster
    kube = Kube(info)
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
    kube.http.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
    body = {
        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
        "kind": crd.KIND,
        "metadata": {"name": "research", "namespace": NS},
        "spec": {
            "nodePools": [{"name": "h100", "nodeSelector": {"nvidia.com/gpu.present": "true"}}],
            "partitions": [{"name": "batch", "pools": ["h100"], "default": True}],
        },
    }
    base = f"/apis/{well_known.GROUP}/{well_known.VERSION}/namespaces/{NS}/{crd.PLURAL}"
    r = kube.http.post(base, json=body)
    assert r.status_code == 201, r.text
    bad = {
        **body,
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
