"""A partition names only defined pools, and never renders ``Nodes=""``.

Three layers: the spec model (the CRD's pattern and CEL rule say the same to the
apiserver), the renderer (also when the model was bypassed), and the operator, which
reports a partition left without nodes on the SlurmCluster and keeps the last config.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from gpufleet.api import slurmcluster as crd
from gpufleet.kubeapi import NODES, Json, KubePort, NotFound, ObjectList, Patch, Resource
from gpufleet.slurm import render
from gpufleet.slurm.operator import CONFIGMAPS, SLURM_CLUSTERS, ClusterOperator, OperatorSettings

from ..fakes import UnmodelledKube

BASE: dict[str, Any] = {
    "nodePools": [
        {"name": "h100", "nodeSelector": {"gpu": "h100"}},
        {"name": "a100", "nodeSelector": {"gpu": "a100"}},
    ],
    "partitions": [
        {"name": "batch", "pools": ["h100"], "default": True},
        {"name": "old", "pools": ["a100"]},
    ],
}
H100 = [render.NodeInfo(f"h{i}", {"gpu": "h100"}) for i in range(2)]
A100 = [render.NodeInfo("a0", {"gpu": "a100"})]


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    spec.update(changes)
    return spec


@pytest.mark.parametrize("name", ["h100\nPrologSlurmctld=/tmp/x", "h100\n", "H100", "h 100", ""])
def test_the_model_refuses_a_badly_formed_pool_name_in_a_partition(name: str) -> None:
    spec = _spec(partitions=[{"name": "batch", "pools": [name]}])
    with pytest.raises(ValidationError) as caught:
        crd.SlurmClusterSpec.model_validate(spec)
    assert ("partitions", 0, "pools", 0) in [e["loc"] for e in caught.value.errors()]


def test_the_model_refuses_a_pool_no_node_pool_defines() -> None:
    spec = _spec(partitions=[{"name": "batch", "pools": ["h100", "b200"]}])
    with pytest.raises(ValidationError) as caught:
        crd.SlurmClusterSpec.model_validate(spec)
    assert "partitions[0].pools[1]: 'b200' is not a node pool" in str(caught.value)
    dup = _spec(nodePools=[{"name": "h100"}, {"name": "h100"}])
    with pytest.raises(ValidationError, match="defined twice"):
        crd.SlurmClusterSpec.model_validate(dup)


def test_the_crd_carries_the_pattern_and_the_existence_rule() -> None:
    schema = crd.spec_schema()
    pools = schema["properties"]["partitions"]["items"]["properties"]["pools"]
    assert pools["items"]["pattern"] == crd.POOL and pools["maxItems"] == crd.MAX_POOLS
    assert schema["properties"]["nodePools"]["items"]["properties"]["name"]["pattern"] == crd.POOL
    assert schema["x-kubernetes-validations"] == [crd.POOLS_DEFINED_RULE]
    # The apiserver's CEL estimates its cost from these bounds; unbounded lists are refused.
    assert schema["properties"]["nodePools"]["maxItems"] == crd.MAX_POOLS
    assert schema["properties"]["partitions"]["maxItems"] == crd.MAX_POOLS


def test_a_partition_whose_pools_select_no_node_is_not_rendered() -> None:
    spec = crd.SlurmClusterSpec.model_validate(BASE)
    data = render.render_all(spec, [*H100, *A100])
    assert "PartitionName=old Nodes=a0 " in data["slurm.conf"]
    with pytest.raises(render.EmptyPartition) as caught:
        render.render_all(spec, H100)  # the a100 machines are gone
    assert caught.value.reason == "PartitionWithoutNodes"
    assert "partition 'old' would have no nodes" in str(caught.value)
    assert "pool(s) a100" in str(caught.value)


def test_the_renderer_refuses_undefined_and_unsafe_pool_names_without_the_model() -> None:
    good = crd.SlurmClusterSpec.model_validate(BASE)
    for name, error in (("b200", render.UnknownPool), ("h100\nx=y", render.UnsafeValue)):
        part = good.partitions[0].model_construct(name="batch", pools=[name])
        spec = good.model_construct(**{**dict(good), "partitions": [part]})
        with pytest.raises(error) as caught:
            render.render_all(spec, [*H100, *A100])
        assert caught.value.field == "spec.partitions['batch'].pools[0]"
        assert isinstance(caught.value, render.NotRendered)


class ClusterKube(UnmodelledKube):
    """One SlurmCluster, some Nodes, the applied ConfigMaps; enough for one reconcile."""

    def __init__(self, spec: dict[str, Any], nodes: list[render.NodeInfo]) -> None:
        self.cluster: Json = {
            "metadata": {"name": "research", "namespace": "slurm", "uid": "u", "generation": 1},
            "spec": spec,
        }
        self.nodes = {
            n.name: {"metadata": {"name": n.name, "labels": dict(n.labels)}} for n in nodes
        }
        self.applied: list[Json] = []

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        if resource == SLURM_CLUSTERS and name == "research":
            return copy.deepcopy(self.cluster)
        raise NotFound(f"get {resource} {name}", 404, "not found")

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        assert resource == NODES
        return ObjectList(items=copy.deepcopy(list(self.nodes.values())))

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json:
        if resource == SLURM_CLUSTERS and status:
            self.cluster["status"] = copy.deepcopy(dict(patch["status"]))
            return self.cluster
        if resource == NODES:
            labels = self.nodes[name]["metadata"]["labels"]
            for k, v in patch["metadata"]["labels"].items():
                if v is None:
                    labels.pop(k, None)
                else:
                    labels[k] = v
            return self.nodes[name]
        raise NotImplementedError(f"patch {resource}")

    async def apply(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str = "gpufleet",
    ) -> Json:
        assert resource == CONFIGMAPS
        self.applied.append(copy.deepcopy(dict(body)))
        return dict(body)


_: type[KubePort] = ClusterKube


def test_the_operator_reports_the_empty_partition_and_keeps_the_last_config() -> None:
    kube = ClusterKube(BASE, [*H100, *A100])
    op = ClusterOperator(
        kube=kube, scontrol=None, rest=None, settings=OperatorSettings(reconfigure=False)
    )
    first = asyncio.run(op.reconcile("slurm", "research"))
    assert first is not None and first["conditions"][0]["status"] == "True"
    good = kube.applied[-1]["data"]["slurm.conf"]
    assert "PartitionName=old Nodes=a0 " in good

    del kube.nodes["a0"]  # the a100 pool's only machine leaves
    second = asyncio.run(op.reconcile("slurm", "research"))
    assert second is not None
    ready = second["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "PartitionWithoutNodes")
    assert "partition 'old' would have no nodes" in ready["message"]
    assert f"keeps its last config ({first['configHash']})" in ready["message"]
    assert len(kube.applied) == 1  # nothing applied: slurmctld keeps the config with a0
    assert 'Nodes=""' not in good


def test_the_first_config_is_applied_with_the_partition_empty_and_says_so() -> None:
    """Before any a100 machine joined there is no last config to keep: slurmctld gets one
    with that partition empty (it could not start without a config), Ready says why; the
    first a100 Node fills it, and from then on an empty partition keeps the last config."""
    kube = ClusterKube(BASE, H100)
    op = ClusterOperator(
        kube=kube, scontrol=None, rest=None, settings=OperatorSettings(reconfigure=False)
    )
    status = asyncio.run(op.reconcile("slurm", "research"))
    assert status is not None and len(kube.applied) == 1
    assert 'PartitionName=old Nodes="" ' in kube.applied[0]["data"]["slurm.conf"]
    ready = status["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "PartitionWithoutNodes")
    assert "rendered with it empty (no config was applied before)" in ready["message"]
    kube.nodes["a0"] = {"metadata": {"name": "a0", "labels": {"gpu": "a100"}}}
    status = asyncio.run(op.reconcile("slurm", "research"))
    assert status is not None and status["conditions"][0]["status"] == "True"
    assert "PartitionName=old Nodes=a0 " in kube.applied[-1]["data"]["slurm.conf"]


def test_an_undefined_pool_is_never_rendered_even_first() -> None:
    spec = _spec(partitions=[{"name": "batch", "pools": ["b200"]}])
    kube = ClusterKube(spec, H100)
    op = ClusterOperator(
        kube=kube, scontrol=None, rest=None, settings=OperatorSettings(reconfigure=False)
    )
    status = asyncio.run(op.reconcile("slurm", "research"))
    assert status is not None and kube.applied == []
    assert status["conditions"][0]["reason"] == "InvalidSpec"  # the model refuses it first
