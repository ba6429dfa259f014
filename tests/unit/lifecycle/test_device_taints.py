"""The controller's DeviceTaintRules: one per quarantined GPU, only gpufleet's touched,
pause and dry-run obeyed, nothing done without the list (fail closed)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpufleet.api import dra as codec
from gpufleet.clock import ManualClock
from gpufleet.domain import dra
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import NodeRecord, QuarantinedGpu
from gpufleet.kubeapi import ObjectList
from gpufleet.kubeapi.errors import ApiError, NotFound
from gpufleet.kubeapi.resources import DEVICE_TAINT_RULES, Json, Patch, Resource
from gpufleet.lifecycle.device_taints import DeviceTaints
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.nodebook import NodeBook

from ..fakes import UnmodelledKube


class RuleKube(UnmodelledKube):
    """DeviceTaintRules in memory (cluster-scoped), listed by equality label selectors."""

    def __init__(self) -> None:
        self.rules: dict[str, Json] = {}
        self.writes: list[str] = []
        self.fail_list = False

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        assert resource == DEVICE_TAINT_RULES
        if self.fail_list:
            raise ApiError("list devicetaintrules", None, "the apiserver is away")
        wanted = dict(p.split("=", 1) for p in label_selector.split(",") if p)
        items = [
            b
            for b in self.rules.values()
            if all(b["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        return ObjectList(items=[dict(b) for b in items])

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        name = body["metadata"]["name"]
        self.rules[name] = dict(body)
        self.writes.append(f"create {name}")
        return dict(body)

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
        body = self.rules[name]
        body["spec"] = patch["spec"]
        body["metadata"]["labels"] = patch["metadata"]["labels"]
        self.writes.append(f"patch {name}")
        return body

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        if name not in self.rules:
            raise NotFound(f"delete {name}", 404, "not found")
        del self.rules[name]
        self.writes.append(f"delete {name}")


class Events:
    def __init__(self) -> None:
        self.said: list[tuple[str, str, str]] = []

    def node(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.said.append((body["metadata"]["name"], reason, message))


def setup(**policy: Any) -> tuple[RuleKube, Fleet, DeviceTaints, Events, ManualClock]:
    kube, fleet, book, events, clock = RuleKube(), Fleet(), NodeBook(), Events(), ManualClock()
    book.put("a", {"metadata": {"name": "a", "uid": "uid-a"}})
    pol = default_policy().model_copy(update=policy)
    taints = DeviceTaints(
        kube,
        fleet=fleet,
        book=book,
        policy=lambda: pol,
        events=events,  # type: ignore[arg-type]
        clock=clock,
    )
    return kube, fleet, taints, events, clock


def quarantine(fleet: Fleet, node: str, *gpus: int) -> None:
    record = fleet.records.get(node) or NodeRecord.new(node, at=0.0)
    q = tuple(QuarantinedGpu(i, f"GPU-{node}-{i}", "xid-94", 1.0) for i in gpus)
    fleet.put(replace(record, quarantined_gpus=q))


def test_a_quarantined_gpu_gets_one_rule_owned_by_its_node_and_an_event_naming_it() -> None:
    async def go() -> None:
        kube, fleet, taints, events, _ = setup()
        quarantine(fleet, "a", 3)
        await taints.sync()
        await taints.sync()
        assert kube.writes == ["create gpufleet-a-gpu-3"]
        body = kube.rules["gpufleet-a-gpu-3"]
        assert body["spec"]["deviceSelector"] == {
            "driver": "gpu.gpufleet.io",
            "pool": "a",
            "device": "gpu-3",
        }
        assert body["spec"]["taint"]["effect"] == "NoExecute"
        assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-a"
        ((node, reason, message),) = events.said
        assert (node, reason) == ("a", "GpuTainted")
        assert "GPU 3 (GPU-a-3)" in message and "xid-94" in message

    asyncio.run(go())


def test_a_released_quarantine_deletes_its_rule_and_the_others_stay() -> None:
    async def go() -> None:
        kube, fleet, taints, events, _ = setup()
        quarantine(fleet, "a", 1, 2)
        await taints.sync()
        quarantine(fleet, "a", 2)
        await taints.sync()
        assert sorted(kube.rules) == ["gpufleet-a-gpu-2"]
        assert events.said[-1][1] == "GpuUntainted" and "GPU 1" in events.said[-1][2]

    asyncio.run(go())


def test_rules_gpufleet_did_not_make_are_never_touched() -> None:
    async def go() -> None:
        kube, _, taints, _, _ = setup()
        theirs = codec.taint_rule(dra.TaintRule("a", 4, "", "by-hand"))
        theirs["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "someone"}
        theirs["metadata"]["name"] = "gpufleet-a-gpu-4"  # even under a name gpufleet uses
        kube.rules["gpufleet-a-gpu-4"] = theirs
        kube.rules["vendor"] = {"metadata": {"name": "vendor", "labels": {}}, "spec": {}}
        await taints.sync()  # no quarantine: nothing wanted, nothing of gpufleet's there
        assert kube.writes == []
        assert set(kube.rules) == {"gpufleet-a-gpu-4", "vendor"}

    asyncio.run(go())


def test_a_rule_of_gpufleets_changed_by_hand_is_put_back_and_a_deleted_one_recreated() -> None:
    async def go() -> None:
        kube, fleet, taints, _, clock = setup()
        quarantine(fleet, "a", 0)
        await taints.sync()
        kube.rules["gpufleet-a-gpu-0"]["spec"]["taint"]["effect"] = "None"
        clock.advance(31)  # no record changed: the resync reads the rules again
        await taints.sync()
        assert kube.rules["gpufleet-a-gpu-0"]["spec"]["taint"]["effect"] == "NoExecute"
        del kube.rules["gpufleet-a-gpu-0"]
        clock.advance(31)
        await taints.sync()
        assert kube.writes == [
            "create gpufleet-a-gpu-0",
            "patch gpufleet-a-gpu-0",
            "create gpufleet-a-gpu-0",
        ]

    asyncio.run(go())


def test_paused_changes_nothing_and_dry_run_only_says_it_once() -> None:
    async def go() -> None:
        kube, fleet, taints, events, _ = setup(paused=True)
        quarantine(fleet, "a", 5)
        await taints.sync()
        assert kube.writes == [] and events.said == []
        kube, fleet, taints, events, clock = setup(dry_run=True)
        quarantine(fleet, "a", 5)
        await taints.sync()
        clock.advance(31)
        await taints.sync()
        assert kube.writes == []
        assert [(r, "would taint GPU 5" in m) for _, r, m in events.said] == [("DryRun", True)]

    asyncio.run(go())


def test_without_the_list_nothing_is_created_or_deleted() -> None:
    async def go() -> None:
        kube, fleet, taints, _, _ = setup()
        kube.fail_list = True
        quarantine(fleet, "a", 1)
        await taints.sync()
        assert kube.writes == []
        kube.fail_list = False
        await taints.sync()  # the failed pass was not counted as done
        assert kube.writes == ["create gpufleet-a-gpu-1"]

    asyncio.run(go())
