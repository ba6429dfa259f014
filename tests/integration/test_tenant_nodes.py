"""A tenant's own nodes on the real apiserver: labelled and tainted, released clean.

A Tenant selecting two KWOK nodes gets them labelled and tainted
``gpufleet.io/tenant=<name>:NoSchedule`` while a pod of someone else already running on
one keeps running (NoSchedule evicts nothing); a third node it selects carries a label of
that key set by hand, which is left alone and reported (Ready=False, NotOwned). Its
selector changed, the released node loses exactly what gpufleet set (other taints kept);
deleted, the last node is released too and the hand-set label is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from controller_harness import Api, install, labelled_kwok_nodes

from gpufleet.domain import tenant_nodes
from gpufleet.kubeapi import ApiError, KubeApi, NotFound
from gpufleet.kubeapi.resources import NAMESPACES, NODES, PODS
from gpufleet.tenants.controller import TENANTS, TenantController, TenantSettings

pytestmark = pytest.mark.integration

A, B, C = "tnn-node-a", "tnn-node-b", "tnn-node-c"
POOL = "tnn-pool"
NS = "tnn-other"
TAINT = {"key": "gpufleet.io/tenant", "value": "owner", "effect": "NoSchedule"}
FOREIGN_TAINT = {"key": "example.com/keep", "value": "x", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def api(local_cluster: Any) -> Any:
    api = Api(local_cluster)
    install(api)
    with labelled_kwok_nodes(api, POOL, {"own": [A, B, C]}, pool="tnn"):
        yield api


def test_a_tenants_nodes_are_marked_and_released(api: Api, local_cluster: Any) -> None:
    asyncio.run(_scenario(api, str(local_cluster.kubeconfig)))


def _tenant(selector: dict[str, str]) -> Any:
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": "owner"},
        "spec": {"namespaces": ["tnn-owner"], "nodes": {"selector": selector}},
    }


def _marks(node: Any) -> tuple[str | None, str | None, list[Any]]:
    meta = node["metadata"]
    return (
        (meta.get("labels") or {}).get("gpufleet.io/tenant"),
        (meta.get("annotations") or {}).get(tenant_nodes.ANNOTATION_SET),
        # The node lifecycle controller's own taints (not-ready, unreachable) come and go on
        # the shared cluster's nodes: not the tenant controller's, and not what is checked.
        [
            t
            for t in node["spec"].get("taints") or []
            if not t.get("key", "").startswith("node.kubernetes.io/")
        ],
    )


async def _scenario(api: Api, kubeconfig: str) -> None:
    kube = await KubeApi.connect(kubeconfig)
    ctl = TenantController(kube, None, TenantSettings(interval_s=60.0))
    api.patch(f"/api/v1/nodes/{C}", {"metadata": {"labels": {"gpufleet.io/tenant": "hand"}}})
    api.patch(f"/api/v1/nodes/{B}", {"spec": {"taints": [FOREIGN_TAINT]}})
    try:
        for ns in (NS, "tnn-owner"):
            await kube.create(NAMESPACES, {"metadata": {"name": ns}})
        other = {
            "metadata": {"name": "theirs"},
            "spec": {
                "nodeName": A,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "train"}],
            },
        }
        await kube.create(PODS, other, namespace=NS)
        await _until("the other pod running", lambda: _running(kube))

        await kube.create(TENANTS, _tenant({POOL: "own"}))
        await ctl.reconcile()
        for name in (A, B):
            label, recorded, taints = _marks(await kube.get(NODES, name))
            assert (label, recorded) == ("owner", "owner")
            assert TAINT in taints
        assert FOREIGN_TAINT in _marks(await kube.get(NODES, B))[2]
        assert _marks(await kube.get(NODES, C)) == ("hand", None, [])
        owner = await kube.get(TENANTS, "owner")
        assert owner["status"]["nodes"] == [A, B]
        ready = _cond(owner, "Ready")
        assert ready["reason"] == "NotOwned" and C in ready["message"]
        assert await _running(kube)  # NoSchedule: nothing already running is evicted

        # A second pass with nothing changed writes no Node.
        versions = [(await kube.get(NODES, n))["metadata"]["resourceVersion"] for n in (A, B)]
        await ctl.reconcile()
        again = [(await kube.get(NODES, n))["metadata"]["resourceVersion"] for n in (A, B)]
        assert again == versions

        # The selector narrowed to A: B is released, its other taint kept.
        api.patch(f"/api/v1/nodes/{A}", {"metadata": {"labels": {"tnn-only": "yes"}}})
        await kube.patch(TENANTS, "owner", {"spec": {"nodes": {"selector": {"tnn-only": "yes"}}}})
        await ctl.reconcile()
        assert _marks(await kube.get(NODES, B)) == (None, None, [FOREIGN_TAINT])
        assert _marks(await kube.get(NODES, A))[0] == "owner"
        owner = await kube.get(TENANTS, "owner")
        assert owner["status"]["nodes"] == [A]
        assert _cond(owner, "Ready")["status"] == "True"

        # Deleted: A released in the same pass, the hand-set label on C untouched.
        await kube.delete(TENANTS, "owner")
        await ctl.reconcile()
        assert _marks(await kube.get(NODES, A)) == (None, None, [])
        assert _marks(await kube.get(NODES, C)) == ("hand", None, [])
        await ctl.reconcile()
        await _until("the tenant released", lambda: _gone(kube))
        assert await _running(kube)
    finally:
        with contextlib.suppress(ApiError):
            await kube.patch(TENANTS, "owner", {"metadata": {"finalizers": []}})
            await kube.delete(TENANTS, "owner")
        for ns in (NS, "tnn-owner"):
            with contextlib.suppress(ApiError):
                await kube.delete(NAMESPACES, ns)


def _cond(t: Any, type_: str) -> Any:
    return next(c for c in t["status"]["conditions"] if c["type"] == type_)


async def _running(kube: KubeApi) -> bool:
    p = await kube.get(PODS, "theirs", namespace=NS)
    return p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")


async def _gone(kube: KubeApi) -> bool:
    try:
        await kube.get(TENANTS, "owner")
    except NotFound:
        return True
    return False


async def _until(what: str, check: Any, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.2)):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
