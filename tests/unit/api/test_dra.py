"""The DRA codec and plan: ResourceSlices of the agent, DeviceTaintRules of the controller."""

from __future__ import annotations

import copy
from dataclasses import replace

from gpufleet.api import dra as codec
from gpufleet.domain import dra
from gpufleet.domain.records import NodeRecord, QuarantinedGpu

GPUS = tuple(
    dra.GpuDevice(i, f"GPU-{i:04d}", "NVIDIA H100 80GB HBM3", 81559 * 2**20) for i in range(8)
)


def test_a_slice_publishes_every_gpu_in_the_nodes_pool_and_reads_back() -> None:
    body = codec.resource_slice("gpu-node-0001", GPUS, generation=3, node_uid="u-1")
    spec = body["spec"]
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["metadata"]["name"] == "gpu-node-0001-gpu.gpufleet.io"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert spec["driver"] == "gpu.gpufleet.io" and spec["nodeName"] == "gpu-node-0001"
    assert spec["pool"] == {"name": "gpu-node-0001", "generation": 3, "resourceSliceCount": 1}
    first = spec["devices"][0]
    assert first["name"] == "gpu-0"
    assert first["attributes"] == {
        "index": {"int": 0},
        "uuid": {"string": "GPU-0000"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
    }
    assert first["capacity"] == {"memory": {"value": str(81559 * 2**20)}}
    assert codec.slice_devices(body) == GPUS
    assert codec.slice_generation(body) == 3


def test_unknown_uuid_product_and_memory_are_left_out_not_invented() -> None:
    bare = (dra.GpuDevice(2, "", ""),)
    body = codec.resource_slice("n", bare, generation=1)
    device = body["spec"]["devices"][0]
    assert device == {"name": "gpu-2", "attributes": {"index": {"int": 2}}}
    assert "ownerReferences" not in body["metadata"]
    assert codec.slice_devices(body) == bare


def test_another_drivers_slice_or_a_device_named_otherwise_is_not_read_as_ours() -> None:
    body = codec.resource_slice("n", GPUS[:1], generation=1)
    vendor = copy.deepcopy(body)
    vendor["spec"]["driver"] = "gpu.nvidia.com"
    assert codec.slice_devices(vendor) is None
    renamed = copy.deepcopy(body)
    renamed["spec"]["devices"][0]["name"] = "gpu-7"
    assert codec.slice_devices(renamed) is None


def test_a_rule_taints_exactly_one_device_noexecute_and_reads_back() -> None:
    rule = dra.TaintRule("gpu-node-0001", 3, "GPU-0003", "xid-94")
    body = codec.taint_rule(rule, node_uid="u-1")
    assert body["apiVersion"] == "resource.k8s.io/v1beta2"
    assert body["metadata"]["name"] == "gpufleet-gpu-node-0001-gpu-3"
    assert body["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gpufleet",
        "gpufleet.io/node": "gpu-node-0001",
        "gpufleet.io/gpu-index": "3",
    }
    assert body["spec"] == {
        "deviceSelector": {"driver": "gpu.gpufleet.io", "pool": "gpu-node-0001", "device": "gpu-3"},
        "taint": {"key": "gpu.gpufleet.io/quarantined", "value": "xid-94", "effect": "NoExecute"},
    }
    read = codec.read_rule(body)
    assert read is not None and read.selects_same(rule) and read.uuid == "GPU-0003"


def test_a_rule_without_gpufleets_label_is_someone_elses_and_never_read() -> None:
    body = codec.taint_rule(dra.TaintRule("n", 0, "", "xid-94"))
    del body["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert codec.read_rule(body) is None
    body["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone"
    assert codec.read_rule(body) is None


def test_a_changed_rule_of_gpufleets_reads_as_one_to_replace() -> None:
    rule = dra.TaintRule("n", 1, "", "xid-94")
    body = codec.taint_rule(rule)
    body["spec"]["taint"]["effect"] = "None"
    changed = codec.read_rule(body)
    assert changed is not None
    todo = dra.plan({rule.name: rule}, {rule.name: changed})
    assert todo.replace == (rule,) and not todo.create and not todo.delete


def test_a_taint_value_is_a_label_value_whatever_the_fault_key() -> None:
    assert dra.label_value("xid 94: contained/ECC") == "xid-94-contained-ECC"
    assert len(dra.label_value("x" * 100)) == 63
    assert dra.label_value("...") == ""
    body = codec.taint_rule(dra.TaintRule("n", 0, "", ""))
    assert "value" not in body["spec"]["taint"]


def test_names_stay_valid_object_names_for_the_longest_node_names() -> None:
    long = "n" * 250
    assert len(dra.rule_name(long, 7)) <= 253
    assert dra.rule_name(long, 7) != dra.rule_name(long, 6)
    assert len(dra.slice_name(long)) <= 253


def _record(name: str, *gpus: int) -> NodeRecord:
    quarantined = tuple(QuarantinedGpu(i, f"GPU-{i}", "xid-94", 1.0) for i in gpus)
    return replace(NodeRecord.new(name, at=0.0), quarantined_gpus=quarantined)


def test_the_plan_creates_one_rule_per_quarantined_gpu_and_deletes_released_ones() -> None:
    want = dra.wanted([_record("a", 1, 5), _record("b"), _record("c", 0)])
    assert sorted(want) == ["gpufleet-a-gpu-1", "gpufleet-a-gpu-5", "gpufleet-c-gpu-0"]
    have = {
        "gpufleet-a-gpu-1": want["gpufleet-a-gpu-1"],
        "gpufleet-b-gpu-2": dra.TaintRule("b", 2, "", "xid-94"),
    }
    todo = dra.plan(want, have)
    assert [r.name for r in todo.create] == ["gpufleet-a-gpu-5", "gpufleet-c-gpu-0"]
    assert todo.delete == ("gpufleet-b-gpu-2",)
    assert not todo.replace
    assert not dra.plan(want, want)
