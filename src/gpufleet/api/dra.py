"""The DRA objects gpufleet writes, written and read by one codec.

- ``ResourceSlice`` (``resource.k8s.io/v1``): the agent's GPUs of one node, where no
  vendor driver publishes them (decision 0238);
- ``DeviceTaintRule`` (``resource.k8s.io/v1beta2`` on Kubernetes 1.36, behind the
  ``DRADeviceTaintRules`` gate; decision 0237): one per quarantined GPU (decision 0239);
- ``DeviceClass`` (``resource.k8s.io/v1``): the class claims name to get one of them.

What they mean is :mod:`gpufleet.domain.dra`'s; this module only turns it into the
apiserver's shapes and back. A rule is read back only when it carries gpufleet's
``app.kubernetes.io/managed-by`` label and the shape gpufleet writes: anything else is
someone else's and reads as None (never changed, never deleted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.domain import dra, well_known

SLICE_API = "resource.k8s.io/v1"
RULE_API = "resource.k8s.io/v1beta2"
CLASS_API = "resource.k8s.io/v1"

Json = dict[str, Any]

_RULE_MANAGED = f"{well_known.LABEL_MANAGED_BY}={dra.MANAGED_BY}"
RULE_SELECTOR = _RULE_MANAGED
"""The label selector that lists gpufleet's rules (and slices) and nothing else."""
ANNOTATION_UUID = "gpufleet.io/gpu-uuid"
ANNOTATION_FAULT = "gpufleet.io/fault"


def _owner(node: str, uid: str | None) -> list[Json]:
    """An owner reference to the Node (cluster-scoped like the object): the garbage
    collector deletes the object with the Node. None without the Node's uid."""
    if not uid:
        return []
    return [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]


# ------------------------------------------------------------------ ResourceSlice


def resource_slice(
    node: str, devices: Sequence[dra.GpuDevice], *, generation: int, node_uid: str | None = None
) -> Json:
    """The ResourceSlice of ``node``'s GPUs: pool ``node`` (one slice), one device per GPU
    with its index, UUID and product as attributes and its memory as capacity."""
    meta: Json = {
        "name": dra.slice_name(node),
        "labels": {well_known.LABEL_MANAGED_BY: dra.MANAGED_BY, dra.LABEL_NODE: node},
    }
    if owners := _owner(node, node_uid):
        meta["ownerReferences"] = owners
    return {
        "apiVersion": SLICE_API,
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [_device(d) for d in sorted(devices, key=lambda d: d.index)],
        },
    }


def _device(gpu: dra.GpuDevice) -> Json:
    attributes: Json = {"index": {"int": gpu.index}}
    if gpu.uuid:
        attributes["uuid"] = {"string": gpu.uuid}
    if gpu.product:
        attributes["productName"] = {"string": gpu.product}
    out: Json = {"name": gpu.name, "attributes": attributes}
    if gpu.memory_bytes is not None:
        out["capacity"] = {"memory": {"value": str(gpu.memory_bytes)}}
    return out


def slice_devices(body: Mapping[str, Any]) -> tuple[dra.GpuDevice, ...] | None:
    """The GPUs a slice gpufleet wrote publishes; None when it is not such a slice
    (another driver's, or not the shape :func:`resource_slice` writes)."""
    spec = body.get("spec")
    if not isinstance(spec, Mapping) or spec.get("driver") != dra.DRIVER:
        return None
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return None
    out: list[dra.GpuDevice] = []
    for raw in devices:
        gpu = _read_device(raw)
        if gpu is None:
            return None
        out.append(gpu)
    return tuple(out)


def _read_device(raw: Any) -> dra.GpuDevice | None:
    if not isinstance(raw, Mapping):
        return None
    attrs = raw.get("attributes") or {}
    index = (attrs.get("index") or {}).get("int") if isinstance(attrs, Mapping) else None
    if not isinstance(index, int) or raw.get("name") != dra.device_name(index):
        return None
    memory = ((raw.get("capacity") or {}).get("memory") or {}).get("value")
    return dra.GpuDevice(
        index=index,
        uuid=str((attrs.get("uuid") or {}).get("string", "")),
        product=str((attrs.get("productName") or {}).get("string", "")),
        memory_bytes=int(memory) if isinstance(memory, str) and memory.isdigit() else None,
    )


def slice_generation(body: Mapping[str, Any]) -> int:
    """The pool generation a slice carries (0 when it says none)."""
    pool = (body.get("spec") or {}).get("pool") or {}
    generation = pool.get("generation") if isinstance(pool, Mapping) else None
    return generation if isinstance(generation, int) else 0


# ---------------------------------------------------------------- DeviceTaintRule


def taint_rule(rule: dra.TaintRule, *, node_uid: str | None = None) -> Json:
    """The DeviceTaintRule for one quarantined GPU: NoExecute on exactly that device
    (driver, pool and device name), labelled and annotated as gpufleet's."""
    meta: Json = {
        "name": rule.name,
        "labels": {
            well_known.LABEL_MANAGED_BY: dra.MANAGED_BY,
            dra.LABEL_NODE: rule.node,
            dra.LABEL_GPU: str(rule.index),
        },
        "annotations": {ANNOTATION_UUID: rule.uuid, ANNOTATION_FAULT: rule.fault},
    }
    if owners := _owner(rule.node, node_uid):
        meta["ownerReferences"] = owners
    taint: Json = {"key": dra.TAINT_KEY, "effect": "NoExecute"}
    if rule.taint_value:
        taint["value"] = rule.taint_value
    return {
        "apiVersion": RULE_API,
        "kind": "DeviceTaintRule",
        "metadata": meta,
        "spec": {
            "deviceSelector": {"driver": rule.driver, "pool": rule.pool, "device": rule.device},
            "taint": taint,
        },
    }


def read_rule(body: Mapping[str, Any]) -> dra.TaintRule | None:
    """The rule as gpufleet wrote it; None for a rule that is not gpufleet's (no
    managed-by label) or that no longer has the shape gpufleet writes. A rule of
    gpufleet's that someone changed still reads (with what it now selects), so that the
    controller replaces it rather than leaving it."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(well_known.LABEL_MANAGED_BY) != dra.MANAGED_BY:
        return None
    node = labels.get(dra.LABEL_NODE)
    index_text = labels.get(dra.LABEL_GPU, "")
    if not isinstance(node, str) or not str(index_text).isdigit():
        return None
    spec = body.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    annotations = meta.get("annotations") or {}
    read = dra.TaintRule(
        node=node,
        index=int(index_text),
        uuid=str(annotations.get(ANNOTATION_UUID, "")),
        fault=str(taint.get("value", "")),
        driver=str(selector.get("driver", "")),
    )
    wrote_here = (
        selector.get("pool") == read.pool
        and selector.get("device") == read.device
        and taint.get("key") == dra.TAINT_KEY
        and taint.get("effect") == "NoExecute"
        and meta.get("name") == read.name
    )
    return read if wrote_here else _mismatch(read)


def _mismatch(read: dra.TaintRule) -> dra.TaintRule:
    """A rule of gpufleet's whose selector or taint was changed: read with a driver no
    wanted rule has, so that :func:`gpufleet.domain.dra.plan` replaces it."""
    return dra.TaintRule(read.node, read.index, read.uuid, read.fault, driver="")


# ------------------------------------------------------------------- DeviceClass


def device_class() -> Json:
    """The DeviceClass whose claims get a GPU the agent published (the chart renders the
    same object, gated by the same value: deploy/helm/gpufleet/templates/dra.yaml)."""
    return {
        "apiVersion": CLASS_API,
        "kind": "DeviceClass",
        "metadata": {
            "name": dra.DEVICE_CLASS,
            "labels": {well_known.LABEL_MANAGED_BY: dra.MANAGED_BY},
        },
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{dra.DRIVER}"'}}]},
    }
