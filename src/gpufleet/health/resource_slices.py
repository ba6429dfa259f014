"""The agent publishes its node's GPUs as a DRA ResourceSlice (decision 0238).

Only where no vendor DRA driver publishes them (``gpufleet agent --dra-publish``, the
chart's ``dra.enabled``, off by default): one slice per node, driver
``gpu.gpufleet.io``, pool named after the node, one device per GPU (index, UUID and
product as attributes, memory as capacity; :mod:`gpufleet.api.dra`). Pods then claim a
GPU through the DeviceClass ``gpu.gpufleet.io``, and the controller can taint one of
them alone with a DeviceTaintRule when it is quarantined (decision 0239).

The slice is written when the GPUs the node sees differ from what it says (a GPU gone
from NVML, a new UUID after a board swap), each time with the pool's generation raised
so that the scheduler takes the newest; it is read again every ``every_s``. A read of
the hardware that fails leaves the slice as it is (a GPU is never unpublished for a
read error). The slice names the Node as its owner: it goes with the Node; ``gpufleet
cleanup`` deletes it on uninstall. Admission holds the agent to its own node's slice
(the chart's ``<release>-agent-own-slice`` ValidatingAdmissionPolicy).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpufleet.api import dra as dra_codec
from gpufleet.domain import dra
from gpufleet.health.hardware import Hardware, HardwareError, NoGpuFound
from gpufleet.health.nvml_values import parse_gpu
from gpufleet.kubeapi import NODES, ApiError, KubePort
from gpufleet.kubeapi.port import get_or_none
from gpufleet.kubeapi.resources import RESOURCE_SLICES
from gpufleet.waits import wait_set

log = logging.getLogger(__name__)

CHECK_EVERY = 10
"""Every this many passes the slice in the apiserver is read and put back if it differs."""

MEMORY_KEY = "memory_total_bytes"
"""The raw value set's key of a GPU's memory (``nvmlDeviceGetMemoryInfo().total``)."""


def devices_of(hw: Hardware) -> tuple[dra.GpuDevice, ...] | None:
    """The node's GPUs as devices; () without GPUs or driver; None when the hardware
    could not be read (the published slice then stays as it is)."""
    try:
        raws = hw.gpus()
    except NoGpuFound:
        return ()
    except HardwareError as exc:
        log.warning("GPUs not read, ResourceSlice left as it is: %s", exc)
        return None
    out: list[dra.GpuDevice] = []
    for raw in raws:
        reading = parse_gpu(raw)
        if reading is None:
            continue
        memory = raw.get(MEMORY_KEY)
        out.append(
            dra.GpuDevice(
                index=reading.index,
                uuid=reading.uuid or "",
                product=reading.name or "",
                memory_bytes=memory if isinstance(memory, int) and memory > 0 else None,
            )
        )
    return tuple(sorted(out, key=lambda d: d.index))


class SlicePublisher:
    """Keeps one node's ResourceSlice equal to the GPUs its hardware shows."""

    def __init__(
        self,
        hw: Hardware,
        node: str,
        connect: Callable[[], Awaitable[KubePort]],
        *,
        every_s: float = 30.0,
    ) -> None:
        self.hw = hw
        self.node = node
        self._connect = connect
        self.every_s = every_s
        self._published: tuple[dra.GpuDevice, ...] | None = None
        self._node_uid: str | None = None

    async def publish(self, *, check: bool = False) -> bool:
        """Write the slice if the hardware differs from what was published (``check``:
        or from what the apiserver holds: someone deleted or changed it); True when it
        is current."""
        devices = devices_of(self.hw)
        if devices is None:
            return False
        if devices == self._published and not check:
            return True
        try:
            await self._write(await self._connect(), devices)
        except ApiError as exc:  # written on the next pass
            log.warning("node=%s ResourceSlice not written: %s", self.node, exc)
            return False
        self._published = devices
        return True

    async def _write(self, api: KubePort, devices: tuple[dra.GpuDevice, ...]) -> None:
        name = dra.slice_name(self.node)
        if self._node_uid is None:
            node = await get_or_none(api, NODES, self.node)
            self._node_uid = node["metadata"].get("uid") if node else None
        existing = await get_or_none(api, RESOURCE_SLICES, name)
        if existing is not None and dra_codec.slice_devices(existing) == devices:
            return
        generation = dra_codec.slice_generation(existing) + 1 if existing is not None else 1
        body = dra_codec.resource_slice(
            self.node, devices, generation=generation, node_uid=self._node_uid
        )
        if existing is None:
            await api.create(RESOURCE_SLICES, body)
        else:  # the devices list is replaced whole; resourceVersion guards the generation
            patch = {
                "metadata": {
                    "resourceVersion": existing["metadata"]["resourceVersion"],
                    "labels": body["metadata"]["labels"],
                },
                "spec": body["spec"],
            }
            await api.patch(RESOURCE_SLICES, name, patch)
        log.info(
            "node=%s ResourceSlice %s: %d GPU(s), pool generation %d",
            self.node,
            name,
            len(devices),
            generation,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Publish now, then every ``every_s`` until ``stop`` is set; every
        :data:`CHECK_EVERY` passes the apiserver's slice is read too (without it, one
        GET per node per pass)."""
        passes = 0
        while not stop.is_set():
            try:
                await self.publish(check=passes % CHECK_EVERY == 0)
                passes += 1
            except Exception:  # publishing must never stop the agent
                log.exception("node=%s ResourceSlice not published", self.node)
            await wait_set(stop, self.every_s)
