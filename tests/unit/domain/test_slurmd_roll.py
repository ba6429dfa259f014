"""The slurmd roll's decisions: never a pod deleted under a job, only its own drain resumed,
someone else's hold kept, bounded, paused, fail closed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import slurm_sync
from gpufleet.domain.slurm_reasons import NOT_RESPONDING_SUFFIX, ROLL_REASON, is_roll_reason
from gpufleet.domain.slurm_sync import SlurmView
from gpufleet.domain.slurmd_roll import Act, RollNode, SlurmdPod, plan

T = 1_000_000.0
ADMIN = "admin: bios update"


def pod(current: bool = False, *, ready: bool = True, deleting: bool = False) -> SlurmdPod:
    return SlurmdPod("slurmd-x", current=current, ready=ready, deleting=deleting, created_at=T)


def view(state: str = "idle", reason: str | None = None, started: float = T - 3600) -> SlurmView:
    flags = frozenset({"DRAIN"}) if reason else frozenset()
    return SlurmView(state, flags, reason, slurmd_started=started)


def acts(*nodes: RollNode, max_unavailable: int = 1, paused: bool = False) -> dict[str, Act]:
    return {
        s.node: s.act for s in plan(nodes, max_unavailable=max_unavailable, paused=paused).steps
    }


def test_an_idle_outdated_node_is_drained_then_replaced_then_resumed_once_registered() -> None:
    assert acts(RollNode("a", pod(), view())) == {"a": Act.DRAIN}
    assert acts(RollNode("a", pod(), view(reason=ROLL_REASON))) == {"a": Act.REPLACE}
    assert acts(RollNode("a", None, view(reason=ROLL_REASON))) == {"a": Act.WAIT}
    # The new pod is there, but Slurm still knows the old slurmd: no resume yet.
    assert acts(RollNode("a", pod(True), view(reason=ROLL_REASON))) == {"a": Act.WAIT}
    registered = view(reason=ROLL_REASON, started=T + 2)
    assert acts(RollNode("a", pod(True, ready=False), registered)) == {"a": Act.WAIT}
    assert acts(RollNode("a", pod(True), registered)) == {"a": Act.RESUME}
    assert acts(RollNode("a", pod(True), view(started=T + 2))) == {"a": Act.DONE}


def test_a_node_with_a_job_is_drained_but_its_pod_waits_for_the_job() -> None:
    assert acts(RollNode("a", pod(), view("allocated"), jobs=1)) == {"a": Act.DRAIN}
    draining = view("allocated", ROLL_REASON)
    assert acts(RollNode("a", pod(), draining, jobs=1)) == {"a": Act.WAIT}
    # Slurm's node state alone (a job the job list missed, a job completing) also holds it.
    assert acts(RollNode("a", pod(), view("mixed", ROLL_REASON))) == {"a": Act.WAIT}
    completing = SlurmView("idle", frozenset({"DRAIN", "COMPLETING"}), ROLL_REASON)
    assert acts(RollNode("a", pod(), completing)) == {"a": Act.WAIT}


def test_someone_elses_drain_is_never_set_or_resumed_and_its_node_is_replaced_when_empty() -> None:
    admin = RollNode("a", pod(), view(reason=ADMIN))
    assert acts(admin) == {"a": Act.REPLACE}
    assert acts(RollNode("a", pod(), view("allocated", ADMIN), jobs=1)) == {"a": Act.WAIT}
    assert acts(RollNode("a", pod(True), view(reason=ADMIN, started=T + 2))) == {"a": Act.DONE}
    # Held nodes do not take a turn: the in-service node is drained beside them.
    b = RollNode("b", pod(), view())
    assert acts(admin, b) == {"a": Act.REPLACE, "b": Act.DRAIN}
    down = RollNode("c", pod(), SlurmView("down", frozenset(), "Not responding"))
    assert acts(down) == {"c": Act.REPLACE}


def test_at_most_max_unavailable_nodes_out_idle_ones_first() -> None:
    busy = RollNode("a", pod(), view("allocated"), jobs=1)
    idle = [RollNode(n, pod(), view()) for n in ("b", "c")]
    assert acts(busy, *idle) == {"a": Act.WAIT, "b": Act.DRAIN, "c": Act.WAIT}
    assert acts(busy, *idle, max_unavailable=2) == {"a": Act.WAIT, "b": Act.DRAIN, "c": Act.DRAIN}
    out = RollNode("d", None, view(reason=ROLL_REASON))
    assert acts(out, *idle) == {"b": Act.WAIT, "c": Act.WAIT, "d": Act.WAIT}


def test_paused_starts_nothing_but_gives_registered_nodes_back() -> None:
    nodes = (
        RollNode("a", pod(), view()),
        RollNode("b", pod(), view(reason=ROLL_REASON)),
        RollNode("c", pod(True), view(reason=ROLL_REASON, started=T + 1)),
    )
    assert acts(*nodes, paused=True) == {"a": Act.WAIT, "b": Act.WAIT, "c": Act.RESUME}


def test_slurms_not_responding_suffix_keeps_the_drain_the_rolls() -> None:
    """Slurm 24.11 appends `` : Not responding`` to a drained node's reason when its slurmd
    is away past SlurmdTimeout, and keeps it once the new slurmd registered (decision
    0218): still the roll's drain, resumed by it, counted against maxUnavailable."""
    suffixed = ROLL_REASON + NOT_RESPONDING_SUFFIX
    assert is_roll_reason(suffixed) and is_roll_reason(ROLL_REASON)
    assert acts(RollNode("a", pod(True), view(reason=suffixed, started=T + 2))) == {"a": Act.RESUME}
    waiting = RollNode("a", pod(True), view(reason=suffixed))
    assert acts(waiting, RollNode("b", pod(), view())) == {"a": Act.WAIT, "b": Act.WAIT}
    # Any other suffix is Slurm's own hold, and someone else's words stay someone else's.
    for other in (ROLL_REASON + " : Kill task failed", ADMIN + NOT_RESPONDING_SUFFIX):
        assert not is_roll_reason(other)
        node = RollNode("a", pod(True), view(reason=other, started=T + 2))
        assert acts(node) == {"a": Act.DONE}
    assert not view(reason=suffixed).ours  # nor the syncer's


def test_a_node_resumed_by_an_admin_while_its_pod_is_replaced_still_counts_out() -> None:
    """Resumed while its slurmd pod was being replaced, the node is in service in name only:
    Slurm shows it down (no slurmd). It counts against maxUnavailable, so no other node is
    drained beside it (found by the simulation, decision 0217)."""
    down = SlurmView("idle", frozenset({"NOT_RESPONDING"}), None, slurmd_started=T - 3600)
    for going in (pod(deleting=True), pod(True, ready=False), None):
        assert acts(RollNode("a", going, down), RollNode("b", pod(), view()))["b"] is Act.WAIT
    # A node someone else drained does not take a turn, down or not.
    held = SlurmView("down", frozenset({"DRAIN"}), ADMIN, slurmd_started=T - 3600)
    assert acts(RollNode("a", None, held), RollNode("b", pod(), view()))["b"] is Act.DRAIN


def test_a_node_slurm_does_not_know_gets_nothing() -> None:
    assert acts(RollNode("a", pod(), None)) == {"a": Act.WAIT}
    assert acts(RollNode("a", pod(), SlurmView("unknown", frozenset({"DRAIN"}), ROLL_REASON))) == {
        "a": Act.WAIT
    }


def test_the_syncer_takes_the_roll_drain_over_and_never_resumes_it() -> None:
    drained = view(reason=ROLL_REASON)
    assert not drained.ours
    in_service = slurm_sync.KubeView(slurm_sync.NodeState.PRODUCTION)
    assert slurm_sync.sync_node(in_service, drained).verb is slurm_sync.Verb.NOTHING
    assert slurm_sync.hardware_reason(drained) is None
    out = slurm_sync.KubeView(slurm_sync.NodeState.PRODUCTION, cordoned=True)
    decision = slurm_sync.sync_node(out, drained)
    assert decision.verb is slurm_sync.Verb.DRAIN
    assert decision.drain_reason == "gpufleet: cordoned"


STATES = st.sampled_from(["idle", "allocated", "mixed", "down", "unknown"])
REASONS = st.sampled_from([None, ROLL_REASON, ADMIN, "gpufleet: state draining"])


@st.composite
def nodes(draw: st.DrawFn) -> list[RollNode]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        p = draw(
            st.none()
            | st.builds(
                SlurmdPod,
                name=st.just(f"slurmd-{i}"),
                current=st.booleans(),
                ready=st.booleans(),
                deleting=st.booleans(),
                created_at=st.just(T),
            )
        )
        reason = draw(REASONS)
        flags = {"DRAIN"} if reason else set()
        if draw(st.booleans()):
            flags.add("COMPLETING")
        s = draw(
            st.none()
            | st.builds(
                SlurmView,
                state=STATES,
                flags=st.just(frozenset(flags)),
                reason=st.just(reason),
                slurmd_started=st.sampled_from([None, T - 3600, T + 1]),
            )
        )
        out.append(RollNode(f"n{i}", p, s, jobs=draw(st.integers(0, 1))))
    return out


@given(nodes(), st.integers(1, 3), st.booleans())
def test_no_plan_deletes_a_pod_under_a_job_or_resumes_a_drain_not_its_own(
    fleet: list[RollNode], max_unavailable: int, paused: bool
) -> None:
    planned = plan(fleet, max_unavailable=max_unavailable, paused=paused)
    by_name = {n.name: n for n in fleet}
    for step in planned.steps:
        node = by_name[step.node]
        s = node.slurm
        if step.act is Act.REPLACE:
            assert s is not None and (s.drained or s.down) and not node.busy and not paused
        if step.act is Act.RESUME:
            assert s is not None and s.reason == ROLL_REASON
        if step.act is Act.DRAIN:
            assert s is not None and not s.drained and not s.down and not paused
    drains = sum(1 for s in planned.steps if s.act is Act.DRAIN)
    assert drains <= max_unavailable
