"""The demo's replica-group scenarios: a torchft training of three groups (one Slurm job
each, ``examples/torchft-replicas/train.sbatch``) and its lighthouse on the local cluster.

``replica-groups``: a fault under one group's node; gpufleet drains the node and requeues
the group's job (after a departure notice, when the syncer gives one; otherwise the
requeue's SIGTERM is the notice); the group leaves at a step boundary, the other two
keep training; the requeued job starts on the fourth, idle node and copies the weights
from a live peer. ``silent-corruption``: one bit of one group's weights flips on its
node's simulated GPU; the node's agent compares the groups' weight fingerprints and
reports ``sdc-mismatch`` on that node.

Both measure from the groups' own log (:mod:`gpufleet.demo.replica_events`).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufleet.demo import job, kube
from gpufleet.demo.replica_events import (
    ReplicaEvent,
    checkpoint_blocking,
    first_step_in_quorum,
    last_step,
    of,
    read_events,
    survivor_gap,
)
from gpufleet.demo.replicas import EXAMPLE, TRAIN_PY, Lighthouse
from gpufleet.demo.timeline import StepMissed
from gpufleet.lifecycle import goodput
from gpufleet.local.processes import free_ports

if TYPE_CHECKING:
    from gpufleet.demo.scenarios import Ctx

TRAINING = "replicas"
GROUPS = ("g0", "g1", "g2")
STEP_TIME_S = 0.2
CKPT_EVERY = 10


@dataclass
class ReplicaRun:
    """One replica-group training on the demo's cluster."""

    ctx: Ctx
    lighthouse: Lighthouse

    def __post_init__(self) -> None:
        self.jobs: dict[str, int] = {}
        self.events_path = self.ctx.workdir / "events.jsonl"

    def submit(self, index: int) -> int:
        workdir = self.ctx.workdir
        env = {
            **self.ctx.fleet.job_env(),
            "TORCHFT_LIGHTHOUSE": self.lighthouse.address,
            "GPUFLEET_TRAINING": TRAINING,
            "GPUFLEET_REPLICA_HOST": "127.0.0.1",
            "EVENTS": str(self.events_path),
            "GROUP": str(index),
            "TRAIN_PY": str(TRAIN_PY),
            "STEPS": "100000",
            "STEP_TIME": str(STEP_TIME_S),
            "CKPT_DIR": str(workdir / "ckpt"),
            "CKPT_EVERY": str(CKPT_EVERY),
        }
        job_id = job.sbatch(
            self.ctx.fleet.info,
            EXAMPLE / "train.sbatch",
            workdir,
            env,
            f"--job-name={TRAINING}",
        )
        self.jobs[f"g{index}"] = job_id
        return job_id

    def events(self) -> list[ReplicaEvent]:
        return read_events(self.events_path)

    def until(
        self, what: str, cond: Callable[[list[ReplicaEvent]], bool], timeout: float
    ) -> list[ReplicaEvent]:
        """Keep the timeline going until the groups' log shows ``cond``."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.events()
            if cond(events):
                return events
            if time.monotonic() > deadline:
                raise StepMissed(what, timeout, "the training's groups", self.events_path)
            self.ctx.tl.poll()
            time.sleep(0.2)

    def node_of(self, group: str) -> str:
        return of(self.events(), "start", group)[-1].node

    def cancel(self) -> None:
        if self.jobs:
            subprocess.run(
                ["scancel", *map(str, self.jobs.values())],
                env=self.ctx.fleet.info.slurm_env(),
                capture_output=True,
                timeout=30,
            )


@contextmanager
def training(ctx: Ctx) -> Iterator[ReplicaRun]:
    """The lighthouse and three groups, all in one quorum; cancelled at the end."""
    (port,) = free_ports(1)
    lh = Lighthouse(port=port, log=ctx.log("lighthouse"))
    lh.start()
    ctx.tl.note("demo", f"torchft lighthouse on {lh.address} (log lighthouse.log)")
    run = ReplicaRun(ctx, lh)
    try:
        for i in range(len(GROUPS)):
            job_id = run.submit(i)
            ctx.tl.note(
                "demo",
                f"sbatch examples/torchft-replicas/train.sbatch (GROUP={i}, "
                f"--comment=gpufleet.io/notice, --requeue) -> job {job_id}",
            )
        events = run.until(
            "the three groups training in one quorum",
            lambda ev: all(first_step_in_quorum(ev, g, 0, len(GROUPS)) for g in GROUPS),
            150,
        )
        where = ", ".join(f"{g} on {of(events, 'start', g)[-1].node}" for g in GROUPS)
        ctx.tl.note("demo", f"training {TRAINING}: three groups in one quorum ({where})")
        yield run
    finally:
        run.cancel()
        lh.kill()


def replica_groups(ctx: Ctx) -> None:
    with training(ctx) as run:
        victim = "g1"
        node = run.node_of(victim)
        run.until(
            "a checkpoint",
            lambda ev: bool(of(ev, "checkpoint")) and last_step(ev, victim) > CKPT_EVERY + 2,
            60,
        )
        fault = ctx.inject(node, "xid=79,gpu=3", f"XID 79 under group {victim}'s job")
        requeue = ctx.wait(
            "job-requeued",
            f"group {victim}'s job requeued",
            "syncer",
            60,
            match=lambda e: e.data.get("job") == run.jobs[victim],
        )
        events = run.until(
            f"group {victim} training again in a quorum of three",
            lambda ev: first_step_in_quorum(ev, victim, requeue.t, len(GROUPS)) is not None,
            120,
        )
        rejoin = first_step_in_quorum(events, victim, requeue.t, len(GROUPS))
        assert rejoin is not None
        start = next(e for e in of(events, "start", victim) if e.t >= requeue.t)
        departed = [e for e in of(events, "departed", victim) if e.t >= fault.t]
        gaps = [survivor_gap(events, g, fault.t, rejoin.t) for g in GROUPS if g != victim]
        blocking = checkpoint_blocking(events)
        f = ctx.figures
        f["faulty"] = node
        f["replacement_node"] = start.node
        f["departed_at_step_boundary"] = bool(departed)
        f["survivors_steps_lost"] = max(g.steps_lost + g.gap_steps for g in gaps)
        f["survivors_gap_s"] = max(g.gap_s for g in gaps)
        f["rejoin_s"] = rejoin.t - requeue.t
        f["recovered_from"] = start.recovered_from
        f["checkpoint_blocking_ms"] = 1000 * statistics.median(blocking) if blocking else None
        how = (
            f"left at a step boundary after step {departed[0].step}"
            if departed
            else "was stopped mid-step"
        )
        ctx.tl.note(
            "demo",
            f"{victim} {how}; requeued, it started on {start.node} at step {start.step} "
            f"({start.recovered_from}) and trained in a quorum of three "
            f"{f['rejoin_s']:.1f} s after the requeue; the survivors lost "
            f"{f['survivors_steps_lost']} steps (longest step gap {f['survivors_gap_s']:.1f} s)",
        )
        ctx.recovery(node, fault, reset="GracefulRestart", agent_step=None)
        _ledger(ctx)


def _ledger(ctx: Ctx) -> None:
    """The goodput ledger of the training (docs/goodput.md): its telemetry against the
    cluster's NodeRemediations."""
    docs = ctx.fleet.api.get(f"{kube.GV}/noderemediations").get("items") or []
    led = goodput.compute(ctx.fleet.telemetry_dir, docs)
    row = next((t for t in led.trainings if t.training == TRAINING), None)
    if row is None:
        return
    lost = {k: round(v, 1) for k, v in row.lost.items() if v > 0}
    ctx.figures["goodput"] = row.goodput
    ctx.figures["ledger_lost"] = lost
    ctx.tl.note(
        "demo",
        f"goodput ledger: training {TRAINING} {row.goodput:.1%} of "
        f"{row.allocated:.0f} GPU-seconds; lost {lost or 'nothing'}",
    )


def silent_corruption(ctx: Ctx) -> None:
    with training(ctx) as run:
        victim = "g2"
        node = run.node_of(victim)
        flip_at = last_step(run.events(), victim) + 10
        fault = ctx.inject(
            node,
            f"sdc-silent,gpu=0,step={flip_at}",
            f"GPU 0 will flip one bit of group {victim}'s weights after step {flip_at} "
            "(silent: no error anywhere)",
        )
        cond = ctx.agent_condition(
            node, f"the agent finding {victim}'s weights diverged on {node}", fault.t, 90
        )
        events = run.events()
        reported_at = max(
            (e.step for e in of(events, "step", victim) if e.t <= cond.t), default=flip_at
        )
        ctx.figures["faulty"] = node
        ctx.figures["flip_step"] = flip_at
        ctx.figures["steps_to_report"] = reported_at - flip_at
        ctx.figures["detect_s"] = cond.t - next(
            (e.t for e in of(events, "step", victim) if e.step == flip_at), fault.t
        )
        ctx.tl.note(
            "demo",
            f"bit flipped after step {flip_at}; {node} reported at step {reported_at} "
            f"({reported_at - flip_at} step(s) after the flip)",
        )
        ctx.wait("cordon", f"{node} cordoned and tainted", "controller", 30, node=node)
