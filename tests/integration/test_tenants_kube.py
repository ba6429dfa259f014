"""The tenant controller's Kubernetes side on the real apiserver and controller-manager.

Two tenants: the older keeps a namespace both claim, the newer gets Conflict and
nothing of it is written until it lets go; the quota's ResourceQuotas make the real
apiserver refuse a pod beyond the tenant's GPUs (the other namespace's share shrinks
as one namespace uses GPUs); a quota lowered below use only blocks new work; an object
of the same name without gpufleet's labels is left alone; deleting a tenant sets
quota 0, waits for its GPU pod to end, then removes what it wrote and the finalizer.
The Slurm side (the same loop with a Slurm port) is tested with real daemons in
tests/integration/test_slurm_tenancy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
from typing import Any

import httpx
import pytest
from controller_harness import GV, Api, install
from prometheus_client import CollectorRegistry
from waiting import wait_for

from gpufleet.domain import tenancy
from gpufleet.kubeapi import ApiError, Forbidden, KubeApi, NotFound
from gpufleet.kubeapi.resources import NAMESPACES, PODS
from gpufleet.tenants.controller import RESOURCES, TENANTS, TenantController, TenantSettings
from gpufleet.tenants.metrics import TenantMetrics

pytestmark = pytest.mark.integration

NS = ("tn-a1", "tn-a2", "tn-b1", "tn-c1")
RQ, RB, NP = RESOURCES["ResourceQuota"], RESOURCES["RoleBinding"], RESOURCES["NetworkPolicy"]


def tenant(name: str, namespaces: list[str], user: str, uid: int, quota: int | None) -> Any:
    spec: dict[str, Any] = {
        "namespaces": namespaces,
        "users": [{"name": user, "uid": uid, "gid": uid}],
    }
    if quota is not None:
        spec["gpuQuota"] = quota
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name},
        "spec": spec,
    }


def gpu_pod(name: str, gpus: int) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"tn-test": "nowhere"},  # never scheduled: it only holds quota
            "containers": [
                {
                    "name": "c",
                    "image": "train",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def cond(t: Any, type_: str) -> Any:
    for c in (t.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


async def until(what: str, check: Any, timeout: float = 30.0) -> Any:
    for _ in range(int(timeout / 0.2)):
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def api(local_cluster: Any) -> Any:
    api = Api(local_cluster)
    install(api)
    return api


def test_tenants_on_the_real_apiserver(api: Api, local_cluster: Any) -> None:
    asyncio.run(_scenario(str(local_cluster.kubeconfig)))


async def _scenario(kubeconfig: str) -> None:
    kube = await KubeApi.connect(kubeconfig)
    registry = CollectorRegistry()
    ctl = TenantController(
        kube, None, TenantSettings(interval_s=60.0), metrics=TenantMetrics(registry)
    )

    def gauge(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    try:
        for ns in NS:
            await kube.create(NAMESPACES, {"metadata": {"name": ns}})
        foreign = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "gpufleet-tenant-beta"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "x"}],
        }
        await kube.create(RB, foreign, namespace="tn-b1")
        await kube.create(TENANTS, tenant("alpha", ["tn-a1", "tn-a2"], "alice", 20001, 4))
        await kube.create(TENANTS, tenant("beta", ["tn-b1", "tn-a2"], "bob", 20002, None))

        await ctl.reconcile()
        alpha = await kube.get(TENANTS, "alpha")
        beta = await kube.get(TENANTS, "beta")
        assert tenancy.FINALIZER in alpha["metadata"]["finalizers"]
        assert cond(alpha, "Ready")["status"] == "True"
        assert alpha["status"]["limits"] == {"kubernetesGpus": 4, "slurmGpus": 4}
        assert cond(beta, "Conflict")["status"] == "True"
        assert "namespace tn-a2 belongs to tenant alpha" in cond(beta, "Conflict")["message"]
        for ns in ("tn-a1", "tn-a2"):
            rq = await kube.get(RQ, "gpufleet-tenant-alpha", namespace=ns)
            assert rq["spec"]["hard"] == {"requests.nvidia.com/gpu": "4"}
            rb = await kube.get(RB, "gpufleet-tenant-alpha", namespace=ns)
            assert [s["name"] for s in rb["subjects"]] == ["alice"]
            await kube.get(NP, "gpufleet-tenant-alpha", namespace=ns)
        for r in (RQ, NP):  # nothing of the tenant in conflict
            assert (await kube.list(r, namespace="tn-b1")).items == []

        # A second pass with nothing changed writes nothing (the objects read back equal).
        written = {r: await _versions(kube, r) for r in (RQ, RB, NP)}
        await ctl.reconcile()
        assert {r: await _versions(kube, r) for r in (RQ, RB, NP)} == written

        # 3 GPUs in tn-a1 (admitted once the controller-manager counted the quota) leave
        # tn-a2 one: the real apiserver refuses 2 more there.
        async def admitted() -> bool:
            try:
                await kube.create(PODS, gpu_pod("train", 3), namespace="tn-a1")
            except Forbidden:
                return False  # the quota's status not yet computed
            return True

        await until("a 3-GPU pod admitted in tn-a1", admitted)
        await ctl.reconcile()
        rq2 = await kube.get(RQ, "gpufleet-tenant-alpha", namespace="tn-a2")
        assert rq2["spec"]["hard"] == {"requests.nvidia.com/gpu": "1"}
        alpha = await kube.get(TENANTS, "alpha")
        assert alpha["status"]["usage"] == {"kubernetesGpus": 3, "slurmGpus": 0}
        assert alpha["status"]["limits"] == {"kubernetesGpus": 4, "slurmGpus": 1}
        assert gauge("gpufleet_tenant_gpus_in_use", tenant="alpha", scheduler="kubernetes") == 3
        assert gauge("gpufleet_tenant_gpu_limit", tenant="alpha", scheduler="slurm") == 1
        assert gauge("gpufleet_tenant_condition", tenant="beta", condition="Conflict") == 1

        async def quota_seen() -> bool:
            rq = await kube.get(RQ, "gpufleet-tenant-alpha", namespace="tn-a2")
            return (rq.get("status") or {}).get("hard") == {"requests.nvidia.com/gpu": "1"}

        await until("tn-a2's quota of 1 GPU counted", quota_seen)
        with pytest.raises(Forbidden) as refused:
            await kube.create(PODS, gpu_pod("more", 2), namespace="tn-a2")
        assert "exceeded quota" in str(refused.value)

        # Lowered below use: QuotaBelowUse, the running pod stays.
        await kube.patch(TENANTS, "alpha", {"spec": {"gpuQuota": 2}})
        await ctl.reconcile()
        alpha = await kube.get(TENANTS, "alpha")
        assert cond(alpha, "QuotaBelowUse")["status"] == "True"
        assert "3 GPUs in use" in cond(alpha, "QuotaBelowUse")["message"]
        await kube.get(PODS, "train", namespace="tn-a1")

        # beta lets go of tn-a2; the running loop (woken by the Tenant watch) applies it,
        # leaving the RoleBinding it did not write alone.
        await kube.patch(TENANTS, "beta", {"spec": {"namespaces": ["tn-b1"]}})
        loop = asyncio.create_task(ctl.run())

        async def beta_applied() -> Any:
            b = await kube.get(TENANTS, "beta")
            return b if cond(b, "Conflict").get("status") == "False" else None

        beta = await until("beta applied by the loop", beta_applied)
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        assert cond(beta, "Ready")["reason"] == "NotOwned"
        assert "RoleBinding tn-b1/gpufleet-tenant-beta" in cond(beta, "Ready")["message"]
        rb = await kube.get(RB, "gpufleet-tenant-beta", namespace="tn-b1")
        assert rb["roleRef"]["name"] == "view" and rb["subjects"][0]["name"] == "x"
        await kube.get(NP, "gpufleet-tenant-beta", namespace="tn-b1")
        assert (await kube.list(RQ, namespace="tn-b1")).items == []  # no quota: none

        # gamma, applied, then made invalid (a default QOS not among its QOS: the CRD's schema
        # accepts it, the controller does not): Ready=False Invalid; deleted like that, its
        # objects go and it is released (its namespaces unknown, nothing is waited for).
        await kube.create(TENANTS, tenant("gamma", ["tn-c1"], "carol", 20003, None))
        await ctl.reconcile()
        await kube.get(RB, "gpufleet-tenant-gamma", namespace="tn-c1")
        bad = {"slurm": {"qos": ["normal"], "defaultQos": "high"}}
        await kube.patch(TENANTS, "gamma", {"spec": bad})
        await ctl.reconcile()
        gamma = await kube.get(TENANTS, "gamma")
        assert cond(gamma, "Ready")["reason"] == "Invalid"
        assert "defaultQos 'high' is not one of qos" in cond(gamma, "Ready")["message"]
        await kube.delete(TENANTS, "gamma")
        await ctl.reconcile()
        assert await _gone(kube, RB, "gpufleet-tenant-gamma", "tn-c1")
        await until("gamma released", lambda: _gone(kube, TENANTS, "gamma", None))

        # Deleting alpha: quota 0, wait for its GPU pod, then remove and release.
        await kube.delete(TENANTS, "alpha")
        await ctl.reconcile()
        alpha = await kube.get(TENANTS, "alpha")
        assert cond(alpha, "Deleting")["reason"] == "WaitingForWork"
        assert alpha["status"]["left"] == ["pod tn-a1/train holds 3 GPUs"]
        for ns in ("tn-a1", "tn-a2"):
            rq = await kube.get(RQ, "gpufleet-tenant-alpha", namespace=ns)
            assert rq["spec"]["hard"] == {"requests.nvidia.com/gpu": "0"}
        await kube.delete(PODS, "train", namespace="tn-a1")
        await until("the pod gone", lambda: _gone(kube, PODS, "train", "tn-a1"))
        await ctl.reconcile()
        for r in (RQ, RB, NP):
            for ns in ("tn-a1", "tn-a2"):
                assert await _gone(kube, r, "gpufleet-tenant-alpha", ns)
        await until("alpha released", lambda: _gone(kube, TENANTS, "alpha", None))
        assert gauge("gpufleet_tenant_gpu_quota", tenant="alpha") is None  # series dropped
        assert await kube.get(RB, "gpufleet-tenant-beta", namespace="tn-b1")
    finally:
        for name in ("alpha", "beta", "gamma"):
            with contextlib.suppress(ApiError):
                await kube.patch(TENANTS, name, {"metadata": {"finalizers": []}})
                await kube.delete(TENANTS, name)
        for ns in NS:
            with contextlib.suppress(ApiError):
                await kube.delete(NAMESPACES, ns)


async def _gone(kube: KubeApi, resource: Any, name: str, namespace: str | None) -> bool:
    try:
        await kube.get(resource, name, namespace=namespace)
    except NotFound:
        return True
    return False


async def _versions(kube: KubeApi, resource: Any) -> dict[str, str]:
    """resourceVersion of each of alpha's objects of one kind (the spec: status excluded)."""
    out = {}
    for ns in ("tn-a1", "tn-a2"):
        o = await kube.get(resource, "gpufleet-tenant-alpha", namespace=ns)
        out[ns] = str(o["metadata"].get("generation") or o["metadata"]["resourceVersion"])
    return out


def test_the_command_acts_on_a_tenant_and_serves_its_series(api: Api, local_cluster: Any) -> None:
    """``gpufleet tenant-controller`` as the chart runs it (its Lease, /metrics): a Tenant
    applied, its series served, its deletion released; SIGTERM ends it with status 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api.post("/api/v1/namespaces", {"metadata": {"name": "tn-d1"}}, ok=(201, 409))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufleet.cli.main",
            "tenant-controller",
            "--kubeconfig",
            str(local_cluster.kubeconfig),
            "--lease-namespace",
            "default",
            "--lease-name",
            "tn-test",
            "--metrics-port",
            str(port),
            "--interval",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    path = f"{GV}/tenants/delta"
    try:
        api.post(f"{GV}/tenants", tenant("delta", ["tn-d1"], "dave", 20004, 2))
        wait_for("delta Ready", lambda: cond(api.get(path), "Ready").get("status") == "True")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'gpufleet_tenant_gpu_quota{tenant="delta"} 2.0' in metrics
        api.delete(path)
        wait_for("delta released", lambda: api.http.get(path).status_code == 404)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "wrote RoleBinding tn-d1/gpufleet-tenant-delta" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if api.http.get(path).status_code == 200:
            api.patch(path, {"metadata": {"finalizers": []}})
            api.delete(path)
        api.delete("/api/v1/namespaces/tn-d1")
