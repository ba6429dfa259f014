"""Kubernetes DRA: a node's GPUs as devices, and the device taint of a quarantined GPU.

Where no vendor DRA driver publishes a node's GPUs, the agent publishes them itself,
under gpufleet's driver name, as one ResourceSlice per node whose pool is the node's
name and whose devices are named ``gpu-<index>`` (decision 0238). A GPU the controller
quarantined (``NodeRecord.quarantined_gpus``) is then tainted by one DeviceTaintRule,
effect NoExecute, that selects exactly that device by driver, pool and name: the
device taint eviction controller of kube-controller-manager evicts the pods whose
claims hold it, and the scheduler allocates it to no new claim; the node's other GPUs
keep their pods (decision 0239).

Everything here is pure: what a node's devices are, what the rules should be for a set
of records, and what to create and delete to get from the rules there are to those.
The Kubernetes shapes are written and read by :mod:`gpufleet.api.dra` alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.domain.records import NodeRecord

DRIVER = "gpu.gpufleet.io"
"""The DRA driver name of the devices the agent publishes (a DNS subdomain gpufleet owns;
a vendor driver's devices, ``gpu.nvidia.com``, are never selected by gpufleet's rules)."""
DEVICE_CLASS = "gpu.gpufleet.io"
"""The DeviceClass (the chart's) whose claims get a GPU the agent published."""
TAINT_KEY = "gpu.gpufleet.io/quarantined"
"""The device taint gpufleet's rules carry; a pod tolerating it keeps the GPU."""
LABEL_NODE = "gpufleet.io/node"
"""Label on the agent's ResourceSlice and on each rule: the node it is about."""
LABEL_GPU = "gpufleet.io/gpu-index"
"""Label on each rule: the index of the GPU it taints."""
MANAGED_BY = "gpufleet"
"""The value of ``app.kubernetes.io/managed-by`` on every slice and rule gpufleet writes;
the controller lists, changes and deletes only rules that carry it."""
RULE_PREFIX = "gpufleet-"
_NAME_MAX = 253
_VALUE_MAX = 63


def device_name(index: int) -> str:
    """A GPU's device name in the slice and in every claim allocated it (a DNS label)."""
    return f"gpu-{index}"


def slice_name(node: str) -> str:
    """The name of the one ResourceSlice the agent of ``node`` publishes."""
    return _bounded(f"{node}-{DRIVER}")


def rule_name(node: str, index: int) -> str:
    """The name of the DeviceTaintRule of GPU ``index`` of ``node``: one per GPU, so a
    second write of the same quarantine finds the first rule instead of adding one."""
    return _bounded(f"{RULE_PREFIX}{node}-{device_name(index)}")


def _bounded(name: str) -> str:
    """``name`` if it is a valid object name's length, else its head and a hash (a node
    name near 253 characters still gets a distinct, stable name)."""
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: _NAME_MAX - 13].rstrip('.-')}-{digest}"


def label_value(text: str) -> str:
    """``text`` made a label value (a taint's value must be one): at most 63 characters
    of ``[A-Za-z0-9._-]``, starting and ending alphanumeric; "" when nothing is left."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:_VALUE_MAX]
    return cleaned.strip("._-")


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as the agent publishes it."""

    index: int
    uuid: str
    """NVML's UUID; "" when it could not be read."""
    product: str
    """NVML's product name (``NVIDIA H100 80GB HBM3``); "" when unknown."""
    memory_bytes: int | None = None
    """The GPU's memory; None when NVML did not say."""

    @property
    def name(self) -> str:
        return device_name(self.index)


@dataclass(frozen=True, slots=True)
class TaintRule:
    """One GPU's DeviceTaintRule as gpufleet wants it (or read it back)."""

    node: str
    index: int
    uuid: str
    fault: str
    driver: str = DRIVER

    @property
    def name(self) -> str:
        return rule_name(self.node, self.index)

    @property
    def pool(self) -> str:
        """The agent publishes a node's GPUs in a pool named after the node."""
        return self.node

    @property
    def device(self) -> str:
        return device_name(self.index)

    def selects_same(self, other: TaintRule) -> bool:
        """Whether both select the same device with the same taint (what the apiserver
        and the eviction act on; the uuid and fault only describe it)."""
        return (self.driver, self.pool, self.device, self.taint_value) == (
            other.driver,
            other.pool,
            other.device,
            other.taint_value,
        )

    @property
    def taint_value(self) -> str:
        return label_value(self.fault)

    def describe(self) -> str:
        """The GPU as Events and logs name it: ``GPU 3 (GPU-5a1c...)``."""
        return f"GPU {self.index}" + (f" ({self.uuid})" if self.uuid else "")


def wanted(records: Iterable[NodeRecord]) -> dict[str, TaintRule]:
    """The rules the records call for, by name: one per quarantined GPU."""
    out: dict[str, TaintRule] = {}
    for record in records:
        for gpu in record.quarantined_gpus:
            rule = TaintRule(record.name, gpu.index, gpu.uuid, gpu.fault)
            out[rule.name] = rule
    return out


@dataclass(frozen=True, slots=True)
class RulePlan:
    """What to do to the rules gpufleet made so that they are exactly those wanted."""

    create: tuple[TaintRule, ...] = ()
    replace: tuple[TaintRule, ...] = ()
    """Rules whose object exists under the wanted name but selects or taints otherwise."""
    delete: tuple[str, ...] = ()
    """Names of gpufleet's rules no record calls for any more (the quarantine was
    released, the node is gone, or an object of gpufleet's under a name no rule has)."""

    def __bool__(self) -> bool:
        return bool(self.create or self.replace or self.delete)


def plan(want: Mapping[str, TaintRule], have: Mapping[str, TaintRule]) -> RulePlan:
    """From the rules gpufleet made (``have``, by name: only objects labelled as
    gpufleet's are ever read into it) to those ``want``-ed. A rule of someone else is
    never in ``have`` and so never touched."""
    create = tuple(rule for name, rule in sorted(want.items()) if name not in have)
    replace = tuple(
        rule
        for name, rule in sorted(want.items())
        if name in have and not rule.selects_same(have[name])
    )
    delete = tuple(name for name in sorted(have) if name not in want)
    return RulePlan(create, replace, delete)
