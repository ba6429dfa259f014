"""Compute primitives of the active checks, with a numpy CPU implementation.

A :class:`ComputeDevice` runs one GEMM and one memory copy and reports the
time they took and a fingerprint of the GEMM result. The torch (CUDA or CPU)
implementation lives in :mod:`_torch`; :class:`NumpyDevice` runs everywhere
(float32, since numpy has no bfloat16) and is what the CPU tests measure.

Inputs are generated from a seed so that every device multiplies the same
matrices; the fingerprint (sampled rows of the product, as float64) is
compared with the peers and with a float64 reference of the same rows
computed on the CPU, which is how silent data corruption shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

SAMPLE_ROWS = 8
"""Rows of the product kept as fingerprint and checked against the reference."""


@dataclass(frozen=True, slots=True)
class GemmRun:
    """One timed GEMM: ``n x n @ n x n``, ``iters`` times."""

    n: int
    iters: int
    seconds: float
    """Wall time of all iterations (after one warm-up)."""
    rows: npt.NDArray[np.float64]
    """The first SAMPLE_ROWS rows of the product, as float64."""
    dtype: str

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s (2 n^3 per GEMM)."""
        return 2.0 * self.n**3 * self.iters / self.seconds / 1e12 if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class CopyRun:
    """One timed device-to-device copy of ``nbytes``, ``iters`` times."""

    nbytes: int
    iters: int
    seconds: float

    @property
    def gbps(self) -> float:
        """Achieved bandwidth in GB/s, counting read and write (2 x nbytes per copy)."""
        return 2.0 * self.nbytes * self.iters / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class AllReduceRun:
    """One timed all-reduce over ``world`` ranks."""

    world: int
    nbytes: int
    iters: int
    seconds: float
    backend: str
    correct: bool
    """Whether every rank got the expected sum."""

    @property
    def algbw_gbps(self) -> float:
        """Algorithm bandwidth: bytes / time per all-reduce."""
        return self.nbytes * self.iters / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def busbw_gbps(self) -> float:
        """Bus bandwidth as nccl-tests defines it: algbw x 2(n-1)/n."""
        return self.algbw_gbps * 2.0 * (self.world - 1) / self.world if self.world > 1 else 0.0


class ComputeDevice(Protocol):
    """One device the active checks run on."""

    index: int
    label: str
    """``cuda:3``, ``cpu``, ``sim:3``."""

    def gemm(self, n: int, iters: int, seed: int) -> GemmRun:
        """Multiply the seeded ``n x n`` inputs ``iters`` times."""
        ...

    def copy(self, nbytes: int, iters: int) -> CopyRun:
        """Copy a ``nbytes`` buffer ``iters`` times."""
        ...


def inputs(n: int, seed: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The seeded GEMM inputs (uniform in [-1, 1)), identical on every device."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, size=(n, n)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, size=(n, n)).astype(np.float32)
    return a, b


def reference_rows(
    a: npt.NDArray[np.floating], b: npt.NDArray[np.floating]
) -> npt.NDArray[np.float64]:
    """The first SAMPLE_ROWS rows of ``a @ b`` in float64 (the SDC reference)."""
    out: npt.NDArray[np.float64] = a[:SAMPLE_ROWS].astype(np.float64) @ b.astype(np.float64)
    return out


def relative_error(rows: npt.NDArray[np.float64], ref: npt.NDArray[np.float64]) -> float:
    """Normwise relative error ||rows - ref|| / ||ref|| (inf when not finite)."""
    if rows.shape != ref.shape or not np.all(np.isfinite(rows)):
        return float("inf")
    denom = float(np.linalg.norm(ref))
    return float(np.linalg.norm(rows - ref)) / denom if denom > 0 else float("inf")


class NumpyDevice:
    """The CPU, through numpy (float32 GEMM, memcpy bandwidth)."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.label = "cpu"

    def gemm(self, n: int, iters: int, seed: int) -> GemmRun:
        a, b = inputs(n, seed)
        c = a @ b  # warm-up
        start = time.perf_counter()
        for _ in range(iters):
            c = a @ b
        seconds = time.perf_counter() - start
        return GemmRun(n, iters, seconds, c[:SAMPLE_ROWS].astype(np.float64), "float32")

    def copy(self, nbytes: int, iters: int) -> CopyRun:
        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # warm-up (page faults)
        start = time.perf_counter()
        for _ in range(iters):
            np.copyto(dst, src)
        return CopyRun(nbytes, iters, time.perf_counter() - start)


def round_bf16(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Round float32 values to bfloat16 precision (nearest even), as float32.

    The torch GEMM multiplies bf16 inputs; the SDC reference must start from
    the same rounded values, or the rounding itself would look like corruption.
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
        0xFFFF0000
    )
    out: npt.NDArray[np.float32] = rounded.view(np.float32)
    return out
