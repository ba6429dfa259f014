"""The slurmd roll's adapter: what it reads, the fresh read before each write, fail closed,
dry-run and pause; and slurmd's start time read from both REST layouts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gpufleet.domain import slurm_sync
from gpufleet.domain.slurm_reasons import ROLL_REASON
from gpufleet.kubeapi import Json, ObjectList, Resource
from gpufleet.slurm import restapi
from gpufleet.slurm.slurmd_roll import ANNOTATION_ROLL, RollSettings, SlurmdRoll

from ..fakes import FakeSlurm, UnmodelledKube

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
NODES = ("a", "b")


class Cluster(UnmodelledKube):
    """The slurmd DaemonSet and its pods; a deleted pod comes back current, as the
    DaemonSet controller would make it."""

    def __init__(self, *, strategy: str = "OnDelete") -> None:
        self.ds: Json = {
            "metadata": {
                "name": "slurmd",
                "namespace": "slurm",
                "annotations": {"deprecated.daemonset.template.generation": "2"},
            },
            "spec": {
                "updateStrategy": {"type": strategy},
                "selector": {"matchLabels": {"app": "slurmd"}},
                "template": {"spec": {"nodeSelector": {"gpufleet.io/slurm-cluster": "s.c"}}},
            },
        }
        self.pods = {n: self.pod(n, "1") for n in NODES}
        self.deleted: list[str] = []

    @staticmethod
    def pod(node: str, generation: str) -> Json:
        return {
            "metadata": {
                "name": f"slurmd-{node}-{generation}",
                "labels": {"app": "slurmd", "pod-template-generation": generation},
                "creationTimestamp": "2026-11-29T10:00:00Z",
            },
            "spec": {"nodeName": node},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        assert (resource.plural, name, namespace) == ("daemonsets", "slurmd", "slurm")
        return self.ds

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        if resource.plural == "nodes":
            assert label_selector == "gpufleet.io/slurm-cluster=s.c"
            return ObjectList([{"metadata": {"name": n}} for n in NODES], "1")
        assert label_selector == "app=slurmd"
        node = field_selector.removeprefix("spec.nodeName=")
        items = [p for n, p in self.pods.items() if not field_selector or n == node]
        return ObjectList(items, "1")

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        self.deleted.append(name)
        node = next(n for n, p in self.pods.items() if p["metadata"]["name"] == name)
        self.pods[node] = self.pod(node, "2")


def roll(kube: Cluster, slurm: FakeSlurm, **settings: Any) -> SlurmdRoll:
    return SlurmdRoll(
        kube=kube, rest=slurm, writes=slurm, settings=RollSettings("slurm", "slurmd", **settings)
    )


def busy(slurm: FakeSlurm, node: str) -> None:
    slurm.views[node] = slurm_sync.SlurmView("allocated", frozenset(), None)
    slurm.jobs = [slurm_sync.JobView(7, 1, True, frozenset({node}))]


def test_an_idle_node_is_drained_replaced_and_resumed_a_busy_one_waits() -> None:
    kube, slurm = Cluster(), FakeSlurm(NODES)
    busy(slurm, "a")
    r = roll(kube, slurm)
    asyncio.run(r.run_pass())
    assert slurm.calls == [("drain", "b", ROLL_REASON)]
    asyncio.run(r.run_pass())
    assert kube.deleted == ["slurmd-b-1"]
    # The new slurmd registers: slurmctld reports a start after the pod was made.
    view = slurm.views["b"]
    slurm.views["b"] = slurm_sync.SlurmView(
        view.state, view.flags, view.reason, slurmd_started=1_900_000_000.0
    )
    asyncio.run(r.run_pass())
    assert slurm.calls[-1] == ("undrain", "b")
    asyncio.run(r.run_pass())  # now a's turn: drained, its pod kept while job 7 runs
    assert slurm.calls[-1] == ("drain", "a", ROLL_REASON)
    slurm.views["a"] = slurm_sync.SlurmView("allocated", frozenset({"DRAIN"}), ROLL_REASON)
    asyncio.run(r.run_pass())
    assert kube.deleted == ["slurmd-b-1"]


def test_a_job_that_starts_after_the_pass_read_keeps_the_pod() -> None:
    """The pass saw the node drained and empty; the fresh read before the delete sees a
    job (an admin resumed it and a job landed): no delete."""
    kube, slurm = Cluster(), FakeSlurm(NODES)
    slurm.views["b"] = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), ROLL_REASON)
    r = roll(kube, slurm)
    original = slurm.node

    async def node_then_job(name: str) -> slurm_sync.SlurmView | None:
        busy(slurm, name)
        return await original(name)

    slurm.node = node_then_job  # type: ignore[method-assign]
    asyncio.run(r.run_pass())
    assert kube.deleted == []


def test_nothing_is_done_when_slurm_is_down_paused_dry_run_or_rolling_update() -> None:
    kube, slurm = Cluster(), FakeSlurm(NODES)
    slurm.down = True
    assert asyncio.run(roll(kube, slurm).run_pass()) is None
    slurm.down = False
    assert asyncio.run(roll(kube, slurm, dry_run=True).run_pass()) is not None
    kube.ds["metadata"]["annotations"][ANNOTATION_ROLL] = "paused"
    asyncio.run(roll(kube, slurm).run_pass())
    assert asyncio.run(roll(Cluster(strategy="RollingUpdate"), slurm).run_pass()) is None
    assert slurm.calls == [] and kube.deleted == []


def test_slurmd_start_time_is_read_from_both_rest_layouts() -> None:
    for name in ("rest_v0.0.38_node.json", "24.11/v0.0.40_node.json"):
        raw = json.loads((FIXTURES / name).read_text())["nodes"][0]
        assert restapi.node_view(raw).slurmd_started == float(
            restapi.number(raw["slurmd_start_time"]) or 0
        )
        assert restapi.node_view(raw).slurmd_started
