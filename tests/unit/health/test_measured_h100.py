"""The real backend's parsers against values read off a real H100 (80GB HBM3, driver
580.159.04) by ``bench/gpu_node_validation.sh`` (docs/agent.md, "Measured on an H100"):
NVML's raw values, ``nvidia-smi -q`` and the driver's boot lines in the kernel log.

That GPU was passed through alone to a VM: no NVLink, no NVSwitch fabric, no other GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet.domain.faults import FaultKind
from gpufleet.health import fabric, kmsg, nvml_values
from gpufleet.health.skus import bundled

MEASURED = Path(__file__).parents[2] / "fixtures" / "health" / "measured-h100"
H100 = bundled().get("h100-sxm")
ONE_PCIE_H100 = H100.model_copy(update={"gpus_per_node": 1, "nvlinks_per_gpu": 0})


def raw_gpus() -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = json.loads((MEASURED / "nvml.json").read_text())["gpus"]
    return gpus


def test_every_value_parses_and_what_h100_lacks_is_not_unreadable() -> None:
    (raw,) = raw_gpus()
    g = nvml_values.parse_gpu(raw)
    assert g is not None
    assert g.name == "NVIDIA H100 80GB HBM3" and g.pci_bus_id == "00000000:00:06.0"
    # An H100 retires no pages (it remaps rows): NVML says NOT_SUPPORTED, which is not
    # a GPU we cannot read.
    assert raw["retired_pages_pending"] == "NVML_ERROR_NOT_SUPPORTED"
    assert g.unreadable == () and not g.lost
    assert g.remap_pending is False and g.remap_failure is False
    assert g.nums["temperature_c"] == raw["temperature_c"]
    assert g.nums["power_mw"] == raw["power_mw"]


def test_an_idle_healthy_h100_has_no_fault_under_a_profile_that_fits_it() -> None:
    g = nvml_values.parse_gpu(raw_gpus()[0])
    assert g is not None
    # clocks_event_reasons 1 is "GPU idle": not a throttle.
    assert g.ints["clocks_event_reasons"] == 1
    assert nvml_values.gpu_faults(g, ONE_PCIE_H100, node="n", now=0) == []


def test_under_the_hgx_profile_the_missing_nvlinks_are_a_fault_that_says_why() -> None:
    g = nvml_values.parse_gpu(raw_gpus()[0])
    assert g is not None and g.nvlink_state == ()
    (fault,) = nvml_values.gpu_faults(g, H100, node="n", now=0)
    assert fault.kind is FaultKind.NVLINK_DOWN
    assert "0 of 18 NVLink links active (NVML reports no NVLink on this GPU)" in (
        fault.evidence.message
    )


def test_nvml_fabric_not_supported_is_not_judged_and_clears_the_clique_labels() -> None:
    gpus = [g for g in (fabric.from_raw(r) for r in raw_gpus()) if g is not None]
    assert fabric.unreadable(gpus) is None
    assert fabric.faults(gpus, node="n", now=1.0) == []
    labels = fabric.topology_labels(gpus)
    assert labels is not None and set(labels.values()) == {None}  # None: remove the label


def test_nvidia_smi_q_fabric_block_of_na_reads_as_not_supported() -> None:
    raw = fabric.parse_smi_fabric((MEASURED / "nvidia-smi-q.txt").read_text())
    assert [r["pci_bus_id"] for r in raw] == ["00000000:00:06.0"]
    gpus = [g for g in (fabric.from_raw(r) for r in raw) if g is not None]
    assert len(gpus) == 1 and fabric.unreadable(gpus) is None
    assert fabric.faults(gpus, node="n", now=1.0) == []


def test_the_drivers_boot_lines_are_no_fault_and_nothing_is_left_unparsed() -> None:
    lines = (MEASURED / "dmesg-nvidia.txt").read_text().splitlines()
    assert any("NVRM: loading NVIDIA UNIX Open Kernel Module" in line for line in lines)
    scan = kmsg.scan(lines, node="n", now=1.0)
    assert scan.records == len(lines)
    assert scan.faults == () and scan.unparsed == 0
