"""Parsing and patches: REST JSON, Node JSON, hostlists, the CRD and the renderer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.api import slurmcluster as crd
from gpufleet.domain import hostlist, well_known
from gpufleet.domain.states import NodeState
from gpufleet.slurm import nodes, render, restapi

SAMPLES = Path(__file__).parents[2] / "fixtures" / "slurm"
"""slurmrestd 22.05.8 (v0.0.38) answers, recorded from the real daemon."""


@given(st.sets(st.integers(0, 300), min_size=1, max_size=40), st.sampled_from([1, 3, 4]))
def test_hostlist_round_trip(nums: set[int], width: int) -> None:
    names = sorted(f"gpu-node-{n:0{width}d}" for n in nums)
    assert sorted(hostlist.expand(hostlist.compress(names))) == sorted(set(names))


def test_hostlist_expands_slurm_expressions() -> None:
    assert hostlist.expand("gpu-node-[0-1]") == ["gpu-node-0", "gpu-node-1"]
    assert hostlist.expand("a[08-10],b") == ["a08", "a09", "a10", "b"]
    assert hostlist.expand("") == []


def test_rest_samples_parse_into_views() -> None:
    data = json.loads((SAMPLES / "rest_v0.0.38_node.json").read_text())
    views = [restapi.node_view(n) for n in data["nodes"]]
    assert all(v.known for v in views)
    job = json.loads((SAMPLES / "rest_v0.0.38_job.json").read_text())["jobs"][0]
    view = restapi.job_view(job)
    assert view.nodes == {"gpu-node-0", "gpu-node-1"} and view.requeueable


def test_node_view_drain_flags_and_reason() -> None:
    v = restapi.node_view({"state": "IDLE", "state_flags": ["drain"], "reason": "gpufleet: x"})
    assert v.state == "idle" and v.drained and v.ours


def node_json(**kw: object) -> dict:
    base: dict = {
        "metadata": {"name": "n1", "labels": {}, "annotations": {}},
        "spec": {},
        "status": {"conditions": []},
    }
    for k, v in kw.items():
        if k == "labels":
            base["metadata"]["labels"] = v
        elif k == "annotations":
            base["metadata"]["annotations"] = v
        elif k == "conditions":
            base["status"]["conditions"] = v
        else:
            base["spec"][k] = v
    return base


def test_kube_view_reads_state_cordon_problems_and_lend() -> None:
    node = node_json(
        labels={well_known.LABEL_STATE: "draining"},
        annotations={
            well_known.ANNOTATION_CORDONED: "gpufleet-controller",
            well_known.ANNOTATION_LENT_TO: "ns/p",
        },
        conditions=[
            {"type": "GpuProblem", "status": "True", "reason": "Xid79"},
            {"type": "NvlinkProblem", "status": "False", "reason": "ok"},
            {"type": "Ready", "status": "True"},
        ],
        unschedulable=True,
    )
    v = nodes.kube_view(node)
    assert v is not None
    assert v.state is NodeState.DRAINING and v.cordoned and v.cordoned_by_us and v.lent
    assert v.problems == (("GpuProblem", "Xid79"),)
    assert nodes.kube_view(node_json(labels={well_known.LABEL_STATE: "bogus"})).state is None
    assert nodes.kube_view(None) is None


def test_taint_patch_keeps_other_taints_and_is_idempotent() -> None:
    other = {"key": "x", "effect": "NoSchedule"}
    node = node_json(taints=[other])
    patch = nodes.taint_patch(node, nodes.HELD)
    assert patch == {
        "spec": {
            "taints": [
                other,
                {"key": well_known.TAINT_SLURM, "value": "held", "effect": "NoSchedule"},
            ]
        }
    }
    assert nodes.taint_patch(node_json(taints=patch["spec"]["taints"]), nodes.HELD) is None
    assert nodes.taint_patch(node_json(taints=patch["spec"]["taints"]), None) == {
        "spec": {"taints": [other]}
    }


def test_pod_selection_helpers() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "nodeSelector": {"pool": "a"},
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
    assert nodes.pod_gpus(pod) == 4 and nodes.pod_unschedulable(pod)
    fit = {
        "metadata": {"labels": {"pool": "a"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    assert nodes.pod_fits(pod, fit)
    assert not nodes.pod_fits(pod, {**fit, "metadata": {"labels": {"pool": "b"}}})


SPEC = crd.SlurmClusterSpec.model_validate(
    {
        "nodePools": [
            {"name": "h100", "nodeSelector": {"gpu": "true"}, "gpuType": "h100", "features": ["ib"]}
        ],
        "partitions": [{"name": "batch", "pools": ["h100"], "default": True}],
    }
)


def test_render_is_stable_and_uses_labels_for_features_and_topology() -> None:
    infos = [
        render.NodeInfo(
            f"n{i}",
            {
                "gpu": "true",
                "nvidia.com/gpu.product": "H100 SXM",
                "network.topology.kubernetes.io/block": f"leaf{i // 2}",
                "network.topology.kubernetes.io/spine": "s0",
            },
            f"10.0.0.{i}",
        )
        for i in range(4)
    ] + [render.NodeInfo("cpu0", {"gpu": "false"})]
    data = render.render_all(SPEC, infos)
    assert "NodeName=n0 NodeAddr=10.0.0.0 CPUs=64" in data["slurm.conf"]
    assert "Gres=gpu:h100:8 Feature=H100_SXM,ib" in data["slurm.conf"]
    assert "cpu0" not in data["slurm.conf"]
    assert "PartitionName=batch Nodes=n[0-3] Default=YES" in data["slurm.conf"]
    assert "NodeName=n[0-3] Name=gpu Type=h100 File=/dev/nvidia[0-7]" in data["gres.conf"]
    assert "SwitchName=leaf0 Nodes=n[0-1]" in data["topology.conf"]
    assert "SwitchName=s0 Switches=leaf0,leaf1" in data["topology.conf"]
    assert render.config_hash(data) == render.config_hash(render.render_all(SPEC, infos[::-1]))


def test_crd_schema_is_structural() -> None:
    text = json.dumps(crd.crd_manifest())
    assert "$ref" not in text and "anyOf" not in text and '"title"' not in text
    with pytest.raises(ValueError):
        crd.SlurmClusterSpec.model_validate({"nodePools": [], "partitions": []})


def test_kube_view_reads_the_spare_label() -> None:
    labels = {well_known.LABEL_STATE: "production", well_known.LABEL_SPARE: "true"}
    assert nodes.kube_view(node_json(labels=labels)).spare  # type: ignore[union-attr]
    labels[well_known.LABEL_SPARE] = "false"
    assert not nodes.kube_view(node_json(labels=labels)).spare  # type: ignore[union-attr]
