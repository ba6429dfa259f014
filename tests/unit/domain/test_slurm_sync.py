"""The syncer's decisions: ownership, fail-closed, reapply, requeue and preemption choice."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import departure, well_known
from gpufleet.domain import slurm_sync as ss
from gpufleet.domain.policy import RequeueMode
from gpufleet.domain.states import NodeState

PROD = ss.KubeView(NodeState.PRODUCTION)

reasons = st.one_of(
    st.none(),
    st.just(""),
    st.sampled_from(["gpufleet: state draining", "gpufleet: lent to kubernetes", "admin: bios"]),
    st.text(max_size=30),
    st.text(max_size=20).map(lambda s: "gpufleet:" + s),
)
slurm_views = st.builds(
    ss.SlurmView,
    state=st.sampled_from(["idle", "mixed", "allocated", "down", "unknown", "future", ""]),
    flags=st.frozensets(
        st.sampled_from(["DRAIN", "NOT_RESPONDING", "COMPLETING", "FAIL", "POWERED_DOWN"])
    ),
    reason=reasons,
)
kube_views = st.builds(
    ss.KubeView,
    state=st.none() | st.sampled_from(list(NodeState)),
    cordoned=st.booleans(),
    cordoned_by_us=st.booleans(),
    problems=st.lists(
        st.tuples(st.sampled_from(sorted(well_known.CONDITIONS.values())), st.text(max_size=8)),
        max_size=3,
    ).map(tuple),
    lent=st.booleans(),
    requeue=st.none() | st.sampled_from(list(RequeueMode)),
)


@settings(max_examples=1000)
@given(kube_views | st.none(), slurm_views | st.none())
def test_never_resumes_a_drain_that_is_not_ours(
    kube: ss.KubeView | None, slurm: ss.SlurmView | None
) -> None:
    d = ss.sync_node(kube, slurm)
    if d.verb is ss.Verb.RESUME:
        assert slurm is not None and slurm.drained
        assert slurm.reason is not None and slurm.reason.startswith("gpufleet:")


@settings(max_examples=1000)
@given(kube_views | st.none(), slurm_views | st.none())
def test_never_acts_on_an_unknown_view(
    kube: ss.KubeView | None, slurm: ss.SlurmView | None
) -> None:
    d = ss.sync_node(kube, slurm)
    if kube is None or not kube.known or slurm is None or not slurm.known:
        assert d.verb is ss.Verb.NOTHING


@settings(max_examples=1000)
@given(kube_views, slurm_views)
def test_never_overwrites_a_foreign_drain(kube: ss.KubeView, slurm: ss.SlurmView) -> None:
    d = ss.sync_node(kube, slurm)
    if slurm.known and slurm.drained and not well_known.is_owned_slurm_reason(slurm.reason):
        assert d.verb is ss.Verb.NOTHING
        assert d.foreign is not None


@settings(max_examples=1000)
@given(kube_views, slurm_views)
def test_drains_only_with_our_prefix_and_only_when_kubernetes_wants_it_out(
    kube: ss.KubeView, slurm: ss.SlurmView
) -> None:
    d = ss.sync_node(kube, slurm)
    if d.verb is ss.Verb.DRAIN:
        assert d.drain_reason is not None and d.drain_reason.startswith("gpufleet: ")
        assert len(d.drain_reason) <= ss.MAX_REASON_LEN
        assert ss.out_reason(kube) is not None
    else:
        assert d.drain_reason is None
    if d.verb is ss.Verb.RESUME:
        assert ss.out_reason(kube) is None


@settings(max_examples=600)
@given(kube_views, st.sampled_from(["idle", "mixed", "allocated", "down"]), reasons)
def test_reapplies_our_drain_after_an_early_resume(
    kube: ss.KubeView, base: str, stale_reason: str | None
) -> None:
    """Someone resumed the node (no DRAIN flag) while Kubernetes still wants it out."""
    resumed = ss.SlurmView(base, frozenset(), stale_reason)
    d = ss.sync_node(kube, resumed)
    if kube.known and ss.out_reason(kube) is not None:
        assert d.verb is ss.Verb.DRAIN


@settings(max_examples=600)
@given(kube_views, slurm_views)
def test_decision_is_a_fixed_point_after_acting(kube: ss.KubeView, slurm: ss.SlurmView) -> None:
    """Carrying out a decision and deciding again asks for nothing more."""
    d = ss.sync_node(kube, slurm)
    if d.verb is ss.Verb.DRAIN:
        after = ss.SlurmView(slurm.state, slurm.flags | {"DRAIN"}, d.drain_reason)
    elif d.verb is ss.Verb.RESUME:
        after = ss.SlurmView(slurm.state, slurm.flags - {"DRAIN"}, None)
    else:
        return
    assert ss.sync_node(kube, after).verb is ss.Verb.NOTHING


def test_round_trip_fault_then_production() -> None:
    faulty = ss.KubeView(
        NodeState.DRAINING, cordoned=True, cordoned_by_us=True, problems=(("GpuProblem", "Xid79"),)
    )
    idle = ss.SlurmView("idle")
    d = ss.sync_node(faulty, idle)
    assert d.verb is ss.Verb.DRAIN
    assert d.drain_reason == "gpufleet: GpuProblem Xid79"
    drained = ss.SlurmView("idle", frozenset({"DRAIN"}), d.drain_reason)
    assert ss.sync_node(PROD, drained).verb is ss.Verb.RESUME
    assert ss.sync_node(faulty, drained).verb is ss.Verb.NOTHING


def test_admin_drain_is_reported_and_kept_in_production() -> None:
    admin = ss.SlurmView("idle", frozenset({"DRAIN"}), "bob: swap dimm")
    d = ss.sync_node(PROD, admin)
    assert d.verb is ss.Verb.NOTHING
    assert d.foreign == ss.ForeignHold("idle+DRAIN", "bob: swap dimm")


def test_slurm_down_is_reported_and_drained_if_kubernetes_wants_it_out() -> None:
    down = ss.SlurmView("down", frozenset({"NOT_RESPONDING"}), "Not responding")
    d = ss.sync_node(PROD, down)
    assert d.verb is ss.Verb.NOTHING and d.foreign is not None
    out = ss.sync_node(ss.KubeView(NodeState.REMEDIATING), down)
    assert out.verb is ss.Verb.DRAIN and out.drain_reason == "gpufleet: state remediating"


def test_our_reason_is_updated_when_the_cause_changes() -> None:
    ours = ss.SlurmView("idle", frozenset({"DRAIN"}), "gpufleet: state draining")
    d = ss.sync_node(ss.KubeView(NodeState.REMEDIATING), ours)
    assert d.verb is ss.Verb.DRAIN and d.drain_reason == "gpufleet: state remediating"


def test_unknown_slurm_view_leaves_the_report_alone() -> None:
    d = ss.sync_node(PROD, ss.SlurmView("unknown", frozenset({"DRAIN"}), "gpufleet: x"))
    assert d.verb is ss.Verb.NOTHING and not d.report_known


def test_cordon_reasons_say_whose_cordon() -> None:
    assert ss.out_reason(ss.KubeView(NodeState.PRODUCTION, cordoned=True)) == "cordoned"
    mine = ss.KubeView(NodeState.PRODUCTION, cordoned=True, cordoned_by_us=True)
    assert ss.out_reason(mine) == "cordoned by gpufleet"
    assert ss.out_reason(ss.KubeView(NodeState.PRODUCTION, lent=True)) == ss.LENT_REASON


# -- requeue -------------------------------------------------------------------


def job(i: int, nodes: set[str], prio: int = 100, requeue: bool = True) -> ss.JobView:
    return ss.JobView(i, prio, requeue, frozenset(nodes))


def test_requeue_plan_splits_unrequeueable_jobs() -> None:
    """The syncer's requeue decision (domain.departure) for jobs that want no notice."""
    jobs = [job(3, {"a", "b"}), job(1, {"a"}, requeue=False)]
    plan = departure.plan_departure(
        jobs, {}, set(), 0.0, departure.DEFAULT_GRACE_S, {}, seen_at=0.0
    )
    assert plan.requeue == (departure.Requeue(3),)
    assert plan.unrequeueable == (1,)


def test_requeue_mode_prefers_record_then_fault_then_let_finish() -> None:
    assert (
        ss.requeue_mode(ss.KubeView(NodeState.DRAINING, lent=True, requeue=RequeueMode.LET_FINISH))
        is RequeueMode.NOW
    )
    assert (
        ss.requeue_mode(ss.KubeView(NodeState.DRAINING, requeue=RequeueMode.LET_FINISH))
        is RequeueMode.LET_FINISH
    )
    assert (
        ss.requeue_mode(ss.KubeView(NodeState.DRAINING, problems=(("GpuProblem", "Xid79"),)))
        is RequeueMode.NOW
    )
    assert ss.requeue_mode(ss.KubeView(NodeState.MAINTENANCE)) is RequeueMode.LET_FINISH


@given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 50), st.booleans()), max_size=8),
    st.sets(st.sampled_from("abcd")),
)
def test_requeue_plan_covers_every_job_on_an_emptied_node_once(
    raw: list[tuple[str, int, bool]], emptied: set[str]
) -> None:
    jobs = [job(i, {n}, requeue=r) for i, (n, _, r) in enumerate(raw)]
    on_emptied = [j for j in jobs if j.nodes & emptied]
    plan = departure.plan_departure(
        on_emptied, {}, set(), 0.0, departure.DEFAULT_GRACE_S, {}, seen_at=0.0
    )
    requeued = [r.job_id for r in plan.requeue]
    touched = {j.job_id for j in on_emptied}
    assert set(requeued) | set(plan.unrequeueable) == touched
    assert len(requeued) == len(set(requeued))
    assert not set(requeued) & set(plan.unrequeueable)
    assert all(j.requeueable for j in jobs if j.job_id in requeued)


# -- preemption ----------------------------------------------------------------


def cand(
    name: str, *jobs: ss.JobView, slurm: ss.SlurmView | None = None, kube: ss.KubeView = PROD
) -> ss.Candidate:
    return ss.Candidate(name, kube, slurm or ss.SlurmView("idle"), tuple(jobs))


def test_idle_nodes_first_then_lowest_priority_jobs() -> None:
    nodes = [
        cand("n1", job(1, {"n1"}, prio=500)),
        cand("n2", job(2, {"n2"}, prio=10)),
        cand("n3"),
        cand("n4", job(4, {"n4"}, prio=10), job(5, {"n4"}, prio=10)),
    ]
    assert ss.choose_lendable(nodes, 1) == ("n3",)
    assert ss.choose_lendable(nodes, 3) == ("n3", "n2", "n4")
    assert ss.choose_lendable(nodes, 9) == ("n3", "n2", "n4", "n1")
    assert ss.choose_lendable(nodes, 0) == ()


def test_unhealthy_drained_or_unrequeueable_nodes_are_never_lent() -> None:
    nodes = [
        cand("drained", slurm=ss.SlurmView("idle", frozenset({"DRAIN"}), "bob")),
        cand("down", slurm=ss.SlurmView("down", frozenset({"NOT_RESPONDING"}))),
        cand("faulty", kube=ss.KubeView(NodeState.DRAINING)),
        cand("unknown", kube=ss.KubeView(None)),
        cand("stuck", job(1, {"stuck"}, requeue=False)),
        cand("lent", kube=ss.KubeView(NodeState.PRODUCTION, lent=True)),
        ss.Candidate("nofit", PROD, ss.SlurmView("idle"), (), fits=False),
    ]
    assert ss.choose_lendable(nodes, 10) == ()


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 100), st.booleans()), max_size=12),
    st.integers(0, 6),
)
def test_choice_is_bounded_healthy_and_cheapest_first(
    raw: list[tuple[int, int, bool]], count: int
) -> None:
    candidates = [
        cand(
            f"n{i}",
            *[job(i * 10 + k, {f"n{i}"}, prio=prio) for k in range(njobs)],
            slurm=ss.SlurmView("idle", frozenset({"DRAIN"}) if drained else frozenset()),
        )
        for i, (njobs, prio, drained) in enumerate(raw)
    ]
    chosen = ss.choose_lendable(candidates, count)
    assert len(chosen) <= count and len(set(chosen)) == len(chosen)
    by_name = {c.name: c for c in candidates}
    assert all(ss.lendable(by_name[n]) for n in chosen)
    costs = [ss.lend_cost(by_name[n]) for n in chosen]
    assert costs == sorted(costs)
    rest = [c for c in candidates if ss.lendable(c) and c.name not in chosen]
    if chosen and rest:
        assert max(costs) <= min(ss.lend_cost(c) for c in rest)


def test_a_managed_node_held_back_by_the_controller_is_not_drained_for_its_problem() -> None:
    """Budget, breaker and pause hold in Slurm too: where the lifecycle controller runs,
    a problem condition on a node it kept in production does not drain it."""
    from gpufleet.domain.slurm_sync import KubeView, SlurmView, Verb, sync_node
    from gpufleet.domain.states import NodeState

    idle = SlurmView(state="idle")
    problem = (("GpuProblem", "Xid79"),)
    held = KubeView(state=NodeState.PRODUCTION, problems=problem, managed=True)
    assert sync_node(held, idle).verb is Verb.NOTHING
    taken_out = KubeView(state=NodeState.DRAINING, problems=problem, managed=True)
    decision = sync_node(taken_out, idle)
    assert decision.verb is Verb.DRAIN and "GpuProblem Xid79" in (decision.drain_reason or "")
    unmanaged = KubeView(state=NodeState.PRODUCTION, problems=problem)
    assert sync_node(unmanaged, idle).verb is Verb.DRAIN


def test_a_hot_spare_is_drained_as_spare_and_resumed_when_promoted() -> None:
    spare = ss.KubeView(state=NodeState.PRODUCTION, managed=True, spare=True)
    d = ss.sync_node(spare, ss.SlurmView(state="idle"))
    assert d.verb is ss.Verb.DRAIN and d.drain_reason == "gpufleet: spare"
    drained = ss.SlurmView(state="idle", flags=frozenset({"DRAIN"}), reason="gpufleet: spare")
    assert ss.sync_node(spare, drained).verb is ss.Verb.NOTHING
    promoted = ss.KubeView(state=NodeState.PRODUCTION, managed=True)
    assert ss.sync_node(promoted, drained).verb is ss.Verb.RESUME
    # A spare that faults is drained for its problem, not as a spare.
    faulty = ss.KubeView(state=NodeState.DRAINING, managed=True, spare=True)
    assert ss.out_reason(faulty) == "state draining"
