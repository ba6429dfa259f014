"""The active checks' child process: results come back, failures become HardwareError."""

from __future__ import annotations

import os
import time

import pytest

from gpufleet.health import compute, isolated
from gpufleet.health.backend_real import RealHardware
from gpufleet.health.hardware import HardwareError, NoGpuFound


def _gemm_with_pid(n: int) -> tuple[int, compute.GemmRun]:
    return os.getpid(), compute.NumpyDevice(0).gemm(n, 2, seed=7)


def _raises() -> None:
    raise ValueError("row 3 is wrong")


def _dies() -> None:
    os._exit(7)


def _hangs() -> None:
    time.sleep(60)


def test_the_work_runs_in_another_process_and_its_result_comes_back() -> None:
    pid, run = isolated.call(_gemm_with_pid, (64,), what="GEMM", timeout_s=60)
    assert pid != os.getpid()
    reference = compute.NumpyDevice(0).gemm(64, 1, seed=7)
    assert run.n == 64 and run.iters == 2
    assert (run.rows == reference.rows).all()


def test_an_exception_in_the_child_names_its_type_and_message() -> None:
    with pytest.raises(HardwareError, match=r"GEMM failed: ValueError: row 3 is wrong"):
        isolated.call(_raises, (), what="GEMM", timeout_s=60)


def test_a_child_that_dies_without_answering_gives_its_exit_code() -> None:
    with pytest.raises(HardwareError, match=r"exited without an answer \(exit code 7\)"):
        isolated.call(_dies, (), what="device copy", timeout_s=60)


def test_a_hung_child_is_killed_at_the_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(HardwareError, match=r"did not finish in 2s; its process was killed"):
        isolated.call(_hangs, (), what="GEMM", timeout_s=2)
    assert time.monotonic() - t0 < 30  # not the child's 60 s: it was killed


def test_real_backend_without_a_gpu_says_why_and_leaves_no_child() -> None:
    hw = RealHardware(kmsg_path="/nonexistent/kmsg")
    try:
        with pytest.raises((NoGpuFound, HardwareError)) as info:
            hw.run_gemm(32, 1, seed=1)
    finally:
        hw.close()
    # Either NVML's reason (no driver here) or torch's absence; never a silent empty result.
    assert "NVML" in str(info.value) or "torch" in str(info.value)
    import multiprocessing

    assert multiprocessing.active_children() == []
