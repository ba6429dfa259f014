"""Fail closed: a state that cannot be read is never healthy or idle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet.domain.faults import FaultKind, Subsystem
from gpufleet.health import checks, nvml_values
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.hardware import HardwareError
from gpufleet.health.monitors import PassiveMonitors, unreadable_values
from gpufleet.health.results import CheckStatus
from gpufleet.health.skus import bundled

FIXTURES = Path(__file__).parents[2] / "fixtures" / "health"
H100 = bundled().get("h100-sxm")


class _Nvml(SimulatedHardware):
    """The simulated node with NVML value sets chosen by the test."""

    def __init__(self, raw: list[dict[str, Any]], *, busy: bool | Exception = False) -> None:
        super().__init__(gpus=len(raw), hcas=0)
        self._raw = raw
        self._busy_answer = busy

    def gpus(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._raw]

    def busy(self) -> bool:
        if isinstance(self._busy_answer, Exception):
            raise self._busy_answer
        return self._busy_answer


def _healthy(index: int) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((FIXTURES / "nvml-h100-healthy.json").read_text())
    raw["index"] = index
    return raw


def test_not_supported_is_absent_but_other_nvml_errors_make_the_subsystem_unknown() -> None:
    absent = {**_healthy(0), "retired_pages_sbe": "NVML_ERROR_NOT_SUPPORTED"}
    assert nvml_values.parse_gpu(absent).unreadable == ()  # type: ignore[union-attr]
    failed = {**_healthy(1), "ecc_uncorrected_volatile": "NVML_ERROR_UNKNOWN", "pcie_width": "x16"}
    reading = nvml_values.parse_gpu(failed)
    assert reading is not None
    assert set(reading.unreadable) == {"ecc_uncorrected_volatile", "pcie_width"}
    why = unreadable_values([reading])
    assert set(why) == {Subsystem.GPU, Subsystem.PCIE}
    assert "GPU 1 ecc_uncorrected_volatile" in why[Subsystem.GPU]


def test_a_gpu_whose_values_cannot_be_read_is_unknown_not_healthy() -> None:
    raw = [_healthy(i) for i in range(7)] + [{"index": 7, "name": "NVML_ERROR_UNKNOWN"}]
    hw = _Nvml(raw)
    try:
        snap = PassiveMonitors(hw, H100, node="n").poll(1.0)
    finally:
        hw.close()
    gpu = snap.observations[Subsystem.GPU]
    assert not gpu.readable and "GPU 7 handle" in gpu.unreadable_reason
    assert snap.observations[Subsystem.THERMAL].readable


def test_a_lost_gpu_counts_as_missing() -> None:
    raw = [_healthy(i) for i in range(7)] + [{"index": 7, "name": "NVML_ERROR_GPU_IS_LOST"}]
    hw = _Nvml(raw)
    try:
        snap = PassiveMonitors(hw, H100, node="n").poll(1.0)
    finally:
        hw.close()
    (missing,) = [f for f in snap.faults() if f.kind is FaultKind.GPU_MISSING]
    assert missing.evidence.counters["visible"] == 7
    assert "1 lost" in missing.evidence.message


def test_a_fault_is_reported_even_when_another_gpu_is_unreadable() -> None:
    raw = [_healthy(i) for i in range(8)]
    raw[2]["ecc_uncorrected_volatile"] = 3
    raw[5]["ecc_uncorrected_volatile"] = "NVML_ERROR_TIMEOUT"
    hw = _Nvml(raw)
    try:
        snap = PassiveMonitors(hw, H100, node="n").poll(1.0)
    finally:
        hw.close()
    gpu = snap.observations[Subsystem.GPU]
    assert not gpu.readable
    assert [f.evidence.gpu_index for f in gpu.faults] == [2]


def test_active_checks_do_not_start_while_busy_or_while_busy_is_unreadable() -> None:
    for answer, text in (
        (True, "GPU processes are running"),
        (HardwareError("NVML"), "failing closed"),
    ):
        hw = _Nvml([_healthy(0)], busy=answer)
        try:
            results = checks.run_checks(
                hw, H100, ["gpu-count", "gemm", "hbm"], node="n", guard=checks.idle_guard(hw)
            )
        finally:
            hw.close()
        by_name = {r.name: r for r in results}
        for name in ("gemm", "hbm"):
            assert by_name[name].status is CheckStatus.UNKNOWN
            assert text in by_name[name].reason
        assert "gpu-count" in by_name  # passive checks still run


def test_an_unreadable_port_state_or_hca_link_is_unknown_not_healthy() -> None:
    hw = SimulatedHardware(gpus=8, hcas=2)
    try:
        ib = hw.sysfs_root / "sys/class/infiniband"
        (ib / "mlx5_1/ports/1/state").unlink()
        pci = (ib / "mlx5_0/device").resolve()
        (pci / "current_link_width").write_text("garbage\n")
        snap = PassiveMonitors(hw, H100, node="n").poll(1.0)
    finally:
        hw.close()
    port = snap.observations[Subsystem.INFINIBAND]
    assert not port.readable and "mlx5_1/1" in port.unreadable_reason
    pcie = snap.observations[Subsystem.PCIE]
    assert not pcie.readable and "mlx5_0" in pcie.unreadable_reason


def test_a_user_space_xid_in_kmsg_is_counted_and_never_a_fault() -> None:
    from gpufleet.health.metrics import AgentMetrics

    hw = SimulatedHardware(gpus=8, hcas=0)
    metrics = AgentMetrics("n")
    try:
        hw._kernel.append(
            "12,9,100000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus."
        )
        snap = PassiveMonitors(hw, H100, node="n").poll(1.0)
        metrics.observe(snap)
    finally:
        hw.close()
    assert snap.kernel_foreign == 1
    assert not [f for f in snap.faults() if f.kind is FaultKind.XID]
    assert (
        metrics.registry.get_sample_value("gpufleet_kmsg_foreign_records_total", {"node": "n"}) == 1
    )
