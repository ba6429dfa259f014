"""The real hardware backend: NVML, ``/dev/kmsg``, sysfs, ``dcgmi`` and torch.

Every source is opened lazily and fails on its own: no NVML means the GPU
subsystems are unknown, an unreadable ``/dev/kmsg`` (the agent needs
CAP_SYSLOG or root) means the kernel subsystem is unknown, and so on.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.health import compute, fabric, isolated, kmsg, nvml_values
from gpufleet.health.hardware import Hardware, HardwareError, NoGpuFound

KMSG = "/dev/kmsg"

ACTIVE_TIMEOUT_S = 300.0
"""Longest one GEMM or copy pass over every GPU may take before its process is
killed and the check reports the hang (8 GPUs at the default size take seconds)."""

R = TypeVar("R")


class KmsgReader:
    """Non-blocking reader of ``/dev/kmsg`` records."""

    def __init__(self, path: str = KMSG, *, lookback_s: float | None = None) -> None:
        self.path = path
        self.lookback_s = lookback_s
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                raise HardwareError(f"cannot open {self.path}: {exc.strerror}") from exc
        return self._fd

    def read(self) -> list[str]:
        fd = self._open()
        first = self.lookback_s is not None and not hasattr(self, "_started")
        cutoff = None
        if first:
            self._started = True
            assert self.lookback_s is not None
            cutoff = (time.clock_gettime(time.CLOCK_MONOTONIC) - self.lookback_s) * 1e6
        lines: list[str] = []
        while True:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                raise HardwareError(f"reading {self.path}: {exc.strerror}") from exc
            if not data:
                break
            for line in data.decode("utf-8", errors="replace").splitlines():
                if cutoff is not None:
                    rec = kmsg.parse_record(line)
                    if rec is not None and rec.usec is not None and rec.usec < cutoff:
                        continue
                lines.append(line)
        return lines

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _merge_smi_fabric(gpus: list[dict[str, Any]]) -> None:
    """Fill the fabric keys from ``nvidia-smi -q`` where NVML could not give them
    (a binding or driver without nvmlDeviceGetGpuFabricInfo). Matched by PCI bus."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return
    try:
        proc = subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return  # the fabric keys stay absent: judged as unknown by nobody, reported by NVML
    by_bus = {
        nvml_values.normalize_bus_id(str(f["pci_bus_id"])): f
        for f in fabric.parse_smi_fabric(proc.stdout)
    }
    for g in gpus:
        found = by_bus.get(nvml_values.normalize_bus_id(str(g.get("pci_bus_id", ""))))
        if found is not None and "fabric_state" not in g:
            g.update({k: v for k, v in found.items() if k.startswith("fabric_")})


class RealHardware(Hardware):
    """This machine's GPUs, HCAs and kernel log (implements :class:`Hardware`:
    declared, so mypy checks the methods against it)."""

    name = "real"

    def __init__(
        self,
        *,
        sysfs_root: Path = Path("/"),
        kmsg_lookback_s: float | None = None,
        kmsg_path: str = KMSG,
    ) -> None:
        self.sysfs_root = sysfs_root
        self._kmsg = KmsgReader(kmsg_path, lookback_s=kmsg_lookback_s)
        self._nvml: Any = None
        self._nvml_error: NoGpuFound | None = None
        self.allreduce_unavailable = "needs at least two GPUs and torch with CUDA"

    def _session(self) -> Any:
        if self._nvml is None:
            if self._nvml_error is not None:
                raise self._nvml_error
            from gpufleet.health import _nvml

            try:
                self._nvml = _nvml.Nvml()
            except NoGpuFound as exc:
                self._nvml_error = exc
                raise
        return self._nvml

    def gpus(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._session().gpus()
        if any("fabric_state" not in g for g in result):
            _merge_smi_fabric(result)
        return result

    def imex_status(self) -> str | None:
        """``nvidia-imex-ctl -c <config> -q`` (``READY`` when the local daemon serves
        its domain); None when this host runs no IMEX (no node config file)."""
        if not Path(fabric.IMEX_NODES_CONFIG).exists():
            return None
        ctl = shutil.which("nvidia-imex-ctl")
        if ctl is None:
            raise HardwareError(
                f"{fabric.IMEX_NODES_CONFIG} exists but nvidia-imex-ctl is not installed"
            )
        argv = [ctl, "-c", fabric.IMEX_CONFIG, "-q"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except subprocess.TimeoutExpired as exc:
            raise HardwareError(f"{' '.join(argv)} did not answer in 10s") from exc
        return (proc.stdout + proc.stderr).strip() or f"no output (exit {proc.returncode})"

    def kernel_lines(self) -> list[str]:
        return self._kmsg.read()

    def ib_neighbour(self, hca: str, port: int) -> tuple[str, str | None]:
        """``smpquery`` (infiniband-diags) by directed route ``0,<port>``: two SMPs to
        the neighbour, each given 2 s by the tool and 10 s in all."""
        tool = shutil.which("smpquery")
        if tool is None:
            raise HardwareError("smpquery is not installed (Debian: infiniband-diags)")
        out: list[str] = []
        for op in ("nodeinfo", "nodedesc"):
            argv = [tool, "-C", hca, "-P", str(port), "-t", "2000", "-D", op, f"0,{port}"]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            except subprocess.TimeoutExpired as exc:
                raise HardwareError(f"{' '.join(argv)} did not answer in 10s") from exc
            if proc.returncode != 0:
                why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                raise HardwareError(f"{' '.join(argv)}: {why}")
            out.append(proc.stdout)
        return out[0], out[1]

    def dcgm_diag(self, level: int, timeout_s: float) -> str | None:
        dcgmi = shutil.which("dcgmi")
        if dcgmi is None:
            return None
        try:
            proc = subprocess.run(
                [dcgmi, "diag", "-r", str(level), "-j"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HardwareError(f"dcgmi diag -r {level} did not finish in {timeout_s:g}s") from exc
        # dcgmi exits non-zero when a test fails; the JSON still says which.
        return proc.stdout or proc.stderr

    def run_gemm(self, n: int, iters: int, seed: int) -> dict[int, compute.GemmRun]:
        from gpufleet.health import _torch

        return self._on_every_gpu(_torch.gemm_all, (n, iters, seed), "GEMM")

    def run_copy(self, nbytes: int, iters: int) -> dict[int, compute.CopyRun]:
        from gpufleet.health import _torch

        return self._on_every_gpu(_torch.copy_all, (nbytes, iters), "device copy")

    def _on_every_gpu(
        self, fn: Callable[..., dict[int, R]], args: tuple[Any, ...], what: str
    ) -> dict[int, R]:
        """One pass of ``fn`` over every GPU in a child process (:mod:`isolated`), or the
        reason there is none: NVML's when it sees no GPU, else that torch with CUDA is
        missing."""
        runs = isolated.call(fn, args, what=what, timeout_s=ACTIVE_TIMEOUT_S)
        if not runs:
            self._session()  # raises NoGpuFound with NVML's reason when there is no GPU
            raise HardwareError("torch with CUDA is not installed (pip install 'gpufleet[gpu]')")
        return runs

    def allreduce(self, nbytes: int, iters: int) -> compute.AllReduceRun | None:
        from gpufleet.health import _torch

        # NVML's count, not torch's: asking CUDA here would start it in this process.
        world = self._session().count()
        if world < 2 or not _torch.available():
            return None
        return _torch.allreduce(world=world, nbytes=nbytes, iters=iters, backend="nccl")

    def busy(self) -> bool:
        """Whether compute processes run on any GPU (NVML).

        NVML that cannot be read raises :class:`HardwareError`: the caller
        counts that as busy (an unreadable GPU must never look idle to a GPU
        reset or a stress check).
        """
        return bool(self._session().busy())

    def reset_gpu(self, index: int | None) -> str:
        """``nvidia-smi --gpu-reset`` (the node is drained before this is asked)."""
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise HardwareError("nvidia-smi not found: cannot reset a GPU")
        argv = [smi, "--gpu-reset"] + (["-i", str(index)] if index is not None else [])
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired as exc:
            raise HardwareError(f"{' '.join(argv)} did not finish in 300s") from exc
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise HardwareError(f"{' '.join(argv)} failed ({proc.returncode}): {out[-300:]}")
        return out.splitlines()[-1] if out else "GPU reset done"

    def close(self) -> None:
        self._kmsg.close()
        if self._nvml is not None:
            self._nvml.close()
