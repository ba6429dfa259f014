"""gpufleet cleanup --dra: gpufleet's ResourceSlices and DeviceTaintRules go, anyone else's
stay, and a cluster that serves no DeviceTaintRule is no error."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import dra as codec
from gpufleet.domain import dra
from gpufleet.kubeapi import ObjectList
from gpufleet.kubeapi.errors import NotFound
from gpufleet.kubeapi.resources import DEVICE_TAINT_RULES, RESOURCE_SLICES, Resource
from gpufleet.lifecycle import uninstall


class DraObjects:
    def __init__(self, *, rules_served: bool = True) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rules_served = rules_served
        self.deleted: list[str] = []

    def put(self, resource: Resource, body: dict[str, Any]) -> None:
        self.objects[(str(resource), body["metadata"]["name"])] = body

    async def list(self, resource: Resource, *, label_selector: str = "") -> ObjectList:
        if resource == DEVICE_TAINT_RULES and not self.rules_served:
            raise NotFound("list devicetaintrules", 404, "the server could not find it")
        key, value = label_selector.split("=")
        return ObjectList(
            items=[
                b
                for (r, _), b in self.objects.items()
                if r == str(resource) and b["metadata"].get("labels", {}).get(key) == value
            ]
        )

    async def delete(self, resource: Resource, name: str) -> None:
        del self.objects[(str(resource), name)]
        self.deleted.append(name)


def test_cleanup_deletes_gpufleets_slices_and_rules_and_leaves_the_rest() -> None:
    kube = DraObjects()
    ours = codec.taint_rule(dra.TaintRule("n1", 2, "", "xid-94"))
    theirs = codec.taint_rule(dra.TaintRule("n1", 3, "", "by-hand"))
    theirs["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "someone"}
    theirs["metadata"]["name"] = "by-hand"
    kube.put(DEVICE_TAINT_RULES, ours)
    kube.put(DEVICE_TAINT_RULES, theirs)
    kube.put(RESOURCE_SLICES, codec.resource_slice("n1", [], generation=1))
    vendor = {"metadata": {"name": "n1-gpu.nvidia.com", "labels": {}}}
    kube.put(RESOURCE_SLICES, vendor)
    report = uninstall.Report()
    said: list[str] = []
    asyncio.run(
        uninstall.remove_dra(kube, dry_run=False, progress=said.append, report=report)  # type: ignore[arg-type]
    )
    assert report.dra_removed == [
        "devicetaintrule/gpufleet-n1-gpu-2",
        "resourceslice/n1-gpu.gpufleet.io",
    ]
    assert sorted(name for _, name in kube.objects) == ["by-hand", "n1-gpu.nvidia.com"]
    assert report.as_json()["draRemoved"] == report.dra_removed


def test_a_dry_run_deletes_nothing_and_no_rules_served_is_no_error() -> None:
    kube = DraObjects(rules_served=False)
    kube.put(RESOURCE_SLICES, codec.resource_slice("n1", [], generation=1))
    report = uninstall.Report(dry_run=True)
    said: list[str] = []
    asyncio.run(
        uninstall.remove_dra(kube, dry_run=True, progress=said.append, report=report)  # type: ignore[arg-type]
    )
    assert kube.deleted == [] and report.dra_removed == ["resourceslice/n1-gpu.gpufleet.io"]
    assert said == ["resourceslice n1-gpu.gpufleet.io: would delete"]
