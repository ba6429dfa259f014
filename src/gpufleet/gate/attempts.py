"""Which act a lifecycle record has in progress (pure): the binding every act is checked against."""

from __future__ import annotations

from gpufleet.domain.ladder import Step
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


def network_boot_may_be_starting(record: NodeRecord | None) -> bool:
    """Whether the record is verifying a reimage (its last ladder step).

    A real BMC reports the machine on at once after a reset, but its firmware reads
    the one-time network boot only at its power-on self-test, a minute or more later.
    Until verification ends the override may be what the machine is about to boot
    from: removing it then would boot the old disk, a reimage silently not done. Once
    verification ended (the agent answered from a booted machine, or the ladder moved
    on), an override still armed was never used and is removed (decision 0177).
    """
    if record is None or record.state is not NodeState.VERIFYING:
        return False
    inc = record.incident
    return inc is not None and bool(inc.tried) and inc.tried[-1].step is Step.REIMAGE
