"""The syncer's departure notices: SIGUSR1 before a requeue, for the jobs that ask.

:func:`gpufleet.domain.departure.plan_departure` decides; this carries it out for one
node the syncer drained and must empty now (:meth:`Syncer._requeue
<gpufleet.slurm.syncer.Syncer._requeue>`):

1. a first notice is **recorded on the Node** (annotation
   ``gpufleet.io/slurm-notices``) and only then **sent** (``scancel --signal=USR1``,
   the job's steps): a notice the syncer cannot remember is not sent (fail closed:
   the job is then noticed on a later pass, its requeue at most a grace later);
2. notices recorded but not sent by this process (it restarted) are sent again;
3. once a noticed job is requeued (or Slurm refuses: it is pending or gone) its entry
   is removed; when the syncer's drain goes, the whole record goes.

The grace runs on the wall clock (it survives a restart); a notice delays a requeue by
at most ``notice_grace_s``, plus one poll.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from gpufleet.clock import Clock
from gpufleet.domain import departure, slurm_sync, well_known
from gpufleet.slurm import nodes as kn
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmError
from gpufleet.slurm.metrics import SyncerMetrics
from gpufleet.slurm.ports import ScontrolPort

log = logging.getLogger("gpufleet.slurm.syncer")

NOTICE_SIGNAL = "USR1"


class Departures:
    """Notices sent and recorded, for the syncer's nodes (one per syncer)."""

    def __init__(
        self,
        *,
        nodes: Callable[[], Mapping[str, dict[str, Any]]],
        patch_node: Callable[[str, Mapping[str, Any]], Awaitable[None]],
        scontrol: ScontrolPort,
        metrics: SyncerMetrics,
        clock: Clock,
        grace_s: float,
        dry_run: bool,
    ) -> None:
        self._nodes = nodes
        self._patch_node = patch_node
        self._scontrol = scontrol
        self._metrics = metrics
        self._clock = clock
        self.grace_s = grace_s
        self._dry_run = dry_run
        self.signalled: set[int] = set()
        """Jobs this process has sent a notice to (a restart forgets: it sends again)."""

    def recorded(self, name: str) -> dict[int, float]:
        node = self._nodes().get(name) or {}
        return departure.parse_notices(
            kn.annotations_of(node).get(well_known.ANNOTATION_SLURM_NOTICES)
        )

    async def _record(self, name: str, notices: Mapping[int, float]) -> None:
        text = departure.format_notices(notices)
        await self._patch_node(
            name, {"metadata": {"annotations": {well_known.ANNOTATION_SLURM_NOTICES: text}}}
        )
        node = self._nodes().get(name)
        if node is not None:
            annotations = node.setdefault("metadata", {}).setdefault("annotations", {})
            if text is None:
                annotations.pop(well_known.ANNOTATION_SLURM_NOTICES, None)
            else:
                annotations[well_known.ANNOTATION_SLURM_NOTICES] = text

    async def plan(
        self,
        name: str,
        jobs: Sequence[slurm_sync.JobView],
        ended: Mapping[int, departure.Ended],
        seen_at: float,
    ) -> departure.DeparturePlan:
        """Decide for ``name``'s running ``jobs`` (``ended``: Slurm's records of jobs
        that hold no node any more; ``seen_at``: when the read they come from began) and
        send the notices the plan wants (recorded first). The plan's requeues are the
        caller's to carry out."""
        notices = self.recorded(name)
        now = self._clock.now()
        plan = departure.plan_departure(
            jobs, notices, self.signalled, now, self.grace_s, ended, seen_at=seen_at
        )
        if not plan.notice:
            return plan
        if self._dry_run:
            log.info(
                "node=%s would send a departure notice to jobs %s [dry run]", name, plan.notice
            )
            return plan
        first = {j: now for j in plan.notice if j not in notices}
        if first:
            await self._record(name, {**notices, **first})  # ApiError: nothing sent
        for job in plan.notice:
            try:
                await self._scontrol.signal_steps(job, NOTICE_SIGNAL)
            except SlurmCommandFailed as e:
                # Its steps are gone already (it is leaving): it counts as told.
                log.info("node=%s job=%d notice refused: %s", name, job, e)
            except SlurmError as e:
                self._metrics.slurm_errors.labels(op="notice").inc()
                log.warning(
                    "node=%s job=%d notice not sent (sent again next pass): %s", name, job, e
                )
                continue
            else:
                self._metrics.notices.inc()
            self.signalled.add(job)
            at = first.get(job, notices.get(job, now))
            log.info(
                "node=%s job=%d departure notice sent (SIG%s; requeued when it leaves, at the "
                "latest %.0f s after the first notice)%s",
                name,
                job,
                NOTICE_SIGNAL,
                self.grace_s,
                "" if job in first else f" again, first at {at:.3f}",
            )
        return plan

    async def requeued(self, name: str, done: Sequence[departure.Requeue]) -> None:
        """``done`` left the node (requeued, refused by Slurm, or ended on their own and
        not requeued): their notices end."""
        noticed = [r for r in done if r.outcome is not None]
        if not noticed:
            return
        now = self._clock.now()
        for r in noticed:
            assert r.outcome is not None
            self.signalled.discard(r.job_id)
            waited = max(0.0, now - (r.noticed_at or now))
            self._metrics.notice_seconds.labels(outcome=r.outcome.value).observe(waited)
            log.info(
                "node=%s job=%d %s after its notice: %s after %.1f s",
                name,
                r.job_id,
                "requeued" if r.requeues else "not requeued (it ended on its own)",
                r.outcome.value,
                waited,
            )
        notices = self.recorded(name)
        left = {j: at for j, at in notices.items() if j not in {r.job_id for r in noticed}}
        if left != notices and not self._dry_run:
            await self._record(name, left)

    def owed(
        self,
        name: str,
        jobs: Sequence[slurm_sync.JobView],
        ended: Mapping[int, departure.Ended],
    ) -> tuple[tuple[departure.Requeue, ...], tuple[int, ...]]:
        """Our drain is gone: the noticed jobs that left, still to be requeued (or
        dropped: they ended on their own), and the noticed jobs running within their
        grace, kept on record (:func:`~gpufleet.domain.departure.after_drain`)."""
        notices = self.recorded(name)
        return departure.after_drain(jobs, notices, self._clock.now(), self.grace_s, ended)

    async def forget(self, name: str, kept: Sequence[int]) -> None:
        """Our drain is gone: the node's record of notices goes, but for ``kept`` (jobs
        owed a requeue that Slurm did not answer, tried again next pass; jobs still
        within their grace)."""
        notices = self.recorded(name)
        keep = {j: notices[j] for j in kept if j in notices}
        if notices != keep and not self._dry_run:
            await self._record(name, keep)
            for job in set(notices) - set(keep):
                self.signalled.discard(job)
            log.info("node=%s back from our drain: departure notices forgotten", name)
