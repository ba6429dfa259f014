"""torch adapter: the only module that imports torch (an optional extra).

GEMM in bfloat16 and device copies on CUDA GPUs (or the CPU, for tests),
and an intra-node all-reduce over ``torch.distributed`` (NCCL on GPUs, gloo
on the CPU) in spawned processes on a loopback rendezvous.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing as mp
import os
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


# -- domain burn-in (gpufleet.health.domain_allreduce runs this under srun) ----------


def _perf_rows(
    group: Any, members: list[int], rank: int, sizes: list[int], iters: int, fault: dict[str, Any]
) -> str | None:
    """nccl-tests rows for one all-reduce run over ``members``; the text on its lowest rank.

    Out-of-place, float32, sum: each iteration all-reduces a fresh tensor of ``rank + 1``
    and counts the elements that are not the known sum (#wrong, summed over the group);
    time is the lowest rank's median iteration. ``fault`` (the simulated backend's
    injection on this rank): ``slow_s`` seconds added to each iteration, ``wrong`` a
    contribution off by one.
    """
    import statistics

    import torch
    import torch.distributed as dist

    device = "cuda" if torch.cuda.is_available() else "cpu"
    expected = float(sum(r + 1 for r in members))
    mine = float(rank + 1) + (1.0 if fault.get("wrong") else 0.0)
    n = len(members)
    rows = []
    for size in sizes:
        count = max(1, size // 4)
        times: list[float] = []
        wrong = 0
        for i in range(iters + 1):  # the first is a warm-up, not timed
            t = torch.full((count,), mine, dtype=torch.float32, device=device)
            dist.barrier(group=group)
            start = time.perf_counter()
            if i and fault.get("slow_s"):
                time.sleep(float(fault["slow_s"]))
            out = t.clone()
            dist.all_reduce(out, group=group)
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - start)
            wrong += int((out != expected).sum().item())
        total = torch.tensor([wrong], dtype=torch.int64, device=device)
        dist.all_reduce(total, group=group)
        us = statistics.median(times) * 1e6
        algbw = count * 4 / (us * 1e-6) / 1e9
        busbw = algbw * 2 * (n - 1) / n
        rows.append(
            f"{count * 4:>12d}  {count:>12d}     float     sum      -1  {us:>8.1f}  "
            f"{algbw:>6.3f}  {busbw:>6.3f}  {int(total.item()):>6d}"
            "       N/A     N/A     N/A     N/A"
        )
    return "\n".join(rows) if rank == min(members) else None


def domain_allreduce(
    *,
    rank: int,
    world: int,
    node: str,
    local_rank: int,
    addr: str,
    port: int,
    phases: list[list[tuple[str, list[str]]]],
    sizes: list[int],
    iters: int,
    fault: dict[str, Any],
    timeout_s: float,
) -> str | None:
    """One rank of the domain burn-in; rank 0 returns every run's output, the others None.

    ``phases``: the runs at once in each phase, each a test name and the nodes whose ranks
    take part (domain.domain_burnin.runs: the whole domain, then the pairs). A ``TCPStore`` on
    rank 0 is the rendezvous; NCCL with CUDA, gloo without. Each run prints, on its
    lowest rank, what nccl-tests' all_reduce_perf prints (its header's rank lines and
    its table), after a ``# gpufleet test: NAME`` line; rank 0 gathers them in order.
    """
    import datetime

    import torch
    import torch.distributed as dist

    from gpufleet.domain import nccl_tests

    wait = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        addr, port, world, rank == 0, timeout=wait, wait_for_workers=False
    )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=wait)
    seen: list[Any] = [None] * world
    dist.all_gather_object(seen, (node, os.getpid(), local_rank))
    hosts = [str(h[0]) for h in seen]
    runs: list[tuple[str, list[int], Any]] = []
    for phase in phases:
        for name, nodes in phase:
            members = [r for r in range(world) if hosts[r] in nodes]
            # every rank creates every group, in the same order (torch.distributed's rule)
            group = dist.new_group(members) if len(members) < world else dist.group.WORLD
            runs.append((name, members, group))
    texts: dict[str, str] = {}
    i = 0
    for phase in phases:
        for _ in phase:
            name, members, group = runs[i]
            i += 1
            if rank in members:
                text = _perf_rows(group, members, rank, sizes, iters, fault)
                if text is not None:
                    header = "\n".join(
                        f"#  Rank {r:2d} Group  0 Pid {seen[r][1]:6d} on {hosts[r]:>10s} "
                        f"device {seen[r][2]:2d} [0x00] {backend}"
                        for r in members
                    )
                    texts[name] = f"{nccl_tests.TEST_MARK} {name}\n{header}\n{text}"
        dist.barrier()
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(texts, gathered if rank == 0 else None, dst=0)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    if rank != 0:
        return None
    merged: dict[str, str] = {}
    for part in gathered:
        merged.update(part or {})
    return "\n".join(merged[name] for name, _, _ in runs if name in merged)


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
