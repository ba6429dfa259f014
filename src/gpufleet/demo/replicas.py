"""Running the replica-group example (``examples/torchft-replicas``) on one machine:
its lighthouse and its groups as processes on 127.0.0.1.

The demo runs the groups as Slurm jobs (:mod:`gpufleet.demo.replica_scenarios`)
and the process-level tests run them directly; both start the lighthouse here
(torchft's ``torchft_lighthouse``, bound to 127.0.0.1) and read the groups' log
with :mod:`gpufleet.demo.replica_events`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpufleet.demo.replica_events import ReplicaEvent, read_events
from gpufleet.local.processes import free_ports

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchft-replicas"
TRAIN_PY = EXAMPLE / "train.py"

HEARTBEAT_TIMEOUT_MS = 1000
"""A group that stopped heartbeating leaves the quorum after this long (torchft's
default is 5 s; the demo's groups share one machine, so 1 s is plenty)."""
JOIN_TIMEOUT_MS = 3000
"""How long a quorum waits for a heartbeating group that has not asked to join yet."""


@dataclass
class Lighthouse:
    """torchft's lighthouse as a process on 127.0.0.1 (restartable on the same port)."""

    port: int
    log: Path
    min_replicas: int = 1
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = Path(sys.executable).parent / "torchft_lighthouse"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--min_replicas",
                    str(self.min_replicas),
                    "--heartbeat_timeout_ms",
                    str(HEARTBEAT_TIMEOUT_MS),
                    "--join_timeout_ms",
                    str(JOIN_TIMEOUT_MS),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@contextmanager
def lighthouse(log: Path) -> Iterator[Lighthouse]:
    (port,) = free_ports(1)
    lh = Lighthouse(port=port, log=log)
    lh.start()
    try:
        yield lh
    finally:
        lh.kill()


@dataclass
class Groups:
    """Replica groups of one training as processes on this machine."""

    lighthouse: Lighthouse
    workdir: Path
    step_time_s: float = 0.1
    steps: int = 100_000
    extra_env: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.events_path = self.workdir / "events.jsonl"

    def start(self, index: int, *args: str, node: str = "") -> subprocess.Popen[bytes]:
        """Start group ``g<index>`` (replacing a finished process of the same group)."""
        group = f"g{index}"
        log = self.workdir / f"{group}.log"
        env = {
            **os.environ,
            **(self.extra_env or {}),
            "TORCHFT_LIGHTHOUSE": self.lighthouse.address,
        }
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(TRAIN_PY),
                    "--group",
                    str(index),
                    "--events",
                    str(self.events_path),
                    "--steps",
                    str(self.steps),
                    "--step-time",
                    str(self.step_time_s),
                    "--host",
                    "127.0.0.1",
                    "--node",
                    node or f"node-{index}",
                    *args,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs[group] = proc
        return proc

    def events(self) -> list[ReplicaEvent]:
        return read_events(self.events_path)

    def wait_for(
        self, what: str, cond: Callable[[list[ReplicaEvent]], bool], timeout_s: float = 120
    ) -> list[ReplicaEvent]:
        """Poll the events until ``cond`` holds; fail naming ``what`` and the group logs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            events = self.events()
            if cond(events):
                return events
            time.sleep(0.1)
        tails = {
            g: (self.workdir / f"{g}.log").read_text(errors="replace")[-1500:] for g in self.procs
        }
        raise TimeoutError(f"{what} within {timeout_s:.0f} s; group logs: {tails}")

    def signal(self, group: str, sig: signal.Signals) -> None:
        self.procs[group].send_signal(sig)

    def stop(self, timeout_s: float = 30) -> dict[str, int | None]:
        """SIGTERM every group still running (each leaves at a step boundary and exits 75,
        docs/decisions/0279); exit codes."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for group, proc in self.procs.items():
            try:
                codes[group] = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                codes[group] = None
        return codes
