"""Which act a lifecycle record has in progress (pure): the binding every act is checked against."""

from __future__ import annotations

from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.remediate.steps import BMC_STEPS, Attempt


def attempt_in_progress(record: NodeRecord | None) -> Attempt | None:
    """The ladder step attempt the record says is in progress (any step), or None."""
    if record is None:
        return None
    inc = record.incident
    if record.state is not NodeState.REMEDIATING or inc is None or not inc.tried:
        return None
    last = inc.tried[-1]
    if inc.current is None or last.step != inc.current or last.ended_at is not None:
        return None
    return Attempt(last.step, last.attempt, last.started_at)


def bmc_attempt_in_progress(record: NodeRecord | None) -> Attempt | None:
    """The same, for a step that goes through the node's BMC."""
    attempt = attempt_in_progress(record)
    return attempt if attempt is not None and attempt.step in BMC_STEPS else None
