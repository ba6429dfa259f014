"""The example training job's checkpoint/resume logic and its numpy all-reduce (no Slurm)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpufleet.local.processes import free_ports

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "slurm-ddp" / "train.py"
spec = importlib.util.spec_from_file_location("ddp_train", EXAMPLE)
assert spec and spec.loader
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)


def test_checkpoints_are_atomic_and_latest_wins(tmp_path: Path) -> None:
    assert train.latest_checkpoint(tmp_path) is None
    for step in (5, 10, 15, 20):
        train.save_checkpoint(tmp_path, step, [float(step)] * 3, keep=2)
    (tmp_path / ".step-00000025.json.tmp").write_text("{half")
    (tmp_path / "step-00000030.json").write_text("{broken")
    latest = train.latest_checkpoint(tmp_path)
    assert latest == {"step": 20, "weights": [20.0] * 3}
    assert sorted(p.name for p in tmp_path.glob("step-0*.json"))[:2] == [
        "step-00000015.json",
        "step-00000020.json",
    ]


def run_ranks(tmp_path: Path, steps: int, port: int, backend: str = "numpy") -> None:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--ckpt-dir",
                str(tmp_path),
                "--steps",
                str(steps),
                "--every",
                "5",
                "--step-time",
                "0",
                "--backend",
                backend,
            ],
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for r in range(2)
    ]
    assert [p.wait(60) for p in procs] == [0, 0]


def test_two_ranks_train_and_resume_from_the_checkpoint(tmp_path: Path) -> None:
    first, second = free_ports(2)
    run_ranks(tmp_path, 12, first)
    assert train.latest_checkpoint(tmp_path)["step"] == 12
    run_ranks(tmp_path, 20, second)
    log = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    starts = [e["step"] for e in log if e["kind"] == "start"]
    assert starts == [0, 12]
    steps = [e["step"] for e in log if e["kind"] == "step"]
    assert steps == list(range(1, 21))
    w = np.array(train.latest_checkpoint(tmp_path)["weights"])
    x, y = train.shard(0, 1)
    assert train.gradient(w, x, y)[1] < train.gradient(np.zeros_like(w), x, y)[1]


def test_two_torch_ranks_leave_the_process_group_and_exit_cleanly(tmp_path: Path) -> None:
    """Each rank must exit 0: Slurm fails a job whose task aborted at exit."""
    (port,) = free_ports(1)
    run_ranks(tmp_path, 6, port, backend="torch")
    log = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in log][-1] == "done"
    assert {e["backend"] for e in log if e["kind"] == "start"} == {"torch"}


def test_rendezvous_port_differs_between_clusters_jobs_and_requeues() -> None:
    """Two local clusters both start at job 1: their jobs must not meet on one port."""
    a = train.rendezvous_port(1, 0, "/tmp/cluster-a/slurm.conf")
    b = train.rendezvous_port(1, 0, "/tmp/cluster-b/slurm.conf")
    again = train.rendezvous_port(1, 1, "/tmp/cluster-a/slurm.conf")
    assert len({a, b, again}) == 3
    assert all(20000 <= p < 32000 for p in (a, b, again))  # below the ephemeral range
    assert a == train.rendezvous_port(1, 0, "/tmp/cluster-a/slurm.conf")
