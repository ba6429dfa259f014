"""Active checks on the CPU at small sizes, and their pure judging."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.domain.faults import FaultKind
from gpufleet.health import checks, compute
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.results import CheckStatus
from gpufleet.health.skus import bundled

CPU = bundled().get("cpu")
H100 = bundled().get("h100-sxm")


class CpuHardware(SimulatedHardware):
    """The simulated node, but the active checks really run on the CPU with numpy."""

    def compute_devices(self) -> list[compute.ComputeDevice]:
        return [compute.NumpyDevice(0), compute.NumpyDevice(1)]


def test_gemm_hbm_and_sdc_measure_on_the_cpu() -> None:
    hw = CpuHardware(gpus=1)
    try:
        results = {r.name: r for r in checks.run_checks(hw, CPU, ["gemm", "sdc", "hbm"], node="n")}
    finally:
        hw.close()
    assert results["gemm"].status is CheckStatus.OK
    assert (
        results["gemm"].measured is not None and results["gemm"].measured > CPU.gemm_bf16_tflops_min
    )
    assert results["hbm"].measured is not None and results["hbm"].measured > CPU.hbm_gbps_min
    assert results["sdc"].status is CheckStatus.OK
    assert results["sdc"].measured is not None and results["sdc"].measured < 1e-5
    assert all(r.duration_s > 0 for r in results.values())


def test_a_slow_gpu_fails_gemm_against_the_profile() -> None:
    hw = SimulatedHardware()
    hw.inject("gemm-below-threshold,gpu=5,factor=0.6")
    try:
        (r,) = checks.run_checks(hw, H100, ["gemm"], node="n")
    finally:
        hw.close()
    assert r.status is CheckStatus.CRITICAL
    assert [(f.kind, f.evidence.gpu_index) for f in r.faults] == [
        (FaultKind.GEMM_BELOW_THRESHOLD, 5)
    ]
    assert r.measured == pytest.approx(450.0) and r.threshold == H100.gemm_bf16_tflops_min


def test_a_gpu_below_its_peers_is_flagged_even_above_the_threshold() -> None:
    runs = {
        i: compute.GemmRun(128, 1, 2 * 128**3 / (v * 1e12), np.zeros((8, 128)), "x")
        for i, v in enumerate([750, 760, 745, 752, 610, 749, 751, 748])
    }
    r = checks.judge_gemm(runs, H100, node="n", now=0)
    assert [f.evidence.gpu_index for f in r.faults] == [4]
    assert "of the median" in r.faults[0].evidence.message


def test_silent_data_corruption_is_caught_against_the_reference() -> None:
    hw = SimulatedHardware()
    hw.inject("sdc-mismatch,gpu=2")
    try:
        (r,) = checks.run_checks(hw, H100, ["sdc"], node="n")
    finally:
        hw.close()
    assert r.status is CheckStatus.CRITICAL
    assert [(f.kind, f.evidence.gpu_index) for f in r.faults] == [(FaultKind.SDC_MISMATCH, 2)]


def test_bf16_rounding_of_the_reference_matches_the_device_inputs() -> None:
    x = np.array([1.0, 1.00390625, 1.0078125, 3.14159265], dtype=np.float32)
    assert list(compute.round_bf16(x)) == [1.0, 1.0, 1.0078125, 3.140625]


def test_allreduce_and_dcgm_judging() -> None:
    ok = compute.AllReduceRun(8, 1 << 28, 5, 5 * (1 << 28) / (257e9), "nccl", True)
    assert checks.judge_allreduce(ok, H100, node="n", now=0).status is CheckStatus.OK
    slow = compute.AllReduceRun(8, 1 << 28, 5, 5 * (1 << 28) / (100e9), "nccl", True)
    r = checks.judge_allreduce(slow, H100, node="n", now=0)
    assert r.faults[0].kind is FaultKind.NCCL_BELOW_THRESHOLD
    wrong = compute.AllReduceRun(8, 1 << 28, 5, 1.0, "nccl", False)
    assert (
        checks.judge_allreduce(wrong, H100, node="n", now=0).faults[0].kind
        is FaultKind.SDC_MISMATCH
    )
    assert checks.judge_allreduce(None, H100, node="n", now=0).status is CheckStatus.UNKNOWN
    assert checks.judge_dcgm(None, level=1, node="n", now=0).status is CheckStatus.UNKNOWN
    assert checks.judge_dcgm("not json", level=1, node="n", now=0).status is CheckStatus.UNKNOWN


def test_gloo_allreduce_plumbing_on_cpu() -> None:
    # torch is part of the test environment (scripts/test installs the gpu extra;
    # docs/decisions/0030): this must run, never skip.
    from gpufleet.health import _torch

    run = _torch.allreduce(world=2, nbytes=1 << 20, iters=3, backend="gloo", timeout_s=60)
    assert run.correct and run.world == 2 and run.busbw_gbps > 0
    r = checks.judge_allreduce(run, CPU, node="n", now=0)
    assert r.status is CheckStatus.OK
