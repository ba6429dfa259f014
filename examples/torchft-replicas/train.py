#!/usr/bin/env python3
"""One replica group of a training that keeps going while a group is replaced (torchft).

A training runs as several *replica groups*, each a full copy of the model (one
Slurm job or one Pod per group). Every step, the groups in the current quorum
average their gradients (torchft's fault-tolerant DDP) and take the same
optimizer step, so they hold identical weights. torchft's lighthouse decides
the quorum each step: a group that leaves or dies drops out of the next
quorum and the others keep training; a group that starts late copies the
weights, the optimizer state and the step from a live peer before its first
step (no checkpoint reload, no global restart).

This process is one group with one rank (see docs/recovery.md for several ranks
per group under ``torchrun``/``srun``). The model is a few MLP layers on
synthetic data seeded by the step and the group's share of it; the GPU's work
is simulated by ``--step-time`` seconds (divided by the node's simulated speed
in the local demo).

Departure notice: on SIGUSR1 or SIGTERM the group finishes the step it is in,
leaves the quorum (its manager stops heartbeating to the lighthouse), writes a
``departed`` event and exits 75 (``EX_TEMPFAIL``, "try again later"), so that the
batch script ends with that code and gpufleet requeues it to start again elsewhere.
A group that reaches ``--steps`` exits 0: its work is done, and a job that ended
with 0 after a notice is not run again (docs/decisions/0279).

Checkpoints that do not stall: every ``--ckpt-every`` steps the group in quorum
position 0 copies its state to memory (the only blocking part, recorded as
``blocking_s``) and a writer thread saves it (write, fsync, rename). A group
that starts with no live peer resumes from the newest checkpoint.

Events (``--events``, one JSON line each, shared by all groups): ``start``
(the step it starts at and where that state came from), ``step`` (step, t,
group, quorum size), ``checkpoint`` (blocking seconds), ``checkpoint-saved``,
``departed``, ``done``.

Job telemetry (``GPUFLEET_TELEMETRY_DIR``, format ``gpufleet.domain.stragglers``;
this file does not import gpufleet): one line per step in
``<dir>/<training>.0/rank-<rank>.<node>.jsonl`` with ``group``, ``loss``,
``grad_norm``, ``compute_s`` and, every ``--fingerprint-every`` steps, a
``fingerprint`` of the weights (blake2b, 8 bytes, over every parameter's float32
bytes in ``named_parameters()`` order, right after the update). gpufleet's node
agents compare the fingerprints across groups to catch silent data corruption.

Simulated silent corruption: with ``GPUFLEET_SIM_GPUS`` set, a node file
``<dir>/<node>.json`` holding ``"sdc_flip_at_step": N`` makes this group flip
bit 20 of element 0 of its first parameter once, right after step N's update.

    TORCHFT_LIGHTHOUSE=http://lighthouse:29510 python train.py --group 0 --events ev.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
from torchft.checkpointing.http_transport import HTTPTransport
from torchft.ddp import DistributedDataParallel
from torchft.optim import OptimizerWrapper

DIM = 32
BATCH = 64
SDC_BIT = 20
DEPARTED_EXIT_CODE = 75
"""The exit code of a group that left on a notice and wants to come back (EX_TEMPFAIL;
gpufleet requeues only such a job, gpufleet.domain.departure.DEPARTED_EXIT_CODE)."""


def build_model() -> nn.Module:
    """The same initial weights in every group (seeded), so step 0 needs no sync."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )


def batch(
    step: int, share: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of one step's share: every group computes the same sequence."""
    g = torch.Generator().manual_seed(step * 1009 + share)
    x = torch.randn(BATCH, DIM, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True).sin()
    return x.to(device), y.to(device)


def fingerprint(model: nn.Module) -> str:
    """16 hex digits over every parameter's float32 bytes (C order, named order)."""
    h = hashlib.blake2b(digest_size=8)
    for _, p in model.named_parameters():
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def flip_bit(model: nn.Module) -> None:
    """Flip bit 20 of element 0 of the first parameter (what a silent GPU fault does)."""
    first = next(model.parameters())
    with torch.no_grad():
        bits = first.data.view(-1).view(torch.int32)
        bits[0] ^= 1 << SDC_BIT


def sim_gpu(root: str | None, node: str) -> dict[str, Any]:
    """The node's simulated GPU file (empty without one or when unreadable)."""
    if not root:
        return {}
    try:
        data = json.loads((Path(root) / f"{node}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sim_speed(gpu: dict[str, Any]) -> float:
    try:
        return min(1.0, max(float(gpu.get("speed", 1.0)), 0.05))
    except (TypeError, ValueError):
        return 1.0


class Events:
    """Appends one JSON line per event to a file shared by every group."""

    def __init__(self, path: Path, group: str, job: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.head = path, {"group": group, "job": job}
        self.lock = threading.Lock()

    def __call__(self, kind: str, **kw: Any) -> None:
        line = json.dumps({"kind": kind, **self.head, "t": time.time(), **kw}) + "\n"
        with self.lock, self.path.open("a") as f:
            f.write(line)


class Telemetry:
    """One rank's step telemetry with the replica-group fields (nothing without a dir)."""

    def __init__(
        self, root: str | None, training: str, rank: int, node: str, group: str, gpu: int | None
    ) -> None:
        self.head = {"v": 1, "job": training, "run": 0, "rank": rank, "node": node, "group": group}
        if gpu is not None:
            self.head["gpu"] = gpu
        self.file = None
        if root:
            path = Path(root) / f"{training}.0" / f"rank-{rank}.{node}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("a", buffering=1)  # line-buffered: whole lines

    def step(
        self, step: int, compute_s: float, loss: float, grad_norm: float, fp: str | None
    ) -> None:
        if self.file is None:
            return
        line: dict[str, Any] = {
            **self.head,
            "step": step,
            "compute_s": round(compute_s, 6),
            "t": time.time(),
            "loss": loss,
            "grad_norm": grad_norm,
        }
        if fp is not None:
            line["fingerprint"] = fp
        self.file.write(json.dumps(line, separators=(",", ":")) + "\n")


class Transport(HTTPTransport[dict[str, Any]]):
    """torchft's HTTP weight transfer, advertising ``host`` instead of the host name
    (peers must reach it: the node's address on a cluster, 127.0.0.1 on one machine)."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        self.host = host  # address() runs inside __init__
        super().__init__(timeout=timeout, num_chunks=0)

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        return f"http://{self.host}:{port}/checkpoint/"


class FaultTolerantDDP(DistributedDataParallel):
    """torchft's DDP, with a comm hook that survives a peer dying during the all-reduce.

    torchft 0.2.0's hook asserts on the failed all-reduce's missing future, and the
    assertion kills this group too. Here the gradient is left as it was: the manager
    has recorded the error, so the quorum does not commit the step and the next
    step's quorum leaves the dead peer out.
    """

    @staticmethod
    def _comm_hook(state, bucket):  # type: ignore[no-untyped-def]
        # No annotations: DDP checks them against the classes themselves, and this
        # module's are strings (postponed evaluation).
        work = state.allreduce(bucket.buffer())
        work.wait()
        fut = getattr(work.get_future(), "_fut", None)
        if fut is None:
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done
        return fut


class AsyncCheckpointer:
    """Copies the state to memory (blocking) and writes it from a thread."""

    def __init__(self, directory: Path, events: Events, keep: int = 2) -> None:
        self.dir, self.events, self.keep = directory, events, keep
        self.writer: threading.Thread | None = None

    def save(self, step: int, state: dict[str, Any]) -> float:
        began = time.perf_counter()
        if self.writer is not None:
            self.writer.join()  # one write at a time; counted as blocking
        snapshot = _copy(state)
        blocking = time.perf_counter() - began
        self.writer = threading.Thread(target=self._write, args=(step, snapshot), daemon=True)
        self.writer.start()
        return blocking

    def _write(self, step: int, snapshot: dict[str, Any]) -> None:
        began = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp, final = self.dir / f".step-{step:08d}.pt.tmp", self.dir / f"step-{step:08d}.pt"
        with tmp.open("wb") as f:
            torch.save(snapshot, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(final)
        for old in sorted(self.dir.glob("step-*.pt"))[: -self.keep]:
            old.unlink(missing_ok=True)
        self.events("checkpoint-saved", step=step, write_s=round(time.perf_counter() - began, 6))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.join()

    def latest(self) -> dict[str, Any] | None:
        for path in sorted(self.dir.glob("step-*.pt"), reverse=True):
            try:
                return dict(torch.load(path, weights_only=False))
            except (OSError, RuntimeError, EOFError):
                continue
        return None


def _copy(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_copy(v) for v in state)
    return state


def parse(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--group", type=int, default=int(env.get("GROUP", "0")), help="group index")
    p.add_argument(
        "--training",
        default=env.get("GPUFLEET_TRAINING") or env.get("SLURM_JOB_NAME") or "torchft-replicas",
        help="the training's name, shared by all its groups (telemetry directory)",
    )
    p.add_argument("--steps", type=int, default=100, help="train until this step")
    p.add_argument("--step-time", type=float, default=0.1, help="seconds of simulated GPU work")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--events", type=Path, required=True, help="events file (JSON lines)")
    p.add_argument("--ckpt-dir", type=Path, help="asynchronous checkpoints (none without)")
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--fingerprint-every", type=int, default=5)
    p.add_argument("--node", default=env.get("SLURMD_NODENAME") or socket.gethostname())
    p.add_argument(
        "--host",
        default=env.get("GPUFLEET_REPLICA_HOST") or socket.gethostname(),
        help="address peers reach this group at",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for collectives")
    p.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default="auto",
        help="collectives between the groups (auto: NCCL when CUDA is there, else gloo)",
    )
    p.add_argument(
        "--quorum-retries",
        type=int,
        default=int(env.get("TORCHFT_QUORUM_RETRIES", "10")),
        help="times the quorum is retried while the lighthouse is unreachable (a restart)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    group = f"g{a.group}"
    job = os.environ.get("SLURM_JOB_ID", "local")
    events = Events(a.events, group, job)
    leaving: list[str] = []

    def notice(signum: int, _frame: object) -> None:
        leaving.append(signal.Signals(signum).name)

    signal.signal(signal.SIGUSR1, notice)
    signal.signal(signal.SIGTERM, notice)

    cuda = a.backend == "nccl" or (a.backend == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    model = build_model().to(device)
    inner = torch.optim.AdamW(model.parameters(), lr=a.lr)
    recovered: dict[str, Any] = {}

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict(), "group": group}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        recovered["from"] = state.get("group", "?")

    timeout = timedelta(seconds=a.timeout)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupNCCL(timeout=timeout) if cuda else ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        use_async_quorum=False,  # a joining group heals before its first forward pass
        timeout=timeout,
        quorum_timeout=timedelta(seconds=max(30.0, 3 * a.timeout)),
        connect_timeout=timeout,
        quorum_retries=a.quorum_retries,
        rank=0,
        world_size=1,
        store_addr=a.host,
        store_port=store.port,
        replica_id=f"{a.training}_{a.group}",
        hostname=a.host,
        checkpoint_transport=Transport(a.host, timeout),
    )
    ddp = FaultTolerantDDP(manager, model)
    optimizer = OptimizerWrapper(manager, inner)
    ckpt = AsyncCheckpointer(a.ckpt_dir, events) if a.ckpt_dir else None
    origin = "init"
    if ckpt is not None and (saved := ckpt.latest()) is not None:
        load_state_dict(saved["user"])
        manager.load_state_dict(saved["torchft"])
        origin = f"checkpoint step {saved['torchft']['step']}"
        recovered.clear()
    telemetry = Telemetry(
        os.environ.get("GPUFLEET_TELEMETRY_DIR"),
        a.training,
        a.group,
        a.node,
        group,
        device.index if device is not None else None,
    )
    sim_root = os.environ.get("GPUFLEET_SIM_GPUS")
    flipped = False
    started = False
    print(f"group {group} on {a.node}: training {a.training} to step {a.steps}", flush=True)

    while manager.current_step() < a.steps and not leaving:
        optimizer.zero_grad()  # quorum; a late group copies a peer's state here
        began = time.perf_counter()  # the group's own work: not the quorum's wait
        if not started:
            started = True
            if "from" in recovered:
                origin = f"peer {recovered['from']}"
            events("start", step=manager.current_step(), recovered_from=origin, node=a.node)
            print(f"group {group}: starts at step {manager.current_step()} ({origin})", flush=True)
        step = manager.current_step() + 1
        x, y = batch(step, manager.participating_rank() or 0, device)
        loss = nn.functional.mse_loss(ddp(x), y)
        gpu = sim_gpu(sim_root, a.node)
        time.sleep(a.step_time / sim_speed(gpu))  # the simulated GPU's work
        compute_s = time.perf_counter() - began  # before backward's gradient all-reduce
        loss.backward()
        grad_norm = float(
            torch.nn.utils.get_total_norm(
                [p.grad for p in model.parameters() if p.grad is not None]
            )
        )
        optimizer.step()  # commits only if the quorum agrees the step is good
        if manager.current_step() != step:
            events("step-discarded", step=step, error=str(manager.errored()))
            continue
        if not flipped and gpu.get("sdc_flip_at_step") == step:
            flip_bit(model)
            flipped = True
        fp = fingerprint(model) if step % a.fingerprint_every == 0 else None
        telemetry.step(step, compute_s, float(loss), grad_norm, fp)
        events("step", step=step, quorum=manager.num_participants(), loss=float(loss))
        if ckpt is not None and step % a.ckpt_every == 0 and manager.participating_rank() == 0:
            blocking = ckpt.save(step, {"user": state_dict(), "torchft": manager.state_dict()})
            events("checkpoint", step=step, blocking_s=round(blocking, 6))

    if ckpt is not None:
        ckpt.close()
    manager.shutdown(wait=False)
    if leaving:
        events("departed", step=manager.current_step(), signal=leaving[0])
        print(
            f"group {group}: departed after step {manager.current_step()} ({leaving[0]})",
            flush=True,
        )
    else:
        events("done", step=manager.current_step(), loss=float(loss))
        print(f"group {group}: done at step {manager.current_step()}", flush=True)
    return DEPARTED_EXIT_CODE if leaving else 0


if __name__ == "__main__":
    sys.exit(main())
