"""Expected hardware against observed hardware: what a joining node must match.

A Machine's inventory says what should be in the box (GPU model and count,
InfiniBand HCA count); the node agent says what it finds, in the
``gpufleet.io/hardware`` annotation on its Node (:mod:`gpufleet.domain.node_reports`).
:func:`differences` compares them and says each difference in words, which become
the reason of the node's ``triage`` state. The text format is encoded and decoded
here so the agent (writer) and the lifecycle controller (reader) cannot disagree;
decoding never raises (malformed means "not observed yet").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import well_known


@dataclass(frozen=True, slots=True)
class Hardware:
    """What is (or should be) in one server."""

    gpu_model: str
    gpu_count: int
    hca_count: int


def normalize_model(name: str) -> str:
    """One spelling per GPU model: NVML's ``NVIDIA H100 80GB HBM3`` equals GPU feature
    discovery's ``NVIDIA-H100-80GB-HBM3``."""
    return re.sub(r"[-\s_]+", "-", name.strip()).strip("-").upper()


def differences(expected: Hardware, observed: Hardware) -> tuple[str, ...]:
    """Each way ``observed`` differs from ``expected``, as a sentence; empty if none."""
    out: list[str] = []
    if normalize_model(expected.gpu_model) != normalize_model(observed.gpu_model):
        out.append(f"GPU model: expected {expected.gpu_model}, observed {observed.gpu_model}")
    if expected.gpu_count != observed.gpu_count:
        out.append(f"GPU count: expected {expected.gpu_count}, observed {observed.gpu_count}")
    if expected.hca_count != observed.hca_count:
        out.append(
            f"InfiniBand HCA count: expected {expected.hca_count}, observed {observed.hca_count}"
        )
    return tuple(out)


def describe(diffs: Sequence[str]) -> str:
    """The differences in one line (the triage reason)."""
    return "inventory mismatch: " + "; ".join(diffs) if diffs else "matches the inventory"


_FIELD = re.compile(r"(gpu-model|gpu-count|hca-count)=(\S+)")


def encode(hw: Hardware) -> str:
    """The condition message: ``gpu-model=NVIDIA-H100-80GB-HBM3 gpu-count=8 hca-count=8``."""
    model = normalize_model(hw.gpu_model) or "none"
    return f"gpu-model={model} gpu-count={hw.gpu_count} hca-count={hw.hca_count}"


def decode(message: str) -> Hardware | None:
    """The hardware in a condition message, or None if it is not one."""
    fields = dict(_FIELD.findall(message))
    try:
        return Hardware(
            gpu_model="" if fields["gpu-model"] == "none" else fields["gpu-model"],
            gpu_count=int(fields["gpu-count"]),
            hca_count=int(fields["hca-count"]),
        )
    except (KeyError, ValueError):
        return None


def observed_on(conditions: Sequence[Mapping[str, Any]]) -> Hardware | None:
    """The hardware an older agent reported in the former ``GpufleetHardware`` condition
    (read as a fallback by :func:`gpufleet.domain.node_reports.hardware_of`)."""
    for cond in conditions:
        if cond.get("type") == well_known.CONDITION_HARDWARE:
            return decode(str(cond.get("message", "")))
    return None
