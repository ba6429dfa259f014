"""The hardware interface the monitors and checks use, and its errors.

Two implementations: :mod:`backend_real` (NVML, ``/dev/kmsg``, sysfs,
``dcgmi``, torch) and :mod:`backend_sim` (in-memory GPUs, HCAs and kernel
log with fault injection). Both hand out the *raw* formats (NVML value sets,
kmsg lines, a sysfs tree), so that the same parsers run on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from gpufleet.health import compute


class HardwareError(RuntimeError):
    """A hardware source could not be read; the message says which and why."""


class NoGpuFound(HardwareError):
    """NVML is missing or found no GPU on this machine."""


class Hardware(Protocol):
    """What the agent needs from a node's hardware."""

    name: str
    """``real`` or ``simulated``."""
    sysfs_root: Path
    """Root under which ``sys/class/infiniband`` and ``sys/bus/pci`` are read."""

    def gpus(self) -> list[dict[str, Any]]:
        """One NVML raw value set per GPU (see :mod:`nvml_values`).

        Raises :class:`NoGpuFound` when there is no GPU or no driver, and
        :class:`HardwareError` when NVML fails otherwise.
        """
        ...

    def kernel_lines(self) -> list[str]:
        """Kernel log lines (kmsg format) logged since the previous call.

        Raises :class:`HardwareError` when the log cannot be read.
        """
        ...

    def imex_status(self) -> str | None:
        """The local IMEX daemon's answer to ``nvidia-imex-ctl -q`` (``READY``);
        None when this host runs no IMEX daemon.

        Raises :class:`HardwareError` when IMEX is configured but cannot be asked.
        """
        ...

    def ib_neighbour(self, hca: str, port: int) -> tuple[str, str | None]:
        """What the node at the far end of ``hca``/``port`` says of itself: the output of
        ``smpquery -D nodeinfo 0,<port>`` and of ``nodedesc`` (None: not asked), parsed by
        :mod:`gpufleet.health.ib_neighbours` (the switch the port is cabled to).

        Raises :class:`HardwareError` when it cannot be asked (no tool, no answer in
        time, an error): the neighbour is then unknown, never a fault.
        """
        ...

    def dcgm_diag(self, level: int, timeout_s: float) -> str | None:
        """The JSON output of ``dcgmi diag -r <level> -j``; None when DCGM is absent."""
        ...

    def run_gemm(self, n: int, iters: int, seed: int) -> dict[int, compute.GemmRun]:
        """The active checks' GEMM on every GPU (or simulated one), by GPU index.

        Raises :class:`HardwareError` when it cannot run or did not finish."""
        ...

    def run_copy(self, nbytes: int, iters: int) -> dict[int, compute.CopyRun]:
        """The active checks' device-to-device copy on every GPU, by GPU index.

        Raises :class:`HardwareError` when it cannot run or did not finish."""
        ...

    def allreduce(self, nbytes: int, iters: int) -> compute.AllReduceRun | None:
        """Run an intra-node all-reduce over every device; None when not possible."""
        ...

    def busy(self) -> bool:
        """Whether a workload is using the GPUs (active checks then wait, GPU resets
        are refused).

        Raises :class:`HardwareError` when that cannot be read; callers count
        it as busy (fail closed).
        """
        ...

    def reset_gpu(self, index: int | None) -> str:
        """Reset one GPU (``None``: every GPU); returns what was done.

        Raises :class:`HardwareError` when the reset failed or is not possible
        (processes still hold the GPU, no driver).
        """
        ...

    def close(self) -> None:
        """Release handles (NVML, files)."""
        ...
