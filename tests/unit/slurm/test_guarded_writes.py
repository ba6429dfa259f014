"""The syncer writes a Node's taint list only over what it read (resourceVersion, 409 ->
read again), and the lender binds only a Pod it is entitled to, onto the Node locked for it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest

from gpufleet.domain import well_known
from gpufleet.domain.slurm_sync import SlurmView
from gpufleet.kubeapi import NODES, Conflict, Json, Patch, Resource
from gpufleet.slurm import nodes as kn
from gpufleet.slurm.lender import bind_refusal
from gpufleet.slurm.syncer import Syncer, SyncSettings

from ..fakes import FakeSlurm
from .fakes import RecordingKube

THRESHOLD = 1_000_000
LENT_IN_SLURM = SlurmView(state="idle", flags=frozenset({"DRAIN"}), reason="gpufleet: lent")
OTHER = {"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"}


class VersionedKube(RecordingKube):
    """Nodes with resourceVersions: a patch naming an old one is a 409, as the apiserver
    answers; someone else's change can be made between two calls (``meanwhile``)."""

    def __init__(self, nodes: dict[str, Json]) -> None:
        super().__init__()
        self.stored = copy.deepcopy(nodes)
        self.meanwhile: list[tuple[str, Json]] = []
        """(node, strategic patch) applied by "someone else" before the next syncer patch."""
        self.conflicts = 0
        self.always_changing = False
        """Someone changes the Node before every syncer patch lands."""
        self.binds: list[tuple[str, str]] = []
        self.bindable = {"ml"}
        """Namespaces whose Pods RBAC lets the syncer bind (SelfSubjectAccessReview)."""
        self.reviews = 0

    def _apply(self, name: str, patch: Mapping[str, Any]) -> None:
        node = self.stored[name]
        meta = patch.get("metadata") or {}
        for k, v in (meta.get("annotations") or {}).items():
            ann = node["metadata"].setdefault("annotations", {})
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        if "spec" in patch:
            node["spec"].update(copy.deepcopy(patch["spec"]))
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        if resource == NODES:
            return copy.deepcopy(self.stored[name])
        return await super().get(resource, name, namespace=namespace)

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json:
        if self.always_changing:
            self.meanwhile.append((name, {"spec": {"taints": [OTHER]}}))
        while self.meanwhile:
            who, theirs = self.meanwhile.pop(0)
            self._apply(who, theirs)
        await super().patch(resource, name, patch, namespace=namespace, status=status, kind=kind)
        want = (patch.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != self.stored[name]["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise Conflict(f"patch nodes {name}", 409, "the object has been modified")
        if not status:
            self._apply(name, patch)
        return copy.deepcopy(self.stored[name])

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.binds.append((f"{namespace}/{name}", node))

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        assert body["kind"] == "SelfSubjectAccessReview"
        self.reviews += 1
        attrs = body["spec"]["resourceAttributes"]
        assert (attrs["resource"], attrs["subresource"], attrs["verb"]) == (
            "pods",
            "binding",
            "create",
        )
        return {**body, "status": {"allowed": attrs["namespace"] in self.bindable}}


def node(name: str, *, rv: int = 5, **extra: Any) -> Json:
    body: Json = {
        "metadata": {
            "name": name,
            "resourceVersion": str(rv),
            "labels": {well_known.LABEL_STATE: "production", "pool": "a"},
            "annotations": {},
        },
        "spec": {"taints": []},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": []},
    }
    for key, value in extra.items():
        if key == "annotations":
            body["metadata"]["annotations"].update(value)
        elif key == "conditions":
            body["status"]["conditions"] = value
        else:
            body["spec"][key] = value
    return body


def pod(name: str = "infer", *, priority: int = 2 * THRESHOLD, gpus: int = 8, **meta: Any) -> Json:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", **meta},
        "spec": {
            "priority": priority,
            "nodeSelector": {"pool": "a"},
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def syncer(kube: VersionedKube, **settings: Any) -> Syncer:
    slurm = FakeSlurm(list(kube.stored))
    s = Syncer(kube=kube, rest=slurm, scontrol=slurm, settings=SyncSettings(**settings))
    s.nodes = copy.deepcopy(kube.stored)
    s.slurm = dict(slurm.views)
    s.jobs = []
    return s


def test_the_taint_patch_carries_the_version_it_was_computed_from() -> None:
    patch = kn.taint_patch(node("n1", rv=41, taints=[OTHER]), kn.HELD)
    assert patch is not None
    assert patch["metadata"] == {"resourceVersion": "41"}
    assert patch["spec"]["taints"][0] == OTHER
    lock = kn.lend_patch(node("n1", rv=41), "ml/infer")
    assert lock["metadata"]["resourceVersion"] == "41"
    assert lock["metadata"]["annotations"] == {well_known.ANNOTATION_LENT_TO: "ml/infer"}


def test_a_taint_added_meanwhile_survives_the_syncers_taint() -> None:
    """The syncer's view of n1 has no taint; before its write lands, someone adds theirs.
    The guarded write is refused (409), the Node read again, and both taints end up there."""
    kube = VersionedKube({"n1": node("n1")})
    s = syncer(kube, hold_taint=True)
    kube.meanwhile.append(("n1", {"spec": {"taints": [OTHER]}}))
    asyncio.run(s.reconcile("n1"))
    assert kube.conflicts == 1
    keys = [t["key"] for t in kube.stored["n1"]["spec"]["taints"]]
    assert keys == [OTHER["key"], well_known.TAINT_SLURM]
    assert s.nodes["n1"]["spec"]["taints"] == kube.stored["n1"]["spec"]["taints"]


def test_a_node_that_keeps_changing_is_left_alone_after_a_few_tries() -> None:
    kube = VersionedKube({"n1": node("n1")})
    kube.always_changing = True
    s = syncer(kube, hold_taint=True)
    asyncio.run(s.reconcile("n1"))
    assert kube.conflicts == 3
    assert all(t["key"] != well_known.TAINT_SLURM for t in kube.stored["n1"]["spec"]["taints"])


# -- binding --------------------------------------------------------------------------


def locked(for_pod: str = "ml/infer", **extra: Any) -> Json:
    return node(
        "n1",
        annotations={well_known.ANNOTATION_LENT_TO: for_pod},
        taints=[{"key": well_known.TAINT_SLURM, "value": kn.LENT, "effect": "NoSchedule"}],
        **extra,
    )


def test_bind_refusal_allows_only_the_entitled_pod_on_its_locked_node() -> None:
    def why(p: Json, n: Json | None, key: str = "ml/infer") -> str | None:
        return bind_refusal(p, n, key=key, threshold=THRESHOLD)

    assert why(pod(), locked()) is None
    assert "below" in str(why(pod(priority=5), locked()))
    assert "no GPU" in str(why(pod(gpus=0), locked()))
    assert "being deleted" in str(why(pod(deletionTimestamp="2026-01-01T00:00:00Z"), locked()))
    bound = pod()
    bound["spec"]["nodeName"] = "n9"
    assert "not a pending pod" in str(why(bound, locked()))
    assert "not ml/infer" in str(why(pod("other"), locked()))
    assert "locked for 'ml/other'" in str(why(pod(), locked("ml/other")))
    no_taint = locked()
    no_taint["spec"]["taints"] = []
    assert "lent taint" in str(why(pod(), no_taint))
    wrong_pool = pod()
    wrong_pool["spec"]["nodeSelector"] = {"pool": "b"}
    assert "does not fit" in str(why(wrong_pool, locked()))
    sick = locked(conditions=[{"type": "GpuProblem", "status": "True", "reason": "Xid79"}])
    assert "out of service" in str(why(pod(), sick))
    assert "not one the syncer manages" in str(why(pod(), None))


@pytest.mark.parametrize(
    ("the_pod", "lock"),
    [
        (pod("batch", priority=10), "ml/batch"),  # a low-priority pod named in a forged lock
        (pod("tiny", gpus=0), "ml/tiny"),  # a pod that asks for no GPU
    ],
)
def test_the_lender_refuses_a_lock_it_is_not_entitled_to_and_returns_the_node(
    the_pod: Json, lock: str
) -> None:
    kube = VersionedKube({"n1": locked(lock)})
    s = syncer(kube, hold_taint=True, preempt_priority=THRESHOLD)
    s.slurm = {"n1": LENT_IN_SLURM}
    assert s.lender is not None
    s.lender.pods[lock] = the_pod
    asyncio.run(s.lender.tick())
    assert kube.binds == []
    assert s.metrics.bind_refusals._value.get() == 1  # type: ignore[attr-defined]
    stored = kube.stored["n1"]
    assert well_known.ANNOTATION_LENT_TO not in stored["metadata"]["annotations"]
    assert kn.slurm_taint_value(stored) == kn.HELD


def test_the_lender_binds_the_entitled_pod() -> None:
    kube = VersionedKube({"n1": locked()})
    s = syncer(kube, hold_taint=True, preempt_priority=THRESHOLD)
    s.slurm = {"n1": LENT_IN_SLURM}
    assert s.lender is not None
    s.lender.pods["ml/infer"] = pod()
    asyncio.run(s.lender.tick())
    assert kube.binds == [("ml/infer", "n1")]


def test_no_node_is_locked_for_a_pod_the_syncer_may_not_bind() -> None:
    """RBAC (the chart's syncer.lendNamespaces) allows binding in ``ml`` only: a pod of
    another namespace would cost Slurm a drained node it could never be given."""
    kube = VersionedKube({"n1": node("n1"), "n2": node("n2")})
    s = syncer(kube, hold_taint=True, preempt_priority=THRESHOLD)
    assert s.lender is not None
    elsewhere = pod("web")
    elsewhere["metadata"]["namespace"] = "web"
    asyncio.run(s.lender.consider(elsewhere))
    asyncio.run(s.lender.consider(elsewhere))
    assert not any(kn.lent_to(n) for n in kube.stored.values())
    assert kube.reviews == 1  # the answer is kept
    asyncio.run(s.lender.consider(pod()))
    assert [kn.lent_to(n) for n in kube.stored.values()].count("ml/infer") == 1
