"""The agent's reader of job telemetry: is this node a straggler in a job?

Jobs write one line per rank per step under a shared directory (the format
and the decision are in :mod:`gpufleet.domain.stragglers`). Each poll, the
agent

1. lists the run directories (``<job>.<run>``) and, in those whose listing
   changed, the rank files: their names say which nodes are in the run;
2. for each live run that has a rank on this node, reads what was appended,
   since the agent started, to its own rank files and to those of a bounded
   sample of peer nodes (only whole lines: a rank may be half-way through
   writing one);
3. compares this node with its peers over the newest complete steps
   (:func:`~gpufleet.domain.stragglers.compare_nodes`) and, when it is a
   straggler and a report is due, returns a ``straggler`` fault for the agent
   to judge with the policy like any other.

4. in replica-group trainings (lines with ``group``), votes on the groups' weights
   fingerprints at the newest step every live rank it reads has written
   (:mod:`gpufleet.domain.sdc_vote`): when the majority names this node, it
   returns an ``sdc-mismatch`` fault (at most every :attr:`JobTelemetry.sdc_report_every_s`
   per run); when no majority vouches for it, or its group's loss or gradient
   norm stands out, it asks the agent to run the active SDC check now
   (:meth:`JobTelemetry.take_suspicions`: once per run and step, at most every
   :attr:`JobTelemetry.check_every_s`), whose result reports or clears.

Each agent judges only itself, so it is the only writer of its own condition.
A run whose files have not grown for :attr:`JobTelemetry.idle_s` has ended:
its samples are dropped (its read offsets kept, so nothing old is read
again), and samples older than that are history, never reported. A run
directory that cannot be read is skipped, never fatal.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.domain import sdc_vote, stragglers
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.policy import Stragglers

log = logging.getLogger(__name__)

MAX_READ = 1 << 20
"""Bytes read from one rank file per poll (a reader far behind catches up over polls)."""


@dataclass
class _Rank:
    path: Path
    samples: deque[stragglers.StepSample]
    """The newest samples (bounded: twice the comparison window)."""
    offset: int = 0
    partial: bytes = b""


@dataclass
class _Run:
    dir_mtime: float = -1.0
    nodes: dict[str, list[Path]] = field(default_factory=dict)
    ranks: dict[Path, _Rank] = field(default_factory=dict)
    grew_at: float = 0.0
    last_report: float | None = None
    voted_step: int = -1
    """The newest step whose fingerprints were voted on (each step is judged once)."""
    sdc_report: float | None = None
    loss_step: int = -1
    """The newest step at which this node's group stood out (each is judged once)."""
    check_asked: float | None = None


class JobTelemetry:
    """Straggler detection for one node from the job telemetry under ``root``."""

    def __init__(
        self,
        root: Path,
        node: str,
        config: Stragglers,
        *,
        idle_s: float = 600.0,
        sdc_report_every_s: float = 600.0,
        check_every_s: float = 300.0,
        loss_rule: sdc_vote.LossRule | None = None,
    ) -> None:
        self.root = Path(root)
        self.node = node
        self.config = config
        self.idle_s = idle_s
        self.sdc_report_every_s = sdc_report_every_s
        """While the vote keeps naming this node in a run, one report per this many seconds
        (the first takes the node out under the default policy; repeats are only news)."""
        self.check_every_s = check_every_s
        """At most one active SDC check per run per this many seconds (a suspicion that
        persists over steps does not run the check at every step)."""
        self.loss_rule = loss_rule or sdc_vote.LossRule()
        self._suspicions: list[str] = []
        self._runs: dict[str, _Run] = {}
        self._first_poll = True
        self.paces: dict[str, stragglers.NodePace] = {}
        """Per live run, this node's latest comparison with its peers."""

    def poll(self, now: float) -> list[FaultEvent]:
        """Read what is new; a ``straggler`` fault per run where this node is slow and due."""
        history, self._first_poll = self._first_poll, False
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return []  # no telemetry yet (no job has written any)
        faults: list[FaultEvent] = []
        live: set[str] = set()
        for entry in entries:
            if not stragglers.RUN_DIR.match(entry.name):
                continue
            live.add(entry.name)
            run = self._runs.setdefault(entry.name, _Run(grew_at=now))
            try:
                self._refresh(run, Path(entry.path), entry.stat().st_mtime, history=history)
            except OSError as exc:
                log.debug("telemetry %s unreadable: %s", entry.path, exc)
                continue
            if self.node not in run.nodes:
                continue
            if self._read(run, now):
                fault = self._judge(entry.name, run, now)
                if fault is not None:
                    faults.append(fault)
                fault = self._judge_sdc(run, now)
                if fault is not None:
                    faults.append(fault)
        for name, run in list(self._runs.items()):
            if name not in live:  # removed by whoever cleans the telemetry directory
                del self._runs[name]
                self.paces.pop(name, None)
            elif now - run.grew_at > self.idle_s:  # ended: keep the offsets, not the samples
                for rank in run.ranks.values():
                    rank.samples.clear()
                run.voted_step = run.loss_step = -1  # a training of that name may start again
                self.paces.pop(name, None)
        return faults

    def _refresh(self, run: _Run, path: Path, mtime: float, *, history: bool) -> None:
        """List the run's rank files when the directory changed (a rank started).

        What is there at the agent's first look is history: it may predate a
        repair of this node (the agent restarts when the node reboots), so it is
        skipped, and only what the job writes from then on is judged.
        """
        if mtime == run.dir_mtime:
            return
        nodes: dict[str, list[Path]] = {}
        for f in os.scandir(path):
            node = stragglers.node_of_rank_file(f.name)
            if node is not None:
                nodes.setdefault(node, []).append(Path(f.path))
        run.nodes, run.dir_mtime = nodes, mtime
        wanted = (
            [self.node, *stragglers.peers_to_read(self.node, nodes)] if self.node in nodes else []
        )
        paths = {p for n in wanted for p in nodes.get(n, [])}
        keep = 2 * self.config.window_steps + 8
        run.ranks = {p: run.ranks.get(p) or _new_rank(p, keep, history) for p in paths}

    def _read(self, run: _Run, now: float) -> bool:
        """Append new whole lines of the wanted rank files; whether anything was new."""
        grew = False
        for rank in run.ranks.values():
            try:
                with rank.path.open("rb") as f:
                    f.seek(rank.offset)
                    data = f.read(MAX_READ)
            except OSError:
                continue
            if not data:
                continue
            rank.offset += len(data)
            *lines, rank.partial = (rank.partial + data).split(b"\n")
            for line in lines:
                sample = stragglers.parse_sample(line.decode("utf-8", "replace"))
                if sample is not None:
                    rank.samples.append(sample)
            grew = True
        if grew:
            run.grew_at = now
        return grew

    def slowdown(self) -> float:
        """This node's worst slowdown over its live jobs (0: no comparison yet)."""
        return max((p.slowdown for p in self.paces.values()), default=0.0)

    def _judge(self, run_id: str, run: _Run, now: float) -> FaultEvent | None:
        samples = [s for r in run.ranks.values() for s in r.samples]
        if not samples or now - max(s.at for s in samples) > self.idle_s:
            return None  # history (an agent started after the run ended), not news
        rule = self.config.rule()
        mine = next(
            (
                p
                for p in stragglers.compare_nodes(samples, rule.window_steps)
                if p.node == self.node
            ),
            None,
        )
        if mine is None:
            self.paces.pop(run_id, None)
            return None
        self.paces[run_id] = mine
        due = stragglers.due(run.last_report, now, self.config.report_every_seconds)
        if not stragglers.is_straggler(mine, rule) or not due:
            return None
        run.last_report = now
        return FaultEvent(
            FaultKind.STRAGGLER,
            self.node,
            now,
            evidence=Evidence(
                counters={
                    "slowdown": round(mine.slowdown, 3),
                    "compute_s": round(mine.compute_s, 4),
                    "peers_s": round(mine.peers_s, 4),
                },
                message=mine.describe(),
            ),
        )

    def take_suspicions(self) -> list[str]:
        """Why the active SDC check should run now (empty: no reason); each reason once."""
        found, self._suspicions = self._suspicions, []
        return found

    def _judge_sdc(self, run: _Run, now: float) -> FaultEvent | None:
        """The replica groups' vote at the newest step they all wrote, and their losses:
        an ``sdc-mismatch`` fault when the vote names this node; a suspicion (the check
        runs) when no majority vouches for it or its group's loss stands out."""
        samples = [s for r in run.ranks.values() for s in r.samples if s.group is not None]
        if not samples or now - max(s.at for s in samples) > self.idle_s:
            return None
        fault = None
        step = sdc_vote.vote_step(samples)
        if step is not None and step > run.voted_step:
            run.voted_step = step
            verdict = sdc_vote.vote(step, samples)
            mine = verdict.suspect(self.node)
            if mine is not None and stragglers.due(run.sdc_report, now, self.sdc_report_every_s):
                run.sdc_report = now
                fault = _mismatch(self.node, samples[0].job, step, mine, now)
            elif mine is None and self.node in verdict.to_check:
                self._suspect(
                    run,
                    now,
                    f"training {samples[0].job} step {step}: {verdict.groups} replica groups "
                    "hold different weights and no majority of them agrees",
                )
        newest = max(s.step for s in samples)
        recent = [s for s in samples if s.step > newest - 2 * self.loss_rule.window_steps]
        for out in sdc_vote.loss_outliers(recent, self.loss_rule):
            if self.node in out.nodes and out.last_step > run.loss_step:
                run.loss_step = out.last_step
                self._suspect(
                    run,
                    now,
                    f"training {samples[0].job}: group {out.group}'s {out.metric} stood out "
                    f"at {out.steps} step(s), {out.value:.4g} vs. the groups' median "
                    f"{out.median:.4g} at step {out.last_step}",
                )
        return fault

    def _suspect(self, run: _Run, now: float, why: str) -> None:
        if stragglers.due(run.check_asked, now, self.check_every_s):
            run.check_asked = now
            self._suspicions.append(why)


def _mismatch(node: str, training: str, step: int, s: sdc_vote.Suspect, now: float) -> FaultEvent:
    """The ``sdc-mismatch`` fault of a node the vote named."""
    witnesses = "ranks of its own group" if s.within_group else "replica groups"
    gpus = ", ".join(str(g) for g in s.gpus) or "not reported"
    return FaultEvent(
        FaultKind.SDC_MISMATCH,
        node,
        now,
        evidence=Evidence(
            gpu_index=s.gpus[0] if len(s.gpus) == 1 else None,
            counters={"step": step, "agreeing": s.agreeing, "witnesses": s.witnesses},
            message=(
                f"training {training} step {step}: group {s.group} holds weights "
                f"{s.fingerprint}, {s.agreeing} of {s.witnesses} {witnesses} hold "
                f"{s.expected}; GPU {gpus}"
            ),
        ),
    )


def _new_rank(path: Path, keep: int, history: bool) -> _Rank:
    offset = 0
    if history:
        with contextlib.suppress(OSError):
            offset = path.stat().st_size
    return _Rank(path, deque(maxlen=keep), offset=offset)
