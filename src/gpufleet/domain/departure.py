"""Departure notice: a job that asks for it is told before its node is taken.

A Slurm job opts in with the token ``gpufleet.io/notice`` in its comment
(``sbatch --comment=gpufleet.io/notice``, among other text if it likes). When the
syncer must empty a node it drained (requeue mode ``now``), such a job first gets
SIGUSR1 on its steps (the notice); it finishes the step it is in, leaves its
replica groups' quorum and exits. The syncer requeues it once it has left the
node, or when the grace has passed, whichever comes first: the grace is the most a
notice can delay a requeue. A job without the token is requeued at once, as
before; a ``--no-requeue`` job is reported and left running, as before (it gets
no notice: nothing would bring it back).

The notices sent are kept on the Node (annotation
``gpufleet.io/slurm-notices``, job id and the wall-clock time of the first
notice), written *before* the signal: a syncer restarted between the notice and
the requeue finds them there, sends the notice again (a second SIGUSR1 is the
same notice), and requeues at the same deadline, or at once a job that left
while it was away (docs/decisions/0273). A noticed job that left is requeued even
if the node came back meanwhile (:func:`after_drain`): the notice made it exit.

A job that leaves because of its notice says so by its exit code,
:data:`DEPARTED_EXIT_CODE` (75, ``EX_TEMPFAIL``: try again later); only such a job
is requeued once it left. A noticed job that ended any other way (exit 0: its work is
done; cancelled by its owner; another failure) or whose record Slurm no longer has is
not run again: its notice is dropped (docs/decisions/0279).

Pure: :func:`plan_departure` decides; the syncer carries it out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.domain.slurm_sync import JobView

NOTICE_TOKEN = "gpufleet.io/notice"
"""The word in a job's comment that asks for a departure notice."""

DEFAULT_GRACE_S = 30.0
"""Seconds a noticed job has to leave before it is requeued all the same."""

DEPARTED_EXIT_CODE = 75
"""The exit code of a job that left because of its notice and wants to come back
(``EX_TEMPFAIL``); exit 0 means its work is done."""

_TOKEN = re.compile(r"(?<![\w./-])" + re.escape(NOTICE_TOKEN) + r"(?![\w./-])")


def wants_notice(comment: str | None) -> bool:
    """Whether a job's comment asks for a departure notice (the token as a word of its
    own: ``gpufleet.io/notice``, ``team-a gpufleet.io/notice``, ``x,gpufleet.io/notice``;
    not ``gpufleet.io/notices``)."""
    return bool(comment) and _TOKEN.search(comment or "") is not None


class Outcome(StrEnum):
    """How a noticed job came to be requeued."""

    LEFT = "left"
    """It left the node (its steps ended) before the grace was over."""
    GRACE_EXPIRED = "grace_expired"
    """It was still running when the grace ended."""
    ENDED = "ended"
    """It ended on its own (done, cancelled, failed) or Slurm no longer knows it: not
    requeued, its notice dropped."""


@dataclass(frozen=True, slots=True)
class Ended:
    """Slurm's record of a job that holds no node any more (``/jobs`` keeps it for
    MinJobAge): its base state and, if it exited, its exit code (None: killed by a
    signal, or not given)."""

    state: str
    exit_code: int | None = None

    @property
    def departed(self) -> bool:
        """It left because of its notice: it failed with :data:`DEPARTED_EXIT_CODE`."""
        return self.state == "FAILED" and self.exit_code == DEPARTED_EXIT_CODE


def _left(job_id: int, at: float, ended: Mapping[int, Ended]) -> Requeue:
    """A noticed job no longer running: requeued (LEFT) if it departed, else dropped
    (ENDED: its work done, cancelled, failed otherwise, or purged from Slurm's records;
    a requeue would run finished work again, docs/decisions/0279)."""
    record = ended.get(job_id)
    if record is not None and record.departed:
        return Requeue(job_id, Outcome.LEFT, at)
    return Requeue(job_id, Outcome.ENDED, at)


@dataclass(frozen=True, slots=True)
class Requeue:
    """A job to requeue now; ``outcome`` None: it wanted no notice (requeued at once);
    ENDED: not requeued, only its notice dropped (:attr:`requeues`)."""

    job_id: int
    outcome: Outcome | None = None
    noticed_at: float | None = None

    @property
    def requeues(self) -> bool:
        """Whether ``scontrol requeue`` is owed (not for a job that ended on its own)."""
        return self.outcome is not Outcome.ENDED


@dataclass(frozen=True, slots=True)
class DeparturePlan:
    notice: tuple[int, ...]
    """Jobs to signal now: first notices (to record first), and notices recorded on the
    Node that this syncer process has not sent (it restarted since)."""
    requeue: tuple[Requeue, ...]
    """Jobs to requeue now, each once."""
    waiting: tuple[int, ...]
    """Noticed jobs still running within their grace."""
    unrequeueable: tuple[int, ...]
    """Jobs that must leave but cannot be requeued: reported, never killed."""
    due_at: float | None
    """The earliest end of a grace still running (None: none)."""


def plan_departure(
    jobs: Sequence[JobView],
    notices: Mapping[int, float],
    signalled: Set[int],
    now: float,
    grace_s: float,
    ended: Mapping[int, Ended],
    *,
    seen_at: float,
) -> DeparturePlan:
    """What to do with the running jobs of one node that must be emptied now.

    ``jobs``: the jobs running on the node; ``notices``: the notices recorded for it (job
    id -> wall-clock time of the first notice); ``signalled``: the jobs this process has
    signalled already; ``grace_s`` <= 0 turns notices off (every job requeued at once).
    ``ended``: Slurm's records of jobs that hold no node any more. A recorded job no
    longer running on the node has left it: it is requeued if it departed (exit code
    :data:`DEPARTED_EXIT_CODE`; Slurm requeues a finished batch job), else only its
    notice is dropped (outcome ENDED, :func:`_left`).

    ``seen_at``: when the read that ``jobs`` and ``ended`` come from began (no default:
    ``now`` would be the unsafe one). A noticed job is requeued for its ended grace only
    if that read began after the grace ended: an older one cannot tell a job still running
    from one that finished its work since, and Slurm requeues a finished batch job, which
    would run it again. Until a newer read, it waits (a pass held up behind a slow write
    once acted on a read 24 s old in the simulation, invariant 18).
    """
    notice: list[int] = []
    requeue: list[Requeue] = []
    waiting: list[int] = []
    stuck: list[int] = []
    deadlines: list[float] = []
    running: set[int] = set()
    for job in sorted(jobs, key=lambda j: j.job_id):
        running.add(job.job_id)
        at = notices.get(job.job_id)
        if not job.requeueable:
            stuck.append(job.job_id)
        elif at is not None and seen_at >= at + grace_s:
            requeue.append(Requeue(job.job_id, Outcome.GRACE_EXPIRED, at))
        elif at is not None:
            waiting.append(job.job_id)
            deadlines.append(at + grace_s)
            if job.job_id not in signalled:
                notice.append(job.job_id)
        elif job.wants_notice and grace_s > 0:
            notice.append(job.job_id)
            waiting.append(job.job_id)
            deadlines.append(now + grace_s)
        else:
            requeue.append(Requeue(job.job_id))
    for job_id in sorted(set(notices) - running):
        requeue.append(_left(job_id, notices[job_id], ended))
    return DeparturePlan(
        tuple(notice),
        tuple(requeue),
        tuple(waiting),
        tuple(stuck),
        min(deadlines) if deadlines else None,
    )


def after_drain(
    jobs: Sequence[JobView],
    notices: Mapping[int, float],
    now: float,
    grace_s: float,
    ended: Mapping[int, Ended],
) -> tuple[tuple[Requeue, ...], tuple[int, ...]]:
    """The node is back (our drain went) with notices recorded: ``(requeue, keep)``. The
    noticed jobs that departed are still owed their requeue (the notice made them exit;
    those that ended otherwise are dropped, :func:`_left`); one
    still running within its grace is kept on record (it may be leaving: owed a requeue
    then); one running past its grace is forgotten and keeps running (the node is back)."""
    running = {j.job_id for j in jobs}
    requeue: list[Requeue] = []
    keep: list[int] = []
    for job_id, at in sorted(notices.items()):
        if job_id not in running:
            requeue.append(_left(job_id, at, ended))
        elif now < at + grace_s:
            keep.append(job_id)
    return tuple(requeue), tuple(keep)


def parse_notices(text: str | None) -> dict[int, float]:
    """The Node annotation ``<job>=<epoch seconds>,...``; what does not parse is dropped
    (a hand-edited value costs at most a notice sent again, never a requeue held)."""
    found: dict[int, float] = {}
    for item in (text or "").split(","):
        job, sep, at = item.strip().partition("=")
        if not sep:
            continue
        try:
            found[int(job)] = float(at)
        except ValueError:
            continue
    return found


def format_notices(notices: Mapping[int, float]) -> str | None:
    """The annotation's value (None: remove it)."""
    if not notices:
        return None
    return ",".join(f"{job}={at:.3f}" for job, at in sorted(notices.items()))
