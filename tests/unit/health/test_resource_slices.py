"""The agent's ResourceSlice: its node's GPUs, republished when they change, left as it
is when the hardware cannot be read."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpufleet.api import dra as codec
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.hardware import HardwareError
from gpufleet.health.resource_slices import SlicePublisher, devices_of
from gpufleet.kubeapi import NODES, KubePort
from gpufleet.kubeapi.errors import NotFound
from gpufleet.kubeapi.resources import RESOURCE_SLICES, Json, Patch, Resource

from ..fakes import UnmodelledKube


class SliceKube(UnmodelledKube):
    def __init__(self) -> None:
        self.slices: dict[str, Json] = {}
        self.writes: list[str] = []
        self.version = 0

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        if resource == NODES:
            return {"metadata": {"name": name, "uid": "uid-1"}}
        assert resource == RESOURCE_SLICES
        if name not in self.slices:
            raise NotFound(f"get {name}", 404, "not found")
        return self.slices[name]

    def _stamp(self, body: Json) -> Json:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        return body

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        self.writes.append("create")
        self.slices[body["metadata"]["name"]] = self._stamp(dict(body))
        return self.slices[body["metadata"]["name"]]

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
        body = self.slices[name]
        assert patch["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]
        self.writes.append("patch")
        body["spec"] = patch["spec"]
        return self._stamp(body)


def publisher(hw: SimulatedHardware) -> tuple[SliceKube, SlicePublisher]:
    kube = SliceKube()

    async def connect() -> KubePort:
        return kube

    return kube, SlicePublisher(hw, "gpu-node-0001", connect)


def test_the_simulated_gpus_are_published_with_uuid_and_product() -> None:
    hw = SimulatedHardware(node="gpu-node-0001")
    devices = devices_of(hw)
    assert devices is not None and [d.index for d in devices] == list(range(8))
    assert devices[3].uuid.startswith("GPU-") and devices[3].product.startswith("NVIDIA H100")
    assert devices[3].memory_bytes is not None and devices[3].memory_bytes > 80 * 10**9


def test_a_gpu_gone_is_republished_with_a_higher_pool_generation() -> None:
    async def go() -> None:
        hw = SimulatedHardware(node="gpu-node-0001")
        kube, slices = publisher(hw)
        assert await slices.publish()
        assert await slices.publish()  # unchanged: not written again
        (body,) = kube.slices.values()
        assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert codec.slice_generation(body) == 1 and len(body["spec"]["devices"]) == 8
        hw.inject("gpu-missing,gpu=3")
        assert await slices.publish()
        assert kube.writes == ["create", "patch"]
        assert codec.slice_generation(body) == 2
        assert [d["name"] for d in body["spec"]["devices"]] == [
            f"gpu-{i}" for i in (0, 1, 2, 4, 5, 6, 7)
        ]

    asyncio.run(go())


def test_a_slice_changed_or_deleted_by_someone_is_put_back_when_checked() -> None:
    async def go() -> None:
        hw = SimulatedHardware(node="gpu-node-0001")
        kube, slices = publisher(hw)
        await slices.publish()
        kube.slices.clear()
        assert await slices.publish()  # not checked: the publisher trusts what it wrote
        assert kube.writes == ["create"]
        assert await slices.publish(check=True)
        assert kube.writes == ["create", "create"]

    asyncio.run(go())


def test_an_unreadable_hardware_leaves_the_slice_as_it_is() -> None:
    class Broken(SimulatedHardware):
        def gpus(self) -> list[dict[str, Any]]:
            raise HardwareError("NVML: driver/library version mismatch")

    async def go() -> None:
        kube, slices = publisher(Broken(node="gpu-node-0001"))
        assert not await slices.publish()
        assert kube.writes == []

    asyncio.run(go())
