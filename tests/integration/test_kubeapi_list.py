"""The Kubernetes adapter lists in pages (``limit`` + ``continue``) and returns one snapshot:
every object, the list's resourceVersion, one request per page. Real apiserver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from controller_harness import Api

from gpufleet.kubeapi import KubeApi, client
from gpufleet.kubeapi.resources import CONFIGMAPS
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

NS = "paged-list"


@pytest.fixture(scope="module")
def env(local_cluster: ClusterInfo) -> Any:
    api = Api(local_cluster)
    api.post(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        ok=(201, 409),
    )
    for i in range(23):
        api.post(
            f"/api/v1/namespaces/{NS}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i:02d}"}},
            ok=(201, 409),
        )
    yield local_cluster
    api.delete(f"/api/v1/namespaces/{NS}")


def test_a_list_reads_every_page_of_one_snapshot(
    env: ClusterInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "LIST_PAGE", 5)

    async def go() -> tuple[list[str], str, int]:
        kube = await KubeApi.connect(str(env.kubeconfig))
        listing = await kube.list(CONFIGMAPS, namespace=NS)
        names = [m["metadata"]["name"] for m in listing.items]
        return names, listing.resource_version, kube.requests[("GET", "configmaps")]

    names, rv, requests = asyncio.run(go())
    ours = sorted(n for n in names if n.startswith("cm-"))
    assert ours == [f"cm-{i:02d}" for i in range(23)]
    assert len(names) == len(set(names))  # no object twice across pages
    assert rv.isdigit()
    assert requests == -(-len(names) // 5)  # ceil: one request per page of 5
