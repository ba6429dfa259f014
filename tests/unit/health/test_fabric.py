"""NVLink fabric: Fabric Manager registration, IMEX where it applies, clique labels."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.domain import well_known
from gpufleet.domain.faults import FaultKind, Subsystem
from gpufleet.domain.policy import default_policy
from gpufleet.health import fabric
from gpufleet.health.agent import Agent, AgentSettings
from gpufleet.health.backend_sim import InjectionError, SimulatedHardware
from gpufleet.health.hardware import HardwareError
from gpufleet.health.monitors import PassiveMonitors
from gpufleet.health.skus import bundled

H100 = bundled().get("h100-sxm")
SMI: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parents[2] / "fixtures" / "health" / "nvidia-smi-fabric.yaml").read_text()
)


@pytest.mark.parametrize("case", SMI, ids=[c["name"][:50] for c in SMI])
def test_nvidia_smi_fabric_blocks(case: dict[str, Any]) -> None:
    assert case["source"].startswith("https://")
    raw = fabric.parse_smi_fabric(case["text"])
    gpus = [g for g in (fabric.from_raw(r) for r in raw) if g is not None]
    assert len(gpus) == 1 and fabric.unreadable(gpus) is None
    found = fabric.faults(gpus, node="n", now=1.0)
    assert [f.kind.value for f in found] == case["expect"]["faults"]
    assert all(f.subsystem is Subsystem.FABRIC for f in found)
    assert fabric.topology_labels(gpus) == case["expect"]["labels"]


def test_a_full_nvidia_smi_document_is_split_per_gpu() -> None:
    text = (
        "==============NVSMI LOG==============\n\nAttached GPUs : 2\n"
        "GPU 00000000:18:00.0\n    Product Name : NVIDIA H100 80GB HBM3\n"
        "    Fabric\n        State : Completed\n        Status : Success\n"
        "        CliqueId : 0\n        ClusterUUID : 00000000-0000-0000-0000-000000000000\n"
        "    Processes : None\n"
        "GPU 00000000:2A:00.0\n    Fabric\n        State : In Progress\n        Status : N/A\n"
    )
    raw = fabric.parse_smi_fabric(text)
    assert [r["pci_bus_id"] for r in raw] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert (
        raw[0]["fabric_state"] == fabric.COMPLETED and raw[1]["fabric_state"] == fabric.IN_PROGRESS
    )
    assert "Processes" not in str(raw[0])


def test_h100_nvswitch_node_has_no_fault_no_labels_and_no_imex() -> None:
    """HGX H100: registration completes with a zero cluster UUID and clique 0 (NVML's
    values there, as https://github.com/meta-pytorch/torchcomms/pull/1385 reports)."""
    hw = SimulatedHardware(fabric="hgx", hcas=0)
    try:
        snap = PassiveMonitors(hw, H100, node="n").poll(1.0)
        assert hw.imex_status() is None
        with pytest.raises(InjectionError, match="no IMEX"):
            hw.inject("imex-not-ready")
    finally:
        hw.close()
    obs = snap.observations[Subsystem.FABRIC]
    assert obs.readable and obs.faults == () and obs.instant == ()
    assert snap.labels == {
        well_known.LABEL_NVLINK_CLUSTER: None,
        well_known.LABEL_NVLINK_CLIQUE: None,
    }


def test_pcie_gpus_without_a_fabric_are_not_judged() -> None:
    hw = SimulatedHardware(fabric="none", hcas=0)
    try:
        snap = PassiveMonitors(hw, H100, node="n").poll(1.0)
        with pytest.raises(InjectionError):
            hw.inject("fabric-not-ready,gpu=1")
    finally:
        hw.close()
    assert snap.observations[Subsystem.FABRIC].readable
    assert not snap.observations[Subsystem.FABRIC].faults


def test_nvl72_node_publishes_its_clique_and_watches_imex() -> None:
    hw = SimulatedHardware(fabric="nvl72", clique=7, hcas=0)
    monitors = PassiveMonitors(hw, H100, node="n")
    try:
        snap = monitors.poll(1.0)
        assert snap.labels == {
            well_known.LABEL_NVLINK_CLUSTER: "9c6f5af3-53bf-49b5-a436-b66766c413c3",
            well_known.LABEL_NVLINK_CLIQUE: "9c6f5af3-53bf-49b5-a436-b66766c413c3.7",
        }
        assert not snap.observations[Subsystem.FABRIC].faults
        hw.inject("imex-not-ready")
        hw.inject("fabric-not-ready,gpu=3,state=in-progress")
        snap = monitors.poll(2.0)
    finally:
        hw.close()
    kinds = sorted(
        (f.kind.value, f.evidence.gpu_index) for f in snap.observations[Subsystem.FABRIC].faults
    )
    assert kinds == [("fabric-not-ready", 3), ("imex-not-ready", None)]
    assert snap.labels is None  # a GPU still registering: the labels stay as they are


def test_unreadable_fabric_or_imex_is_unknown_not_healthy() -> None:
    class NoImex(SimulatedHardware):
        def imex_status(self) -> str | None:
            raise HardwareError("nvidia-imex-ctl did not answer in 10s")

    hw = NoImex(fabric="nvl72", hcas=0)
    try:
        obs = PassiveMonitors(hw, H100, node="n").poll(1.0).observations[Subsystem.FABRIC]
    finally:
        hw.close()
    assert not obs.readable and "IMEX" in obs.unreadable_reason
    gpus = [fabric.GpuFabric(0, state=None, status=None)]
    assert fabric.unreadable(gpus) == "fabric state of GPU 0 unreadable"
    assert fabric.topology_labels(gpus) is None


def test_nvswitch_sxids_from_the_simulator_reach_the_nvswitch_subsystem() -> None:
    hw = SimulatedHardware(hcas=0)
    monitors = PassiveMonitors(hw, H100, node="n")
    try:
        monitors.poll(1.0)
        hw.inject("nvswitch-fatal,switch=2,link=30")
        snap = monitors.poll(2.0)
    finally:
        hw.close()
    (fault,) = snap.observations[Subsystem.NVSWITCH].instant
    assert fault.kind is FaultKind.NVSWITCH_FATAL and fault.evidence.switch == "nvidia-nvswitch2"
    assert fault.evidence.counters == {"sxid": 24007, "link": 30}


class _Recorder:
    """A reporter that keeps what the agent writes."""

    def __init__(self, *, fail_labels: int = 0) -> None:
        self.labels: list[dict[str, str | None]] = []
        self.fail_labels = fail_labels

    async def set_conditions(self, reports: Any, now: float) -> None:
        return None

    async def set_annotations(self, reports: Any, now: float) -> None:
        return None

    async def event(self, fault: Any, **kwargs: Any) -> None:
        return None

    async def set_labels(self, labels: Mapping[str, str | None]) -> None:
        if self.fail_labels:
            self.fail_labels -= 1
            raise RuntimeError("apiserver said no")
        self.labels.append(dict(labels))


def test_the_agent_writes_the_clique_labels_once_and_retries_a_failure_after_resync() -> None:
    hw = SimulatedHardware(fabric="nvl72", clique=7, hcas=0)
    clock = [100.0]
    rec = _Recorder(fail_labels=1)
    agent = Agent(
        hw,
        H100,
        default_policy(),
        node="n",
        reporter=rec,
        settings=AgentSettings(resync_s=60.0),
        clock=lambda: clock[0],
    )

    async def one_poll() -> None:
        changed, events = agent.step(clock[0])
        await agent.publish(changed, events, clock[0])
        clock[0] += 1.0

    try:
        asyncio.run(one_poll())  # the write fails
        asyncio.run(one_poll())  # not retried within resync_s
        assert rec.labels == []
        clock[0] += 60.0
        asyncio.run(one_poll())
        asyncio.run(one_poll())  # unchanged: not written again
    finally:
        hw.close()
    assert rec.labels == [
        {
            well_known.LABEL_NVLINK_CLUSTER: "9c6f5af3-53bf-49b5-a436-b66766c413c3",
            well_known.LABEL_NVLINK_CLIQUE: "9c6f5af3-53bf-49b5-a436-b66766c413c3.7",
        }
    ]


def test_a_gb200_tray_is_judged_with_its_own_profile() -> None:
    """Four GPUs per GB200 compute tray: the H100 default would call half of them missing."""
    from gpufleet.health import skus

    profile = skus.choose(skus.load(None), sku=None, gpu_names=["NVIDIA GB200"])
    assert profile.name == "gb200" and profile.gpus_per_node == 4
    hw = SimulatedHardware(gpus=4, hcas=0, fabric="nvl72")
    try:
        snap = PassiveMonitors(hw, profile, node="n").poll(1.0)
    finally:
        hw.close()
    assert not [f for f in snap.faults() if f.kind is FaultKind.GPU_MISSING]
