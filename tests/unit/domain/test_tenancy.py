"""domain.tenancy: validation, conflicts, the quota split, objects and the Slurm plan."""

from __future__ import annotations

from gpufleet.domain import tenancy as t
from gpufleet.domain.tenancy import (
    AddAccount,
    AddUser,
    RemoveAccount,
    RemoveUser,
    SetGpuLimit,
    SetQos,
    SlurmAccount,
    SlurmSettings,
    SlurmTenancy,
    Tenant,
    Usage,
    User,
)

ALICE = User("alice", 20001, 20001, ("ssh-ed25519 AAAA alice",))
BOB = User("bob", 20002, 20002)


def tenant(name: str, created: str = "2026-01-01T00:00:00Z", **kw: object) -> Tenant:
    return Tenant(name=name, created=created, **kw)  # type: ignore[arg-type]


def test_a_valid_tenant_has_no_errors() -> None:
    v = tenant(
        "vision",
        namespaces=("vision", "vision-serve"),
        users=(ALICE, BOB),
        slurm=SlurmSettings("vision", ("normal",), "normal", ("batch",)),
        gpu_quota=16,
    )
    assert t.validate(v) == []


def test_validation_names_each_problem() -> None:
    bad = tenant(
        "Vision",
        namespaces=("a", "a"),
        users=(User("alice", 5, 20001, ("nope",)), User("carol", 5, 20003)),
        slurm=SlurmSettings("vision", ("normal",), "high"),
        gpu_quota=-1,
    )
    errors = "\n".join(t.validate(bad))
    assert "name 'Vision' is not a DNS label" in errors
    assert "namespace 'a' is listed twice" in errors
    assert "uid 5 is outside" in errors
    assert "uid 5 is given to both 'alice' and 'carol'" in errors
    assert "not an OpenSSH public key" in errors
    assert "defaultQos 'high' is not one of qos" in errors
    assert "gpuQuota -1 is negative" in errors


def test_the_older_tenant_keeps_what_both_claim() -> None:
    old = tenant("a", "2026-01-01T00:00:00Z", namespaces=("ns",), users=(ALICE,))
    new = tenant(
        "b",
        "2026-01-02T00:00:00Z",
        namespaces=("ns", "other"),
        users=(ALICE, User("mallory", 20002, 1)),
        slurm=SlurmSettings("a"),
    )
    third = tenant("c", "2026-01-03T00:00:00Z", users=(BOB,))
    got = t.conflicts([new, third, old])
    assert got["a"] == []
    assert got["b"] == [
        "namespace ns belongs to tenant a",
        "user alice belongs to tenant a",
        "Slurm account a belongs to tenant a",
    ]
    # bob's uid 20002 was first taken by b's mallory: held even though b is in conflict
    assert got["c"] == ["uid 20002 is user mallory of tenant b"]


def test_same_creation_time_the_name_decides() -> None:
    a = tenant("a", namespaces=("ns",))
    b = tenant("b", namespaces=("ns",))
    assert t.conflicts([b, a]) == {"a": [], "b": ["namespace ns belongs to tenant a"]}


def test_split_gives_each_side_the_quota_less_the_others() -> None:
    use = Usage({"n1": 4, "n2": 2}, slurm_gpus=8)
    s = t.split(16, use)
    assert (s.kubernetes_gpus, s.slurm_gpus) == (8, 10)
    assert s.namespaces == {"n1": 6, "n2": 4}
    assert t.below_use(16, use) is None


def test_a_quota_below_use_blocks_new_work_only() -> None:
    use = Usage({"n1": 8}, slurm_gpus=8)
    s = t.split(10, use)
    assert (s.kubernetes_gpus, s.slurm_gpus, s.namespaces["n1"]) == (2, 2, 2)
    why = t.below_use(10, use)
    assert why is not None and "16 GPUs in use" in why and "not disturbed" in why


def test_no_quota_no_limits_and_deletion_zero() -> None:
    use = Usage({"n1": 1}, 0)
    assert t.split(None, use).namespaces == {"n1": None}
    d = t.split(None, use, deleting=True)
    assert (d.kubernetes_gpus, d.slurm_gpus, d.namespaces) == (0, 0, {"n1": 0})


def test_pod_gpus_counts_live_pods_requests() -> None:
    pod = {
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Running"},
    }
    assert t.pod_gpus(pod) == 4
    assert t.pod_gpus({**pod, "status": {"phase": "Succeeded"}}) == 0


def test_desired_objects_and_plan_leave_foreign_objects_alone() -> None:
    v = tenant("vision", namespaces=("v1", "v2"), users=(ALICE,), groups=("admins",))
    objs = t.desired_objects(v, t.split(4, Usage({"v1": 0, "v2": 0}, 0)))
    assert [(o.kind, o.namespace) for o in objs] == [
        ("ResourceQuota", "v1"),
        ("RoleBinding", "v1"),
        ("NetworkPolicy", "v1"),
        ("ResourceQuota", "v2"),
        ("RoleBinding", "v2"),
        ("NetworkPolicy", "v2"),
    ]
    rb = objs[1].body
    assert [s["kind"] + ":" + s["name"] for s in rb["subjects"]] == ["User:alice", "Group:admins"]
    assert objs[0].body["spec"] == {"hard": {"requests.nvidia.com/gpu": "4"}}
    foreign = {"metadata": {"name": objs[0].name, "labels": {}}}
    stale = {"metadata": {"labels": t.labels("vision")}, "spec": {"podSelector": {}}}
    current = {
        objs[0].key: foreign,
        objs[1].key: dict(objs[1].body),
        ("NetworkPolicy", "old", objs[2].name): stale,
    }
    ops = t.plan_objects("vision", objs, current)
    assert ops.foreign == (objs[0].key,)
    assert objs[1] not in ops.put and objs[2] in ops.put and objs[0] not in ops.put
    assert [o.key for o in ops.delete] == [("NetworkPolicy", "old", objs[2].name)]


def test_plan_objects_never_deletes_another_tenants_object() -> None:
    other = {"metadata": {"labels": t.labels("other")}}
    assert t.plan_objects("vision", [], {("RoleBinding", "x", "y"): other}).delete == ()


def account(name: str, tenant_name: str, users: set[str], limit: int | None) -> SlurmAccount:
    return SlurmAccount(
        name, t.managed_description(tenant_name), frozenset(users), limit, frozenset()
    )


def test_plan_associations_creates_updates_and_removes_only_managed() -> None:
    v = tenant("vision", users=(ALICE, BOB), slurm=SlurmSettings("vision", ("normal",), "normal"))
    want = t.desired_account(v, 6)
    current = SlurmTenancy(
        accounts={
            "nlp": account("nlp", "nlp", {"carol"}, 4),
            "gone": account("gone", "gone", {"dave"}, 0),
            "busy": account("busy", "busy", set(), 0),
            "theirs": SlurmAccount("theirs", "made by hand", frozenset(), None, frozenset()),
        },
        gpus_running={"busy": 8},
    )
    nlp = t.desired_account(tenant("nlp", users=(User("carol", 20010, 20010),)), None)
    ops = t.plan_associations(
        {"vision": want, "nlp": nlp, "gone": None, "busy": None, "theirs": None}, current
    )
    assert ops == [
        RemoveUser("dave", "gone"),
        RemoveAccount("gone"),
        SetGpuLimit("nlp", None),
        AddAccount("vision", "gpufleet tenant vision"),
        SetQos("vision", frozenset({"normal"}), "normal"),
        SetGpuLimit("vision", 6),
        AddUser("alice", "vision"),
        AddUser("bob", "vision"),
    ]


def test_no_qos_in_the_spec_leaves_slurms_qos_alone() -> None:
    v = tenant("vision", users=(ALICE,))
    inherited = SlurmAccount(
        "vision", t.managed_description("vision"), frozenset({"alice"}), 2, frozenset({"normal"})
    )
    cur = SlurmTenancy({"vision": inherited}, {})
    assert t.plan_associations({"vision": t.desired_account(v, 2)}, cur) == []
    named = tenant("vision", users=(ALICE,), slurm=SlurmSettings("vision", ("high",), "high"))
    assert t.plan_associations({"vision": t.desired_account(named, 2)}, cur) == [
        SetQos("vision", frozenset({"high"}), "high")
    ]


def test_a_foreign_account_is_never_modified() -> None:
    v = tenant("vision", users=(ALICE,))
    hand = SlurmAccount("vision", "made by hand", frozenset(), None, frozenset())
    cur = SlurmTenancy({"vision": hand}, {})
    desired = {"vision": t.desired_account(v, 2)}
    assert t.plan_associations(desired, cur) == []
    assert t.foreign_accounts(desired, cur) == ["vision"]
    assert t.managed_tenant("gpufleet tenant vision") == "vision"
    assert t.managed_tenant("made by hand") is None


def test_left_running_lists_gpu_pods_and_jobs() -> None:
    pod = {
        "metadata": {"namespace": "v1", "name": "train"},
        "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]},
    }
    cpu = {"metadata": {"namespace": "v1", "name": "web"}, "spec": {"containers": [{}]}}
    assert t.left_running([pod, cpu], "vision", 8) == [
        "Slurm account vision: running jobs hold 8 GPUs",
        "pod v1/train holds 2 GPUs",
    ]
    assert t.left_running([cpu], "vision", 0) == []
