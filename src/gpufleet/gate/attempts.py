"""Which act a lifecycle record has in progress (pure): the binding every act is checked against."""

from __future__ import annotations

from gpufleet.domain.ladder import Step
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.remediate.evidence import ActionMark, ResetEvidence, reset_since
from gpufleet.remediate.steps import BMC_STEPS, NETWORK_BOOT, Attempt


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


def network_boot_may_be_read(
    mark: ActionMark | None,
    armed: str | None,
    seen: ResetEvidence,
    *,
    now: float,
    window_s: float,
) -> bool:
    """Whether a reimage that ended without verifying (an operator's triage, a failed or
    timed-out step) left its network boot where the machine's firmware may still read it.

    ``mark`` is the ended attempt's write-ahead mark, ``armed`` the override the BMC
    shows now, ``seen`` its reset evidence now. The firmware reads a one-time boot at
    its power-on self-test, minutes after the BMC shows the reset; removed before then,
    the machine boots its old disk and the reimage is silently not done. So the boot is
    kept while the attempt's reset went out (its mark names a reset, not only the
    override), the BMC shows it happened, and less than ``window_s`` has passed since
    the POST (the time a boot stage may take, the boot watchdog's ``stall_seconds``).

    Otherwise nothing is known to start from it, and an override still armed would
    reimage the machine at the next reset by anyone: it is removed (decision 0255). That
    is a machine left off (its last mark the ForceOff of a ForceOff + On), a reset the
    BMC does not show (a mark whose POST never left; a BMC that shows no reset at all is
    judged as before), or a firmware that had the window and did not use the override.
    """
    if mark is None or armed is None or mark.reset_type in (NETWORK_BOOT, "ForceOff"):
        return False  # no reset, or a ForceOff + On stopped at its ForceOff: nothing starts
    if reset_since(mark.baseline, seen, mark.reset_type) is not True:
        return False  # not shown: a mark written and no POST (its answer lost), or none seen
    return now - mark.posted_at < window_s
