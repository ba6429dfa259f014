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
from gpufleet.lifecycle.core import ControllerCore, log


class SparePool(ControllerCore):
    """``_promote_spares``: one SparePromoted per spare the pool must give up now."""

    _spares_settled: tuple[int, object] | None = None
    """(fleet generation, policy) of the last answer that promoted nobody."""

    def _promote_spares(self, why: str) -> None:
        promoting = self._promoting
        asked = (self.fleet.generation, self.policy)
        if self._spares_settled is not None and (
            self._spares_settled[0] == asked[0] and self._spares_settled[1] is asked[1]
        ):
            return
        chosen = spares.promotions(self.fleet.records.values(), self.effective_policy())
        self._spares_settled = None if chosen else asked
        for name in chosen:
            if name in promoting:
                continue
            promoting.add(name)
            log.info("node=%s promoting the hot spare: %s", name, why)
            task = self._spawn(self.feed(name, ev.SparePromoted(why)), f"promote {name}")
            task.add_done_callback(functools.partial(_forget, promoting, name))


def _forget(promoting: set[str], name: str, _task: object) -> None:
    promoting.discard(name)
