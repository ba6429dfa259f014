"""The hot spare pool: promote spares the moment a node of their pool leaves production.

Which spares step in is the domain's choice (:func:`gpufleet.domain.spares.promotions`,
the same the simulator makes); here each chosen spare gets a ``SparePromoted`` event
through the ordinary node pass, so the promotion is recorded on its Node (record,
``gpufleet.io/spare`` label and taint removed in one guarded write) before the Slurm
syncer, watching the label, resumes it. A promotion already under way is not
started twice; the periodic tick asks again, so one lost to a conflict or a
restart is made on the next tick. The answer depends only on the records and the
policy: when neither changed since an answer that promoted nobody, the tick does
not ask again (a pass over every record, docs/decisions/0113).
"""

from __future__ import annotations

import functools

from gpufleet.domain import events as ev
from gpufleet.domain import spares
from gpufleet.lifecycle.core import Feed, log
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.lifecycle.tasks import TaskGroup


class SparePool:
    """``promote``: one SparePromoted per spare the pool must give up now."""

    def __init__(
        self, *, fleet: Fleet, policies: PolicyKeeper, feed: Feed, tasks: TaskGroup
    ) -> None:
        self.fleet = fleet
        self.policies = policies
        self.feed = feed
        self.tasks = tasks
        self._promoting: set[str] = set()
        """Hot spares whose promotion is under way."""
        self._spares_settled: tuple[int, object] | None = None
        """(fleet generation, policy) of the last answer that promoted nobody."""

    def promote(self, why: str) -> None:
        promoting = self._promoting
        asked = (self.fleet.generation, self.policies.policy)
        if self._spares_settled is not None and (
            self._spares_settled[0] == asked[0] and self._spares_settled[1] is asked[1]
        ):
            return
        chosen = spares.promotions(self.fleet.records.values(), self.policies.effective())
        self._spares_settled = None if chosen else asked
        for name in chosen:
            if name in promoting:
                continue
            promoting.add(name)
            log.info("node=%s promoting the hot spare: %s", name, why)
            task = self.tasks.spawn(self.feed(name, ev.SparePromoted(why)), f"promote {name}")
            task.add_done_callback(functools.partial(_forget, promoting, name))


def _forget(promoting: set[str], name: str, _task: object) -> None:
    promoting.discard(name)
