#!/usr/bin/env python3
"""A tiny data-parallel training job that checkpoints and resumes after a requeue.

Each rank (one per Slurm node, started by ``srun``) holds a shard of a
synthetic linear-regression data set; every step the ranks average their
gradients (all-reduce) and take the same SGD step. Rank 0 writes a checkpoint
every ``--every`` steps (atomically: write, fsync, rename). When Slurm
requeues the job (a node failed, or gpufleet lent the node to Kubernetes), the
job starts again and every rank resumes from the newest checkpoint, so at most
one checkpoint interval of steps is repeated.

Backends: ``torch.distributed`` (gloo, CPU) when torch is installed, otherwise
numpy with a small TCP all-reduce over the rendezvous address. The
checkpoint/resume code is the same for both.

Job telemetry: with ``GPUFLEET_TELEMETRY_DIR`` set, every rank appends one
line per step to ``<dir>/<job>.<restart>/rank-<rank>.<node>.jsonl`` with the
seconds of its own work in the step (before the all-reduce, which waits for
the slowest rank). gpufleet's node agents read it to find stragglers (format:
``gpufleet.domain.stragglers``; this file does not import gpufleet).

Simulated GPUs: the step's GPU work is simulated by ``--step-time`` seconds.
With ``GPUFLEET_SIM_GPUS`` set (the local demo), it is divided by the speed
that the node's simulated hardware publishes in ``<dir>/<node>.json``, so an
injected slow GPU slows this rank as a real one would.

Environment (set by Slurm/srun): SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_ID,
SLURM_RESTART_COUNT, SLURM_LAUNCH_NODE_IPADDR; or RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT to run it without Slurm.

    srun python train.py --ckpt-dir /shared/ckpt --steps 40 --every 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

DIM = 16


# -- checkpoint / resume (identical for every backend) ------------------------------


def latest_checkpoint(ckpt_dir: Path) -> dict[str, Any] | None:
    """The newest complete checkpoint, or None. Half-written files are never seen
    because :func:`save_checkpoint` renames a finished file into place."""
    best: dict[str, Any] | None = None
    for path in ckpt_dir.glob("step-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if best is None or data["step"] > best["step"]:
            best = data
    return best


def save_checkpoint(ckpt_dir: Path, step: int, weights: list[float], keep: int = 3) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step-{step:08d}.json"
    tmp = ckpt_dir / f".step-{step:08d}.json.tmp"
    with tmp.open("w") as f:
        json.dump({"step": step, "weights": weights}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(final)
    for old in sorted(ckpt_dir.glob("step-*.json"))[:-keep]:
        old.unlink(missing_ok=True)
    return final


# -- data and model -------------------------------------------------------------------


def shard(rank: int, world: int, n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    true_w = rng.normal(size=DIM)
    x = rng.normal(size=(n, DIM))
    y = x @ true_w + 0.01 * rng.normal(size=n)
    return x[rank::world], y[rank::world]


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    err = x @ w - y
    return 2 * x.T @ err / len(y), float(np.mean(err**2))


# -- all-reduce backends ------------------------------------------------------------


class TcpAllReduce:
    """Average float64 vectors across ranks through rank 0 (star; fine for a few ranks)."""

    def __init__(self, rank: int, world: int, addr: str, port: int, timeout: float = 60) -> None:
        self.rank, self.world = rank, world
        self.peers: list[socket.socket] = []
        if world == 1:
            return
        if rank == 0:
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("0.0.0.0", port))
            srv.listen(world)
            srv.settimeout(timeout)
            for _ in range(world - 1):
                conn, _ = srv.accept()
                conn.settimeout(timeout)
                self.peers.append(conn)
            srv.close()
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    sock = socket.create_connection((addr, port), timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            sock.settimeout(timeout)
            self.peers.append(sock)

    @staticmethod
    def _recv(sock: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("peer went away")
            buf += chunk
        return buf

    def _send(self, sock: socket.socket, v: np.ndarray) -> None:
        data = v.astype(np.float64).tobytes()
        sock.sendall(struct.pack("!I", len(data)) + data)

    def _get(self, sock: socket.socket) -> np.ndarray:
        (n,) = struct.unpack("!I", self._recv(sock, 4))
        return np.frombuffer(self._recv(sock, n), dtype=np.float64)

    def close(self) -> None:
        for p in self.peers:
            p.close()

    def mean(self, v: np.ndarray) -> np.ndarray:
        if self.world == 1:
            return v
        if self.rank == 0:
            total = v.astype(np.float64).copy()
            for p in self.peers:
                total += self._get(p)
            total /= self.world
            for p in self.peers:
                self._send(p, total)
            return total
        self._send(self.peers[0], v)
        return self._get(self.peers[0])


class TorchAllReduce:
    def __init__(self, rank: int, world: int, addr: str, port: int) -> None:
        import torch.distributed as dist

        self.dist = dist
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world
        )

    def mean(self, v: np.ndarray) -> np.ndarray:
        import torch

        t = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64))
        self.dist.all_reduce(t)
        return (t / self.dist.get_world_size()).numpy()

    def close(self) -> None:
        """Leave together: a process group left to interpreter exit can abort the
        process ("terminate called without an active exception"), failing the job."""
        self.dist.barrier()
        self.dist.destroy_process_group()


def make_allreduce(backend: str, rank: int, world: int, addr: str, port: int) -> Any:
    if backend == "auto":
        try:
            import torch.distributed  # noqa: F401

            backend = "torch"
        except ImportError:
            backend = "numpy"
    if backend == "torch":
        return "torch", TorchAllReduce(rank, world, addr, port)
    return "numpy", TcpAllReduce(rank, world, addr, port)


# -- telemetry and simulated GPU speed ------------------------------------------------


class Telemetry:
    """One rank's step telemetry (nothing when ``root`` is not set)."""

    def __init__(self, root: str | None, job: str, run: int, rank: int, node: str) -> None:
        self.head = {"v": 1, "job": job, "run": run, "rank": rank, "node": node}
        self.file = None
        if root:
            path = Path(root) / f"{job}.{run}" / f"rank-{rank}.{node}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("a", buffering=1)  # line-buffered: whole lines

    def step(self, step: int, compute_s: float) -> None:
        if self.file is not None:
            line = {**self.head, "step": step, "compute_s": round(compute_s, 6), "t": time.time()}
            self.file.write(json.dumps(line, separators=(",", ":")) + "\n")


def sim_speed(root: str | None, node: str) -> float:
    """The simulated node's speed (1.0 without simulated GPUs or when unreadable)."""
    if not root:
        return 1.0
    try:
        speed = float(json.loads((Path(root) / f"{node}.json").read_text())["speed"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1.0
    return min(1.0, max(speed, 0.05))


# -- main ---------------------------------------------------------------------------


def rendezvous_port(job: int, restart: int, cluster: str) -> int:
    """A port for rank 0 that differs between jobs, requeues and clusters.

    Job ids alone repeat across Slurm clusters on one machine (each local cluster
    starts at 1), so the cluster's config path is mixed in; the restart count
    keeps a requeued run off the previous run's port. The range stays below the
    kernel's ephemeral ports (32768 and up), which outgoing connections take.
    """
    return 20000 + zlib.crc32(f"{cluster}:{job}:{restart}".encode()) % 12000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument(
        "--step-time", type=float, default=0.2, help="seconds of (simulated) GPU work per step"
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--backend", choices=["auto", "torch", "numpy"], default="auto")
    a = p.parse_args(argv)

    env = os.environ
    rank = int(env.get("SLURM_PROCID", env.get("RANK", "0")))
    world = int(env.get("SLURM_NTASKS", env.get("WORLD_SIZE", "1")))
    job = int(env.get("SLURM_JOB_ID", "0"))
    restart = int(env.get("SLURM_RESTART_COUNT", "0"))
    addr = env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
    port = int(env.get("MASTER_PORT") or rendezvous_port(job, restart, env.get("SLURM_CONF", "")))
    node = env.get("SLURMD_NODENAME", socket.gethostname())

    ckpt = latest_checkpoint(a.ckpt_dir)
    start = ckpt["step"] if ckpt else 0
    w = np.array(ckpt["weights"]) if ckpt else np.zeros(DIM)
    backend, reducer = make_allreduce(a.backend, rank, world, addr, port)
    x, y = shard(rank, world)
    events = a.ckpt_dir / "events.jsonl"

    def record(kind: str, **kw: Any) -> None:
        if rank == 0:
            line = {"kind": kind, "job": job, "restart": restart, "t": time.time(), **kw}
            with events.open("a") as f:
                f.write(json.dumps(line) + "\n")

    a.ckpt_dir.mkdir(parents=True, exist_ok=True)
    record("start", step=start, world=world, backend=backend, node=node)
    print(f"rank {rank}/{world} on {node}: {backend}, resuming at step {start}", flush=True)
    telemetry = Telemetry(
        env.get("GPUFLEET_TELEMETRY_DIR"), env.get("SLURM_JOB_ID", "local"), restart, rank, node
    )
    loss = float("nan")
    for step in range(start + 1, a.steps + 1):
        began = time.perf_counter()
        g, loss = gradient(w, x, y)
        time.sleep(a.step_time / sim_speed(env.get("GPUFLEET_SIM_GPUS"), node))
        telemetry.step(step, time.perf_counter() - began)
        w = w - a.lr * reducer.mean(g)
        record("step", step=step)
        if rank == 0 and (step % a.every == 0 or step == a.steps):
            save_checkpoint(a.ckpt_dir, step, [float(v) for v in w])
    reducer.close()
    record("done", step=a.steps, loss=loss)
    print(f"rank {rank}: done, {a.steps} steps, loss {loss:.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
