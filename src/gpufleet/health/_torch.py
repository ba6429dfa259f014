"""torch adapter: the only module that imports torch (an optional extra).

GEMM in bfloat16 and device copies on CUDA GPUs (or the CPU, for tests),
and an intra-node all-reduce over ``torch.distributed`` (NCCL on GPUs, gloo
on the CPU) in spawned processes on a loopback rendezvous.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing as mp
import queue
import socket
import time
from typing import Any

import numpy as np

from gpufleet.health import compute
from gpufleet.health.hardware import HardwareError


def available() -> bool:
    """Whether torch is installed (found, not imported: importing it costs the
    agent seconds and hundreds of MB it does not need until a check runs)."""
    return importlib.util.find_spec("torch") is not None


def cuda_count() -> int:
    """CUDA devices torch sees (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def cuda_devices() -> list[compute.ComputeDevice] | None:
    """One device per CUDA GPU; None without torch or CUDA."""
    n = cuda_count()
    if n == 0:
        return None
    return [TorchDevice(f"cuda:{i}", i) for i in range(n)]


class TorchDevice:
    """A torch device: bf16 GEMM (tensor cores on GPUs) and a device-to-device copy."""

    def __init__(self, device: str, index: int = 0) -> None:
        self.label = device
        self.index = index

    def _sync(self) -> None:
        import torch

        if self.label.startswith("cuda"):
            torch.cuda.synchronize(self.label)

    def gemm(self, n: int, iters: int, seed: int) -> compute.GemmRun:
        import torch

        a_np, b_np = compute.inputs(n, seed)
        a = torch.from_numpy(a_np).to(self.label, torch.bfloat16)
        b = torch.from_numpy(b_np).to(self.label, torch.bfloat16)
        c = a @ b  # warm-up (cuBLAS heuristics, clocks up)
        self._sync()
        start = time.perf_counter()
        for _ in range(iters):
            c = a @ b
        self._sync()
        seconds = time.perf_counter() - start
        rows = c[: compute.SAMPLE_ROWS].float().cpu().numpy().astype(np.float64)
        return compute.GemmRun(n, iters, seconds, rows, "bfloat16")

    def copy(self, nbytes: int, iters: int) -> compute.CopyRun:
        import torch

        src = torch.empty(nbytes, dtype=torch.uint8, device=self.label)
        dst = torch.empty_like(src)
        dst.copy_(src)
        self._sync()
        start = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        self._sync()
        return compute.CopyRun(nbytes, iters, time.perf_counter() - start)


def gemm_all(n: int, iters: int, seed: int) -> dict[int, compute.GemmRun]:
    """The GEMM on every CUDA GPU in turn ({} without torch or CUDA).

    Meant to run in a child process (:mod:`gpufleet.health.isolated`): it
    leaves a CUDA context on every GPU until its process exits."""
    return {d.index: d.gemm(n, iters, seed) for d in cuda_devices() or []}


def copy_all(nbytes: int, iters: int) -> dict[int, compute.CopyRun]:
    """The device copy on every CUDA GPU in turn ({} without torch or CUDA); like
    :func:`gemm_all`, meant for a child process."""
    return {d.index: d.copy(nbytes, iters) for d in cuda_devices() or []}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank(
    rank: int, world: int, port: int, backend: str, nbytes: int, iters: int, out: Any
) -> None:
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        device = f"cuda:{rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
        n = max(1, nbytes // 4)
        t = torch.full((n,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(t)  # warm-up; also the correctness probe
        expected = world * (world + 1) / 2
        correct = bool(torch.all(t == expected).item())
        dist.barrier()
        if backend == "nccl":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        if backend == "nccl":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        out.put((rank, seconds, correct, ""))
        dist.destroy_process_group()
    except Exception as exc:
        out.put((rank, 0.0, False, f"{type(exc).__name__}: {exc}"))


def allreduce(
    *, world: int, nbytes: int, iters: int, backend: str, timeout_s: float = 120.0
) -> compute.AllReduceRun:
    """All-reduce ``nbytes`` of float32 over ``world`` local ranks, ``iters`` times."""
    if not available():
        raise HardwareError("torch is not installed (pip install 'gpufleet[gpu]')")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, backend, nbytes, iters, out), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: list[tuple[int, float, bool, str]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HardwareError(
                    f"all-reduce over {world} ranks did not finish in {timeout_s:g}s"
                )
            try:
                results.append(out.get(timeout=min(remaining, 1.0)))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and out.empty():
                    raise HardwareError("all-reduce workers exited without a result") from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [e for _, _, _, e in results if e]
    if errors:
        raise HardwareError(f"all-reduce failed: {errors[0]}")
    seconds = max(s for _, s, _, _ in results)
    return compute.AllReduceRun(
        world, max(1, nbytes // 4) * 4, iters, seconds, backend, all(c for _, _, c, _ in results)
    )


# -- gang preflight (gpufleet.health.preflight runs this as a child process) ----------

GANG_ELEMENTS = 256 * 1024
"""Floats per all-reduce in the gang preflight (1 MiB): enough to cross every link."""
GANG_ROUNDS = 3


def _reachable(addr: str, port: int, until: float) -> bool:
    """Whether a TCP connection to ``addr:port`` opens before ``until`` (epoch seconds)."""
    while time.time() < until:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def gang_allreduce(
    *, rank: int, world: int, nodes: list[str], addr: str, port: int, deadline: float
) -> dict[str, Any]:
    """One rank of the gang preflight; rank 0 also collects every rank's answer.

    A ``TCPStore`` on rank 0 is the rendezvous and the answer sheet: each rank
    sets ``arrived/<rank>``, joins the process group (NCCL with CUDA, else
    gloo), all-reduces ``GANG_ROUNDS`` times a tensor of ``rank + 1`` and sets
    ``sum/<rank>`` to ``ok`` or ``wrong``. Rank 0 names the ranks whose answer
    is missing or wrong at the deadline; rank 1 names rank 0 when its rendezvous
    cannot be reached (wall-clock seconds since the epoch, set
    by the parent before torch was imported; one second is kept for collecting).
    """
    import datetime

    import torch
    import torch.distributed as dist

    started = time.monotonic()
    if rank != 0 and not _reachable(addr, port, deadline - 1.0):
        # Rank 0's node cannot be reached: rank 1 names it (only one rank acts).
        return {
            "ok": False,
            "bad": [nodes[0]] if rank == 1 else [],
            "seconds": time.monotonic() - started,
            "detail": f"rendezvous on {nodes[0]} ({addr}:{port}) unreachable",
        }
    wait = datetime.timedelta(seconds=max(1.0, deadline - time.time() - 1.0))
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            addr, port, world, rank == 0, timeout=wait, wait_for_workers=False
        )
    except Exception as exc:
        if rank == 0:  # the port is taken, say: no verdict, the job runs
            return {"ok": False, "ran": False, "seconds": 0.0, "detail": f"rendezvous: {exc}"}
        # Rank 0's node cannot be reached: rank 1 names it (only one rank acts).
        return {
            "ok": False,
            "bad": [nodes[0]] if rank == 1 else [],
            "seconds": time.monotonic() - started,
            "detail": f"rendezvous on {nodes[0]} unreachable: {type(exc).__name__}",
        }
    store.set(f"arrived/{rank}", "1")
    verdict = "wrong"
    detail = ""
    try:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=wait)
        device = "cuda" if backend == "nccl" else "cpu"
        expected = world * (world + 1) / 2
        good = True
        for _ in range(GANG_ROUNDS):
            t = torch.full((GANG_ELEMENTS,), float(rank + 1), device=device)
            dist.all_reduce(t)
            good = good and bool(torch.all(t == expected).item())
        verdict = "ok" if good else "wrong"
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"[:300]
    store.set(f"sum/{rank}", verdict)
    if rank != 0:
        return {"ok": verdict == "ok", "seconds": time.monotonic() - started, "detail": detail}
    answers: dict[int, str] = {}
    while len(answers) < world and time.time() < deadline:
        for r in range(world):
            if r not in answers and store.check([f"sum/{r}"]):
                answers[r] = store.get(f"sum/{r}").decode()
        time.sleep(0.05)
    # A rank that never arrived is the one to name: the others' failure to
    # form the group follows from its absence.
    absent = [nodes[r] for r in range(world) if not store.check([f"arrived/{r}"])]
    bad = absent or [nodes[r] for r in range(world) if answers.get(r) != "ok"]
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return {
        "ok": not bad,
        "bad": bad,
        "seconds": time.monotonic() - started,
        "detail": detail or ("" if not bad else f"no good answer from {', '.join(bad)}"),
    }


if __name__ == "__main__":
    import json
    import resource
    import sys

    # The gang preflight's rank (health.preflight.run): no core file. A rank whose peer
    # vanishes can abort inside the collective library (gloo raises SIGABRT); the parent
    # already reports "no verdict" and names the absent peer, and the core of a process
    # holding torch (and CUDA) is hundreds of MB to GB in the job's working directory.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    print(json.dumps(gang_allreduce(**json.loads(sys.argv[1]))), flush=True)
