"""Pod groups and the pod scheduler's decision of one pass (domain.pod_groups, decision 0257)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpufleet.domain import pod_groups as pg
from gpufleet.domain import well_known as wk
from gpufleet.domain.pod_groups import (
    Bind,
    Cancel,
    Evict,
    GroupKey,
    JobRequest,
    Member,
    NodeFit,
    Plan,
    Reject,
    Requeue,
    SlurmJob,
    Submit,
)

NS = "team"


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
    node: str | None = None,
    gpus: str | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    priority: int | None = None,
    deleting: bool = False,
    deadline: int | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    limits = {pg.GPU_RESOURCE: gpus} if gpus else {}
    spec: dict[str, Any] = {
        "schedulerName": wk.POD_SCHEDULER_NAME,
        "containers": [{"name": "c", "resources": {"requests": requests, "limits": limits}}],
    }
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def gang(
    n: int,
    *,
    group: str = "train",
    phase: str = "Pending",
    nodes: list[str] | None = None,
    job: int | None = None,
    priority: int = 0,
) -> list[Member]:
    """n members of an explicit group; bound to ``nodes`` and planned under ``job`` if given."""
    out = []
    for i in range(n):
        ann = {wk.ANNOTATION_POD_GROUP_SIZE: str(n)}
        node = nodes[i] if nodes else None
        if job is not None and node is not None:
            ann |= {wk.ANNOTATION_SLURM_JOB: str(job), wk.ANNOTATION_SLURM_NODE: node}
        labels = {wk.LABEL_POD_GROUP: group, pg.JOB_INDEX_LABEL: str(i)}
        out.append(
            pg.member(
                pod(
                    f"{group}-{i}",
                    labels=labels,
                    annotations=ann,
                    phase=phase,
                    node=node,
                    gpus="8",
                    priority=priority,
                )
            )
        )
    return out


KEY = GroupKey(NS, "group", "train")


def fit(*names: str) -> dict[str, NodeFit]:
    return {n: NodeFit(n, True) for n in names}


def run(
    groups: dict[GroupKey, list[Member]],
    jobs: Sequence[SlurmJob] = (),
    nodes: dict[str, NodeFit] | None = None,
    absent: dict[int, float] | None = None,
    now: float = 1000.0,
    **kw: Any,
) -> list[pg.Action]:
    sizes = {k: pg.expected_size(k, ms, {}) for k, ms in groups.items()}
    requests = {
        k: pg.request(k, ms, s, {}) if isinstance(s, int) else s
        for (k, ms), s in zip(groups.items(), sizes.values(), strict=True)
    }
    return pg.plan(groups, sizes, requests, list(jobs), nodes or {}, absent or {}, now, **kw)


# -- names and keys --------------------------------------------------------------


def test_the_tag_round_trips_and_names_the_slurm_job() -> None:
    key = GroupKey(NS, "job", "train", "1234-abcd")
    assert key.tag == "team/job/train/1234-abcd"
    assert GroupKey.from_tag(key.tag) == key
    assert GroupKey.from_tag(key.comment) == key
    assert key.comment == "gpufleet-pods:team/job/train/1234-abcd"
    assert pg.key_from_comment(key.comment) == key
    assert key.job_name == "team/train"
    assert len(GroupKey(NS, "pod", "x" * 300).job_name) == 120


@pytest.mark.parametrize(
    "text", ["", "a/b/c", "a/b/c/d/e", "team/deployment/x/u", "team/job/x/u v", "team//x/u"]
)
def test_a_tag_that_is_not_ours_is_none(text: str) -> None:
    assert GroupKey.from_tag(text) is None


def test_only_our_comments_name_a_group() -> None:
    assert pg.key_from_comment("team/job/x/u") is None
    assert pg.key_from_comment("gpufleet-pods:team/job/x/u") == GroupKey(NS, "job", "x", "u")


# -- one pod -----------------------------------------------------------------------


def test_a_pod_is_read_once_with_its_requests_plan_and_owner() -> None:
    raw = pod(
        "w-1",
        labels={pg.JOB_INDEX_LABEL: "3"},
        annotations={wk.ANNOTATION_SLURM_JOB: "42", wk.ANNOTATION_SLURM_NODE: "n1"},
        phase="Running",
        node="n1",
        gpus="8",
        cpu="1500m",
        memory="4Gi",
        priority=1000,
        deadline=3600,
    )
    raw["metadata"]["ownerReferences"] = [
        {"kind": "Job", "name": "w", "uid": "j-uid", "controller": True}
    ]
    m = pg.member(raw)
    assert (m.name, m.uid, m.phase, m.node, m.index, m.priority) == (
        "w-1",
        "uid-w-1",
        "Running",
        "n1",
        3,
        1000,
    )
    assert (m.cpu_milli, m.memory_bytes, m.gpus) == (1500, 4 * 2**30, 8)
    assert (m.planned_job, m.planned_node, m.active_deadline_s) == (42, "n1", 3600)
    assert m.owner == ("Job", "w", "j-uid")
    assert m.scheduler_name == wk.POD_SCHEDULER_NAME
    assert m.namespace == NS
    assert m.live and m.bound


@pytest.mark.parametrize(
    ("phase", "deleting", "live"),
    [
        ("Pending", False, True),
        ("Running", False, True),
        ("Running", True, False),
        ("Succeeded", False, False),
        ("Failed", False, False),
    ],
)
def test_live_is_pending_or_running_and_not_deleting(
    phase: str, deleting: bool, live: bool
) -> None:
    assert pg.member(pod("p", phase=phase, deleting=deleting)).live is live


def test_a_malformed_plan_annotation_is_no_plan() -> None:
    m = pg.member(pod("p", annotations={wk.ANNOTATION_SLURM_JOB: "forty"}))
    assert m.planned_job is None


# -- groups ------------------------------------------------------------------------


def key_of(labels: dict[str, str], **kw: Any) -> GroupKey | str:
    raw = pod("p-0", labels=labels)
    raw["metadata"].update(kw)
    return pg.group_key(pg.member(raw), NS)


def test_the_explicit_group_label_wins() -> None:
    labels = {wk.LABEL_POD_GROUP: "g", pg.JOB_NAME_LABELS[0]: "j"}
    assert key_of(labels) == GroupKey(NS, "group", "g", "-")
    assert "empty" in str(key_of({wk.LABEL_POD_GROUP: ""}))


def test_a_leaderworkerset_group_is_its_name_and_group_index() -> None:
    labels = {
        pg.LWS_NAME_LABEL: "serve",
        pg.LWS_GROUP_INDEX_LABEL: "2",
        pg.LWS_WORKER_INDEX_LABEL: "1",
    }
    assert key_of(labels) == GroupKey(NS, "lws", "serve-2")
    assert isinstance(key_of({pg.LWS_NAME_LABEL: "serve"}), str)


def test_a_jobset_group_is_its_child_job() -> None:
    labels = {
        pg.JOBSET_NAME_LABEL: "llm",
        pg.JOBSET_UID_LABEL: "js-uid",
        pg.JOBSET_REPLICATED_JOB_LABEL: "workers",
        pg.JOBSET_JOB_INDEX_LABEL: "1",
        pg.JOB_NAME_LABELS[0]: "llm-workers-1",
        pg.JOB_UID_LABELS[0]: "job-uid",
    }
    assert key_of(labels) == GroupKey(NS, "jobset", "llm-workers-1", "js-uid")
    del labels[pg.JOB_NAME_LABELS[0]]
    assert key_of(labels) == GroupKey(NS, "jobset", "llm-workers-1", "js-uid")
    del labels[pg.JOBSET_JOB_INDEX_LABEL]
    assert isinstance(key_of(labels), str)


def test_a_job_group_is_its_name_and_uid_from_the_label_or_the_owner() -> None:
    assert key_of({pg.JOB_NAME_LABELS[0]: "t", pg.JOB_UID_LABELS[0]: "u"}) == GroupKey(
        NS, "job", "t", "u"
    )
    owned = key_of(
        {"job-name": "t"},
        ownerReferences=[{"kind": "Job", "name": "t", "uid": "owner-uid", "controller": True}],
    )
    assert owned == GroupKey(NS, "job", "t", "owner-uid")


def test_any_other_pod_is_its_own_group() -> None:
    assert key_of({"app": "x"}) == GroupKey(NS, "pod", "p-0", "uid-p-0")


def test_expected_sizes() -> None:
    job = GroupKey(NS, "job", "t", "u")
    assert pg.expected_size(job, [], {(NS, "t"): 4}) == 4
    assert "not found" in str(pg.expected_size(job, [], {}))
    assert "parallelism 0" in str(pg.expected_size(job, [], {(NS, "t"): 0}))
    assert pg.expected_size(GroupKey(NS, "pod", "p"), [], {}) == 1
    lws = GroupKey(NS, "lws", "s-0")
    assert pg.expected_size(lws, [Member("a", annotations={pg.LWS_SIZE_ANNOTATION: "3"})], {}) == 3
    group = [
        Member("a", annotations={wk.ANNOTATION_POD_GROUP_SIZE: "2"}),
        Member("b", annotations={wk.ANNOTATION_POD_GROUP_SIZE: "3"}),
    ]
    assert "disagree" in str(pg.expected_size(KEY, group, {}))
    assert "missing" in str(pg.expected_size(KEY, [Member("a")], {}))
    bad = [Member("a", annotations={wk.ANNOTATION_POD_GROUP_SIZE: "0"})]
    assert "positive" in str(pg.expected_size(KEY, bad, {}))


@pytest.mark.parametrize(
    ("spec", "status", "size"),
    [
        ({}, {}, 1),
        ({"parallelism": 4}, {}, 4),
        ({"parallelism": 4, "completions": 6}, {"succeeded": 4}, 2),
        ({"parallelism": 4, "suspend": True}, {}, 0),
    ],
)
def test_effective_parallelism(spec: dict[str, Any], status: dict[str, Any], size: int) -> None:
    assert pg.effective_parallelism({"spec": spec, "status": status}) == size


# -- the request ---------------------------------------------------------------------


def test_the_request_asks_per_node_for_the_largest_member() -> None:
    members = [
        pg.member(pod("a", gpus="4", cpu="1500m", memory="1Gi", deadline=90)),
        pg.member(pod("b", gpus="8", cpu="2", memory="1537Mi", deadline=3600)),
    ]
    req = pg.request(KEY, members, 2, {})
    assert isinstance(req, JobRequest)
    assert (req.nodes, req.gpus_per_node, req.cpus_per_node, req.mem_mib) == (2, 8, 2, 1537)
    assert req.time_minutes == 60
    assert (req.job_name, req.comment) == ("team/train", "gpufleet-pods:team/group/train/-")
    assert req.partition is req.account is req.qos is req.priority is req.gpu_type is None


def test_a_request_without_memory_leaves_it_out_and_asks_one_cpu() -> None:
    req = pg.request(KEY, [pg.member(pod("a"))], 1, {})
    assert isinstance(req, JobRequest)
    assert (req.mem_mib, req.cpus_per_node, req.time_minutes) == (None, 1, None)


def test_settings_come_from_the_pods_else_the_namespace() -> None:
    ann = {pg.PARTITION: "gpu", pg.PRIORITY: "500", pg.TIME_LIMIT: "90", pg.GPU_TYPE: "h100"}
    req = pg.request(
        KEY,
        [pg.member(pod("a", annotations=ann, deadline=60))],
        1,
        {pg.PARTITION: "other", pg.ACCOUNT: "research", pg.QOS: "high"},
    )
    assert isinstance(req, JobRequest)
    assert (req.partition, req.account, req.qos, req.priority) == ("gpu", "research", "high", 500)
    assert (req.time_minutes, req.gpu_type) == (90, "h100")


@pytest.mark.parametrize(
    ("annotation", "value", "words"),
    [
        (pg.PARTITION, "gpu partition", "not a Slurm name"),
        (pg.ACCOUNT, "a" * 65, "not a Slurm name"),
        (pg.QOS, "", "not a Slurm name"),
        (pg.GPU_TYPE, "h100;rm", "not a Slurm name"),
        (pg.PRIORITY, "-1", "not an integer in 1..4294967293"),
        (pg.PRIORITY, "0", "0 holds a Slurm job"),
        (pg.PRIORITY, str(2**32 - 2), "not an integer"),
        (pg.PRIORITY, "high", "not an integer"),
        (pg.TIME_LIMIT, "0", "whole number of minutes"),
        (pg.TIME_LIMIT, "1:00:00", "whole number of minutes"),
    ],
)
def test_a_bad_annotation_is_named_with_its_value(annotation: str, value: str, words: str) -> None:
    why = pg.request(KEY, [pg.member(pod("a", annotations={annotation: value}))], 1, {})
    assert isinstance(why, str)
    assert annotation in why and "on the pod" in why and words in why
    from_ns = pg.request(KEY, [pg.member(pod("a"))], 1, {annotation: value})
    assert isinstance(from_ns, str) and "on the namespace" in from_ns


def test_pods_that_disagree_on_a_setting_are_invalid() -> None:
    members = [
        pg.member(pod("a", annotations={pg.PARTITION: "x"})),
        pg.member(pod("b", annotations={pg.PARTITION: "y"})),
    ]
    assert "disagree" in str(pg.request(KEY, members, 2, {}))
    assert "no pods" in str(pg.request(KEY, [], 1, {}))


# -- nodes ---------------------------------------------------------------------------


def node(**kw: Any) -> dict[str, Any]:
    labels = kw.pop("labels", {})
    return {"metadata": {"name": "n1", "labels": labels}, "spec": kw}


def test_node_fit() -> None:
    assert pg.node_fit(node()).fit
    assert pg.node_fit(node(labels={wk.LABEL_STATE: "production"})).fit
    assert pg.node_fit(node(taints=[{"key": wk.TAINT_SLURM, "effect": "NoSchedule"}])).fit
    absent = pg.node_fit(None, "n9")
    assert (absent.name, absent.fit, absent.why) == ("n9", False, "the node does not exist")
    assert "cordoned" in pg.node_fit(node(unschedulable=True)).why
    assert "remediating" in pg.node_fit(node(labels={wk.LABEL_STATE: "remediating"})).why
    tainted = pg.node_fit(
        node(taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])
    )
    assert not tainted.fit and "unreachable" in tainted.why


def test_slurm_states_read_by_their_first_word() -> None:
    assert SlurmJob(1, KEY, "CANCELLED by 0").ended
    assert SlurmJob(1, KEY, "completed").ended
    assert not SlurmJob(1, KEY, "PENDING").ended
    assert not SlurmJob(1, KEY, "REQUEUED").ended
    assert SlurmJob(1, KEY, "").word == ""


# -- plan: submitting ------------------------------------------------------------------


def test_a_complete_group_with_no_job_is_submitted() -> None:
    actions = run({KEY: gang(2)})
    assert len(actions) == 1 and isinstance(actions[0], Submit)
    req = actions[0].request
    assert (req.key, req.nodes, req.gpus_per_node) == (KEY, 2, 8)


def test_an_incomplete_group_waits() -> None:
    members = gang(3)[:2]
    assert run({KEY: members}) == []


def test_more_pending_pods_than_the_size_is_an_invalid_group() -> None:
    extra = pod(
        "train-2",
        labels={wk.LABEL_POD_GROUP: "train"},
        annotations={wk.ANNOTATION_POD_GROUP_SIZE: "2"},
    )
    members = [*gang(2), pg.member(extra)]
    (reject,) = run({KEY: members})
    assert isinstance(reject, Reject) and reject.reason == pg.INVALID
    assert reject.pods == ("team/train-0", "team/train-1", "team/train-2")
    assert "3 pods are pending in a group of 2" in reject.message


def test_a_group_with_a_bad_annotation_is_rejected_not_submitted() -> None:
    members = [pg.member(pod("solo", annotations={pg.PRIORITY: "urgent"}))]
    key = GroupKey(NS, "pod", "solo", "uid-solo")
    (reject,) = run({key: members})
    assert isinstance(reject, Reject) and reject.reason == pg.INVALID
    assert reject.pods == ("team/solo",) and pg.PRIORITY in reject.message


def test_a_bad_size_is_rejected() -> None:
    members = [pg.member(pod("a", labels={wk.LABEL_POD_GROUP: "train"}))]
    (reject,) = run({KEY: members})
    assert isinstance(reject, Reject) and wk.ANNOTATION_POD_GROUP_SIZE in reject.message


def test_submissions_go_highest_priority_first_and_are_bounded() -> None:
    groups = {GroupKey(NS, "group", f"g{i}"): gang(1, group=f"g{i}", priority=i) for i in range(5)}
    actions = run(groups, submit_limit=3)
    assert [a.request.key.name for a in actions if isinstance(a, Submit)] == ["g4", "g3", "g2"]
    high = {KEY: gang(2, priority=10**6)}
    many_low = {GroupKey(NS, "group", f"low{i}"): gang(1, group=f"low{i}") for i in range(500)}
    first = run(many_low | high, submit_limit=10)[0]
    assert isinstance(first, Submit) and first.request.key == KEY


@pytest.mark.parametrize("state", ["PENDING", "REQUEUED", "CONFIGURING", "SUSPENDED", "RUNNING"])
def test_never_a_second_job_for_a_key_whose_job_is_not_ended(state: str) -> None:
    nodes = ["n1", "n2"] if state in ("RUNNING", "SUSPENDED", "CONFIGURING") else []
    actions = run({KEY: gang(2)}, [SlurmJob(7, KEY, state, tuple(nodes))], fit("n1", "n2"))
    assert not any(isinstance(a, Submit) for a in actions)


def test_a_job_found_by_comment_pending_is_waited_for() -> None:
    # A scheduler restarted after sbatch answered and before anything else: the pods carry
    # no plan, Slurm has the job by its comment; nothing is submitted again.
    assert run({KEY: gang(2)}, [SlurmJob(7, KEY, "PENDING")]) == []


def test_a_group_whose_ended_job_left_pending_pods_is_submitted_again() -> None:
    actions = run({KEY: gang(2)}, [SlurmJob(7, KEY, "CANCELLED")])
    assert [type(a) for a in actions] == [Submit]


# -- plan: binding ----------------------------------------------------------------------


def test_a_running_job_binds_every_member_after_writing_the_plan() -> None:
    members = gang(3)
    job = SlurmJob(7, KEY, "RUNNING", ("n3", "n1", "n2"))
    actions = run({KEY: members}, [job], fit("n1", "n2", "n3"))
    assignments = (("team/train-0", "n1"), ("team/train-1", "n2"), ("team/train-2", "n3"))
    assert actions == [Plan(7, assignments), *(Bind(p, n) for p, n in assignments)]


def test_members_go_in_index_order_onto_the_sorted_nodes() -> None:
    members = list(reversed(gang(3)))
    job = SlurmJob(7, KEY, "RUNNING", ("b", "a", "c"))
    binds = [a for a in run({KEY: members}, [job], fit("a", "b", "c")) if isinstance(a, Bind)]
    assert binds == [
        Bind("team/train-0", "a"),
        Bind("team/train-1", "b"),
        Bind("team/train-2", "c"),
    ]


def test_a_pod_planned_but_not_bound_keeps_its_plan() -> None:
    # Crash point: the plan was written on every pod, one was bound, then the scheduler died.
    members = gang(2)
    planned = {wk.ANNOTATION_SLURM_JOB: "7"}
    m0 = pg.member(
        pod(
            "train-0",
            labels={wk.LABEL_POD_GROUP: "train", pg.JOB_INDEX_LABEL: "0"},
            annotations={**members[0].annotations, **planned, wk.ANNOTATION_SLURM_NODE: "n2"},
            phase="Running",
            node="n2",
        )
    )
    m1 = pg.member(
        pod(
            "train-1",
            labels={wk.LABEL_POD_GROUP: "train", pg.JOB_INDEX_LABEL: "1"},
            annotations={**members[1].annotations, **planned, wk.ANNOTATION_SLURM_NODE: "n1"},
        )
    )
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    assert run({KEY: [m0, m1]}, [job], fit("n1", "n2")) == [Bind("team/train-1", "n1")]


def test_a_job_found_by_comment_running_without_plans_is_planned_then_bound() -> None:
    # Crash point: Slurm started the job while the scheduler was down; no pod has a plan.
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    actions = run({KEY: gang(2)}, [job], fit("n1", "n2"))
    assert isinstance(actions[0], Plan) and [type(a) for a in actions[1:]] == [Bind, Bind]


def test_a_stale_plan_from_an_earlier_run_is_replaced() -> None:
    # The job was requeued after the plan was written and now runs on other nodes.
    stale = {wk.ANNOTATION_SLURM_JOB: "7", wk.ANNOTATION_SLURM_NODE: "old"}
    members = [
        Member(
            m.name,
            annotations={**m.annotations, **stale},
            index=m.index,
            planned_job=7,
            planned_node="old",
            namespace=NS,
        )
        for m in gang(2)
    ]
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    actions = run({KEY: members}, [job], fit("n1", "n2"))
    assert actions[0] == Plan(7, (("team/train-0", "n1"), ("team/train-1", "n2")))


def test_an_unfit_node_at_allocation_time_binds_nobody_and_requeues() -> None:
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    nodes = {"n1": NodeFit("n1", True), "n2": NodeFit("n2", False, "the node is cordoned")}
    actions = run({KEY: gang(2)}, [job], nodes)
    assert len(actions) == 1 and isinstance(actions[0], Requeue)
    assert actions[0].job_id == 7 and "n2: the node is cordoned" in actions[0].why
    assert actions[0].unfit == ("n2",)
    missing = run({KEY: gang(2)}, [job], fit("n1"))
    assert isinstance(missing[0], Requeue) and "n2: not found" in missing[0].why


def test_a_job_that_has_no_nodes_listed_yet_waits() -> None:
    assert run({KEY: gang(2)}, [SlurmJob(7, KEY, "RUNNING")], fit("n1", "n2")) == []


def test_a_running_job_with_every_pod_bound_does_nothing() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    assert run({KEY: members}, [job], fit("n1", "n2")) == []
    # a node going unfit under running pods is the fault path's (drain), not a requeue
    assert run({KEY: members}, [job], fit("n1")) == []


def test_a_lost_member_on_an_unfit_node_requeues_the_whole_group() -> None:
    # n2 failed: the controller drained it (its pod is gone), the owner made a new pod.
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    replacement = Member(
        "train-1b",
        index=1,
        namespace=NS,
        annotations={wk.ANNOTATION_POD_GROUP_SIZE: "2"},
        labels={wk.LABEL_POD_GROUP: "train"},
    )
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    nodes = {"n1": NodeFit("n1", True), "n2": NodeFit("n2", False, "gpufleet has it in triage")}
    actions = run({KEY: [members[0], replacement]}, [job], nodes)
    assert actions == [
        Requeue(7, "nodes of the allocation are not fit (n2: gpufleet has it in triage)", ("n2",))
    ]


def test_a_lost_member_on_a_fit_node_is_replaced_in_the_same_allocation() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    failed = replace(members[1], phase="Failed")
    replacement = Member("train-1b", index=1, namespace=NS)
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    actions = run({KEY: [members[0], failed, replacement]}, [job], fit("n1", "n2"))
    assert actions == [Plan(7, (("team/train-1b", "n2"),)), Bind("team/train-1b", "n2")]


def test_a_replacement_waits_while_the_lost_pod_still_leaves_its_node() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    leaving = replace(members[1], deleting=True)
    replacement = Member("train-1b", index=1, namespace=NS)
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    assert run({KEY: [members[0], leaving, replacement]}, [job], fit("n1", "n2")) == []


def test_a_node_where_another_groups_pod_still_stands_is_not_free() -> None:
    # Slurm gave n1 to this job as soon as the other group's job was requeued; that group's
    # pod is still terminating there: this group waits for it to leave
    other = GroupKey(NS, "group", "other")
    leaving = Member(
        "other-0",
        phase="Running",
        node="n1",
        deleting=True,
        planned_job=5,
        planned_node="n1",
        namespace=NS,
        labels={wk.LABEL_POD_GROUP: "other"},
        annotations={wk.ANNOTATION_POD_GROUP_SIZE: "1"},
    )
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    others = [SlurmJob(5, other, "PENDING")]
    assert run({KEY: gang(2), other: [leaving]}, [job, *others], fit("n1", "n2")) == []
    actions = run({KEY: gang(2), other: []}, [job, *others], fit("n1", "n2"))
    assert [type(a) for a in actions] == [Cancel, Plan, Bind, Bind]


# -- plan: ends that follow each other ------------------------------------------------


def test_a_job_whose_pods_all_ended_is_cancelled() -> None:
    done = gang(2, phase="Succeeded", nodes=["n1", "n2"], job=7)
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    (cancel,) = run({KEY: done}, [job], fit("n1", "n2"))
    assert isinstance(cancel, Cancel) and cancel.job_id == 7 and "pending or running" in cancel.why


def test_a_job_whose_pods_are_gone_is_cancelled() -> None:
    (cancel,) = run({}, [SlurmJob(7, KEY, "PENDING")])
    assert cancel == Cancel(7, f"no pod of {KEY.tag} is pending or running")


def test_a_job_is_not_cancelled_while_its_pods_are_terminating() -> None:
    # evicted for a requeue: the owner replaces them and the replacements wait for this job
    leaving = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    leaving = [
        Member(m.name, phase="Running", node=m.node, deleting=True, planned_job=7, namespace=NS)
        for m in leaving
    ]
    assert run({KEY: leaving}, [SlurmJob(7, KEY, "PENDING")]) == []


def test_an_ended_job_with_no_live_pod_is_left_alone() -> None:
    assert run({KEY: gang(2, phase="Succeeded")}, [SlurmJob(7, KEY, "COMPLETED")]) == []


@pytest.mark.parametrize("state", ["CANCELLED", "PREEMPTED", "TIMEOUT", "NODE_FAIL", "COMPLETED"])
def test_pods_of_an_ended_job_are_evicted_with_why(state: str) -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    job = SlurmJob(7, KEY, state, ("n1", "n2"), reason="Prolog")
    actions = run({KEY: members}, [job], fit("n1", "n2"))
    assert actions == [
        Evict("team/train-0", f"Slurm job 7 ended: {state} (Prolog)"),
        Evict("team/train-1", f"Slurm job 7 ended: {state} (Prolog)"),
    ]


def test_a_completing_job_evicts_its_pods_and_is_not_submitted_again() -> None:
    # Slurm shows a job being requeued as COMPLETING while its epilog runs: it may come back
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    job = SlurmJob(7, KEY, "COMPLETING", ("n1", "n2"))
    actions = run({KEY: members}, [job], fit("n1", "n2"))
    assert actions == [
        Evict("team/train-0", "Slurm job 7 is COMPLETING: its allocation is ending"),
        Evict("team/train-1", "Slurm job 7 is COMPLETING: its allocation is ending"),
    ]
    assert run({KEY: gang(2)}, [job], fit("n1", "n2")) == []
    assert run({}, [job]) == []  # already on its way out: no cancel to refuse


def test_pods_of_a_suspended_job_are_evicted_and_wait_for_it_to_resume() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    job = SlurmJob(7, KEY, "SUSPENDED", ("n1", "n2"))
    actions = run({KEY: members}, [job], fit("n1", "n2"))
    assert [type(a) for a in actions] == [Evict, Evict]
    assert isinstance(actions[0], Evict) and "SUSPENDED" in actions[0].why
    # the owner's new pods wait (no second job) and are bound when the job runs again
    assert run({KEY: gang(2)}, [job], fit("n1", "n2")) == []
    resumed = SlurmJob(7, KEY, "RUNNING", ("n1", "n2"))
    assert [type(a) for a in run({KEY: gang(2)}, [resumed], fit("n1", "n2"))] == [Plan, Bind, Bind]


def test_pods_of_a_requeued_job_are_evicted_and_nothing_is_submitted() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    actions = run({KEY: members}, [SlurmJob(7, KEY, "PENDING", reason="BeginTime")])
    assert [type(a) for a in actions] == [Evict, Evict]
    assert isinstance(actions[0], Evict) and "requeued" in actions[0].why


def unbound(members: list[Member]) -> list[Member]:
    """The same pods planned under their job but not bound (the plan written, no bind yet)."""
    return [
        Member(
            m.name,
            index=m.index,
            planned_job=m.planned_job,
            planned_node=m.node,
            namespace=NS,
            annotations=m.annotations,
            labels=m.labels,
        )
        for m in members
    ]


def test_a_job_absent_from_one_listing_changes_nothing() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    assert run({KEY: members}, [], fit("n1", "n2")) == []
    assert run({KEY: members}, [], fit("n1", "n2"), absent={7: 980.0}, now=1000.0) == []
    # the pending pods of a group whose job may still exist are not submitted again
    pending = unbound(members)
    assert run({KEY: pending}, [], absent={7: 980.0}, now=1000.0) == []


def test_a_job_absent_from_two_listings_30_s_apart_has_ended() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=7)
    actions = run({KEY: members}, [], fit("n1", "n2"), absent={7: 970.0}, now=1000.0)
    assert [type(a) for a in actions] == [Evict, Evict]
    assert isinstance(actions[0], Evict) and "two listings 30 s apart" in actions[0].why
    pending = unbound(members)
    assert [type(a) for a in run({KEY: pending}, [], absent={7: 970.0}, now=1000.0)] == [Submit]


def test_absent_since_keeps_the_first_miss_and_forgets_listed_jobs() -> None:
    groups = {KEY: gang(2, phase="Running", nodes=["n1", "n2"], job=7)}
    assert pg.absent_jobs(groups, [], {}, 100.0) == {7: 100.0}
    assert pg.absent_jobs(groups, [], {7: 100.0, 9: 50.0}, 130.0) == {7: 100.0}
    assert pg.absent_jobs(groups, [SlurmJob(7, KEY, "RUNNING")], {7: 100.0}, 130.0) == {}


def test_two_jobs_for_one_key_cancel_the_one_without_pods() -> None:
    members = gang(2, phase="Running", nodes=["n1", "n2"], job=9)
    jobs = [SlurmJob(7, KEY, "PENDING"), SlurmJob(9, KEY, "RUNNING", ("n1", "n2"))]
    assert run({KEY: members}, jobs, fit("n1", "n2")) == [
        Cancel(7, f"a duplicate of job 9 for {KEY.tag}")
    ]


def test_two_jobs_for_one_key_with_no_plan_cancel_the_newer() -> None:
    jobs = [SlurmJob(12, KEY, "PENDING"), SlurmJob(11, KEY, "PENDING")]
    assert run({KEY: gang(2)}, jobs) == [Cancel(12, f"a duplicate of job 11 for {KEY.tag}")]


def test_pods_bound_by_someone_else_are_never_evicted() -> None:
    mine = Member("train-0", phase="Running", node="n5", namespace=NS, index=0)
    assert run({KEY: [mine]}, [SlurmJob(7, KEY, "CANCELLED")]) == []


def test_a_gang_missing_a_pod_waits_with_its_allocation() -> None:
    # the owner has not (re)made one pod yet: binding the others would start a gang short
    job = SlurmJob(7, KEY, "RUNNING", ("n1", "n2", "n3"))
    assert run({KEY: gang(3)[:2]}, [job], fit("n1", "n2", "n3")) == []
    running = gang(3, phase="Running", nodes=["n1", "n2", "n3"], job=7)
    assert run({KEY: running[:1] + gang(3)[2:]}, [job], fit("n1", "n2", "n3")) == []


def test_a_job_of_a_group_with_an_unknown_size_binds_nobody() -> None:
    job_key = GroupKey(NS, "job", "t", "u")
    members = [Member("t-0", namespace=NS)]
    job = SlurmJob(7, job_key, "RUNNING", ("n1",))
    sizes: dict[GroupKey, int | str] = {job_key: "Job team/t was not found"}
    actions = pg.plan({job_key: members}, sizes, dict(sizes), [job], fit("n1"), {}, 0.0)
    assert actions == []


# -- plan: properties over any state ------------------------------------------------------

STATES = ["PENDING", "RUNNING", "RUNNING", "RUNNING", "SUSPENDED", "COMPLETING", "CANCELLED"]
PHASES = ["Pending", "Pending", "Pending", "Running", "Succeeded", "Failed"]
MOSTLY_NOT = [False, False, False, True]
NODES = ["n1", "n2", "n3", "n4"]


@st.composite
def states(
    draw: st.DrawFn,
) -> tuple[list[Member], list[SlurmJob], dict[str, NodeFit], dict[int, float]]:
    size = draw(st.integers(1, 3))
    members = []
    for i in range(draw(st.integers(0, 4))):
        node = draw(st.sampled_from([None, None, *NODES]))
        job = draw(st.none() | st.sampled_from([7, 8, 9]))
        members.append(
            Member(
                f"p{i}",
                phase=draw(st.sampled_from(PHASES)),
                node=node,
                deleting=draw(st.sampled_from(MOSTLY_NOT)),
                index=i,
                planned_job=job,
                planned_node=draw(st.none() | st.sampled_from(NODES)) if job else None,
                annotations={wk.ANNOTATION_POD_GROUP_SIZE: str(size)},
                labels={wk.LABEL_POD_GROUP: "train"},
                namespace=NS,
            )
        )
    jobs = [
        SlurmJob(
            jid,
            KEY,
            draw(st.sampled_from(STATES)),
            tuple(draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True))),
        )
        for jid in draw(st.lists(st.sampled_from([7, 8, 9]), max_size=2, unique=True))
    ]
    nodes = {n: NodeFit(n, not draw(st.sampled_from(MOSTLY_NOT)), "x") for n in NODES}
    absent = {
        jid: draw(st.sampled_from([0.0, 990.0]))
        for jid in draw(st.sets(st.sampled_from([7, 8, 9])))
    }
    return members, jobs, nodes, absent


@st.composite
def running_gangs(
    draw: st.DrawFn,
) -> tuple[list[Member], list[SlurmJob], dict[str, NodeFit], dict[int, float]]:
    """A gang whose job runs, caught at any point: pods waiting, planned and not bound
    (a crash), bound, or lost and replaced by their owner."""
    size = draw(st.integers(1, 4))
    allocation = draw(st.lists(st.sampled_from(NODES), min_size=size, max_size=size, unique=True))
    ann = {wk.ANNOTATION_POD_GROUP_SIZE: str(size)}
    labels = {wk.LABEL_POD_GROUP: "train"}
    members = []
    for i, n in enumerate(sorted(allocation)):
        how = draw(st.sampled_from(["waiting", "planned", "bound", "lost"]))
        planned = 7 if how != "waiting" else None
        phase = "Running" if how == "bound" else "Failed" if how == "lost" else "Pending"
        node = n if how in ("bound", "lost") else None
        members.append(
            Member(
                f"p{i}",
                phase=phase,
                node=node,
                index=i,
                planned_job=planned,
                planned_node=n if planned else None,
                annotations=ann,
                labels=labels,
                namespace=NS,
            )
        )
        if how == "lost" and draw(st.booleans()):
            members.append(Member(f"p{i}b", index=i, annotations=ann, labels=labels, namespace=NS))
    nodes = {n: NodeFit(n, not draw(st.sampled_from(MOSTLY_NOT)), "x") for n in NODES}
    return members, [SlurmJob(7, KEY, "RUNNING", tuple(allocation))], nodes, {}


@settings(max_examples=400, deadline=None)
@given(states() | running_gangs())
def test_plan_keeps_its_promises_in_any_state(
    state: tuple[list[Member], list[SlurmJob], dict[str, NodeFit], dict[int, float]],
) -> None:
    members, jobs, nodes, absent = state
    actions = run({KEY: members} if members else {}, jobs, nodes, absent, now=1000.0)
    event(" ".join(sorted({type(a).__name__ for a in actions})) or "nothing")
    by_name = {f"{NS}/{m.name}": m for m in members}
    listed = {j.job_id: j for j in jobs}
    binds = [a for a in actions if isinstance(a, Bind)]
    stopped = {a.job_id for a in actions if isinstance(a, Cancel | Requeue)}
    cancelled = {a.job_id for a in actions if isinstance(a, Cancel)}
    assert not cancelled & {a.job_id for a in actions if isinstance(a, Requeue)}
    # only jobs that are listed and not ended are cancelled or requeued
    assert all(jid in listed and not listed[jid].ended for jid in stopped)
    # never a second job for a key whose job is not ended
    if any(not j.ended for j in jobs):
        assert not any(isinstance(a, Submit) for a in actions)
    # never a job for a group that may still have one (a planned job missing once)
    for m in members:
        missing = m.planned_job is not None and m.planned_job not in listed
        if m.live and missing and absent.get(m.planned_job or 0, 1e9) > 1000 - pg.ABSENT_GRACE_S:
            assert not any(isinstance(a, Submit) for a in actions)
    # evictions: only live pods bound under a plan of ours
    for a in actions:
        if isinstance(a, Evict):
            m = by_name[a.pod]
            assert m.live and m.bound and m.planned_job is not None
    if binds:
        (job,) = {j for j in jobs if j.word == "RUNNING" and j.job_id not in stopped}
        waiting = {f"{NS}/{m.name}" for m in members if m.live and not m.bound}
        # all or none: every waiting pod of the group is bound in the same pass
        assert {b.pod for b in binds} == waiting
        # each onto its own fit node of the allocation that no pod of the group holds
        held = {m.node for m in members if m.node and (m.live or m.deleting)}
        targets = [b.node for b in binds]
        assert len(set(targets)) == len(targets)
        assert all(n in job.nodes and nodes[n].fit and n not in held for n in targets)
        # and the plan is written first when any pod lacks it
        first = actions.index(binds[0])
        plans = [a for a in actions[:first] if isinstance(a, Plan)]
        if any(
            by_name[b.pod].planned_job != job.job_id or by_name[b.pod].planned_node != b.node
            for b in binds
        ):
            assert plans and set(plans[-1].assignments) == {(b.pod, b.node) for b in binds}
        # a gang never starts short
        size = int(members[0].annotations[wk.ANNOTATION_POD_GROUP_SIZE])
        running = sum(
            1 for m in members if m.live and m.planned_job == job.job_id and m.node in job.nodes
        )
        assert running + len(binds) >= size


# -- plan: many passes against a small Slurm, with crashes, faults and outages ------------------


class World:
    """A few nodes, pod groups whose owner remakes an evicted pod, a Slurm that places pending
    jobs on the nodes it thinks free, and a scheduler that may die in the middle of a pass."""

    def __init__(self, rng: Any, sizes: tuple[int, ...]) -> None:
        self.rng = rng
        self.fit = {f"n{i}": True for i in range(5)}
        self.pods: dict[str, dict[str, Any]] = {}
        self.sizes = {GroupKey(NS, "group", f"g{i}"): n for i, n in enumerate(sizes)}
        self.jobs: dict[int, SlurmJob] = {}
        self.next_id = 100
        self.made = 0
        for key, n in self.sizes.items():
            for i in range(n):
                self.make(key, i)

    def make(self, key: GroupKey, index: int) -> None:
        self.made += 1
        name = f"{key.name}-{index}-{self.made}"
        self.pods[name] = {"key": key, "index": index, "node": None, "job": None, "planned": None}

    def members(self) -> dict[GroupKey, list[Member]]:
        out: dict[GroupKey, list[Member]] = {k: [] for k in self.sizes}
        for name, p in self.pods.items():
            out[p["key"]].append(
                Member(
                    name,
                    phase="Running" if p["node"] else "Pending",
                    node=p["node"],
                    index=p["index"],
                    planned_job=p["job"],
                    planned_node=p["planned"],
                    namespace=NS,
                    labels={wk.LABEL_POD_GROUP: p["key"].name},
                    annotations={wk.ANNOTATION_POD_GROUP_SIZE: str(self.sizes[p["key"]])},
                )
            )
        return out

    def evict(self, name: str) -> None:
        p = self.pods.pop(name)
        self.make(p["key"], p["index"])  # the owner's restart policy

    def one_pass(self, crash: bool) -> list[pg.Action]:
        groups = self.members()
        jobs = list(self.jobs.values())
        nodes = {n: NodeFit(n, ok, "" if ok else "faulty") for n, ok in self.fit.items()}
        actions = run(groups, jobs, nodes)
        if crash:
            actions = actions[: self.rng.randrange(len(actions) + 1)]
        for a in actions:
            if isinstance(a, Submit):
                self.jobs[self.next_id] = SlurmJob(self.next_id, a.request.key, "PENDING")
                self.next_id += 1
            elif isinstance(a, Plan):
                for pod_name, n in a.assignments:
                    p = self.pods[pod_name.split("/", 1)[1]]
                    p["job"], p["planned"] = a.job_id, n
            elif isinstance(a, Bind):
                assert self.fit[a.node], f"{a.pod} bound to unfit {a.node}"
                p = self.pods[a.pod.split("/", 1)[1]]
                assert p["planned"] == a.node, "bound before its plan was written"
                p["node"] = a.node
            elif isinstance(a, Requeue):
                self.jobs[a.job_id] = replace(self.jobs[a.job_id], state="PENDING", nodes=())
            elif isinstance(a, Cancel):
                self.jobs[a.job_id] = replace(self.jobs[a.job_id], state="CANCELLED")
            elif isinstance(a, Evict):
                self.evict(a.pod.split("/", 1)[1])
        return actions

    def slurm_tick(self) -> None:
        busy = {n for j in self.jobs.values() if j.word == "RUNNING" for n in j.nodes}
        for jid in sorted(self.jobs):
            job = self.jobs[jid]
            if job.word != "PENDING":
                continue
            # Slurm knows of a fault only some of the time (its drain comes later)
            free = [
                n
                for n in sorted(self.fit)
                if n not in busy and (self.fit[n] or self.rng.random() < 0.5)
            ]
            size = self.sizes[job.key]
            if len(free) >= size:
                chosen = tuple(self.rng.sample(free, size))
                busy |= set(chosen)
                self.jobs[jid] = replace(job, state="RUNNING", nodes=chosen)

    def fault(self) -> None:
        n = self.rng.choice(sorted(self.fit))
        self.fit[n] = False
        for name, p in list(self.pods.items()):
            if p["node"] == n:
                self.evict(name)  # the controller drains the node

    def check(self, after_pass: bool) -> None:
        live_jobs: dict[GroupKey, int] = {}
        for j in self.jobs.values():
            if not j.ended:
                live_jobs[j.key] = live_jobs.get(j.key, 0) + 1
        assert all(n <= 1 for n in live_jobs.values()), f"two jobs for one group: {live_jobs}"
        on = [p["node"] for p in self.pods.values() if p["node"]]
        assert len(on) == len(set(on)), "two pods on one node"
        for p in self.pods.values():
            if p["node"] and after_pass:
                # Slurm may have moved a requeued job on; a whole pass has evicted its pods
                job = self.jobs[p["job"]]
                assert p["node"] in job.nodes or job.word != "RUNNING"

    def settled(self) -> bool:
        for key, n in self.sizes.items():
            pods = [p for p in self.pods.values() if p["key"] == key]
            jobs = {p["job"] for p in pods}
            if len(pods) != n or not all(p["node"] for p in pods) or len(jobs) != 1:
                return False
            (jid,) = jobs
            if self.jobs[jid].word != "RUNNING":
                return False
        return True


@pytest.mark.parametrize("seed", range(40))
def test_passes_with_crashes_faults_and_outages_keep_one_job_per_group_and_settle(
    seed: int,
) -> None:
    rng = random.Random(seed)
    world = World(rng, (rng.choice([1, 2]), rng.choice([1, 2, 3])))  # both fit on 5 nodes
    for _ in range(80):
        event = rng.random()
        crash = rng.random() < 0.3
        if event < 0.45:
            world.one_pass(crash)
        elif event < 0.8:
            world.slurm_tick()
        elif event < 0.9:
            world.fault()
        else:
            world.fit[rng.choice(sorted(world.fit))] = True  # repaired
        world.check(after_pass=event < 0.45 and not crash)
    # faults stop and every node is repaired: every group runs whole, under one job
    world.fit = dict.fromkeys(world.fit, True)
    for _ in range(12):
        world.one_pass(crash=False)
        world.check(after_pass=True)
        world.slurm_tick()
    assert world.settled(), (world.pods, world.jobs)
