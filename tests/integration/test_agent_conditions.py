"""An injected fault becomes a Node condition on a real apiserver, and clears again once
the controller has recorded it (played here: the ``gpufleet.io/faults-seen`` watermark)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest
from waiting import wait_for_async

from gpufleet.domain import conditions, well_known
from gpufleet.domain.policy import Detection, default_policy
from gpufleet.health.agent import Agent, AgentSettings
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.kube_report import KubeReporter
from gpufleet.health.skus import bundled

pytestmark = pytest.mark.integration


def node_json(info: Any, node: str) -> dict[str, Any]:
    out = subprocess.run(
        [str(info.kubectl), "get", "node", node, "-o", "json"],
        env=info.kube_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def condition(info: Any, node: str, ctype: str) -> dict[str, Any] | None:
    for c in node_json(info, node).get("status", {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return None


def record(info: Any, node: str, ctype: str | None, c: dict[str, Any] | None = None) -> None:
    """What the lifecycle controller writes with the record it decided: the watermark
    covering the latest occurrence of condition ``c`` (as read; None: remove it, as found)."""
    if ctype is None:
        arg = f"{well_known.ANNOTATION_FAULTS_SEEN}-"
    else:
        c = c or {}
        faults = conditions.faults_of(node, ctype, c.get("status", ""), c.get("message", ""))
        if not faults:
            return
        value = json.dumps({ctype: max(f.at for f in faults)})
        arg = f"{well_known.ANNOTATION_FAULTS_SEEN}={value}"
    subprocess.run(
        [str(info.kubectl), "annotate", "node", node, arg, "--overwrite"],
        env=info.kube_env(),
        capture_output=True,
        check=True,
        timeout=10,
    )


def cleared_once_recorded(info: Any, node: str, ctype: str) -> bool:
    """Whether the condition is clear; if not, record what it carries now, as the
    controller does with every version of it (a state fault's latest observation moves
    with each poll until it is gone)."""
    c = condition(info, node, ctype) or {}
    if c.get("status") == "True":
        record(info, node, ctype, c)
        return False
    return c.get("status") == "False"


def test_injected_xid_becomes_gpu_problem_within_2s_and_clears(local_cluster: Any) -> None:
    info = local_cluster
    node = info.node_names[-1]
    hw = SimulatedHardware(node=node)
    policy = default_policy().model_copy(
        update={"detection": Detection(raise_after_seconds=0, clear_after_seconds=1.0)}
    )
    agent = Agent(
        hw,
        bundled().get("h100-sxm"),
        policy,
        node=node,
        reporter=KubeReporter(node, kubeconfig=str(info.kubeconfig)),
        settings=AgentSettings(interval_s=0.2),
    )

    async def scenario() -> tuple[float, float]:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await wait_for_async(
                "GpuProblem=False at the start",
                lambda: (condition(info, node, "GpuProblem") or {}).get("status") == "False",
                10,
            )
            hw.inject("xid=79,gpu=3")
            raised = await wait_for_async(
                "GpuProblem=True",
                lambda: (condition(info, node, "GpuProblem") or {}).get("status") == "True",
                2.0,
            )
            c = condition(info, node, "GpuProblem")
            assert c is not None and c["reason"] == "Xid79"
            assert "GPU 3" in c["message"] and '"xid":79' in c["message"]
            assert condition(info, node, "Ready") is not None  # kubelet/KWOK conditions kept
            hw.recover()
            cleared = await wait_for_async(
                "GpuProblem=False again",
                lambda: cleared_once_recorded(info, node, "GpuProblem"),
                5.0,
            )
            return raised, cleared
        finally:
            stop.set()
            await task

    try:
        raised, cleared = asyncio.run(scenario())
    finally:
        hw.close()
        record(info, node, None)
    print(f"condition raised after {raised:.2f}s, cleared {cleared:.2f}s after recovery")
    events = subprocess.run(
        [
            str(info.kubectl),
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            f"involvedObject.name={node},reason=Xid79",
            "-o",
            "json",
        ],
        env=info.kube_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    assert json.loads(events.stdout)["items"], "no Xid79 Event on the Node"


def test_nvl72_node_gets_its_clique_labels_and_a_fabric_condition(local_cluster: Any) -> None:
    """A GB200 NVL72 tray (simulated NVML fabric values) is labelled with its NVLink
    domain; an IMEX daemon that stops answering READY raises FabricProblem."""
    info = local_cluster
    node = info.node_names[-1]
    hw = SimulatedHardware(node=node, fabric="nvl72", clique=4)
    policy = default_policy().model_copy(
        update={"detection": Detection(raise_after_seconds=0, clear_after_seconds=1.0)}
    )
    agent = Agent(
        hw,
        bundled().get("h100-sxm"),
        policy,
        node=node,
        reporter=KubeReporter(node, kubeconfig=str(info.kubeconfig)),
        settings=AgentSettings(interval_s=0.2),
    )
    cluster = "9c6f5af3-53bf-49b5-a436-b66766c413c3"

    def labels() -> dict[str, str]:
        return dict(node_json(info, node)["metadata"].get("labels") or {})

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await wait_for_async(
                "the NVLink clique labels",
                lambda: labels().get("gpufleet.io/nvlink-clique") == f"{cluster}.4",
                10,
            )
            assert labels()["gpufleet.io/nvlink-cluster"] == cluster
            hw.inject("imex-not-ready")
            await wait_for_async(
                "FabricProblem=True",
                lambda: (condition(info, node, "FabricProblem") or {}).get("status") == "True",
                5,
            )
            c = condition(info, node, "FabricProblem")
            assert c is not None and c["reason"] == "ImexNotReady" and "NOT_READY" in c["message"]
            hw.recover()  # leave the Node as other tests expect it
            await wait_for_async(
                "FabricProblem=False again",
                lambda: cleared_once_recorded(info, node, "FabricProblem"),
                5,
            )
        finally:
            stop.set()
            await task

    try:
        asyncio.run(scenario())
    finally:
        hw.close()
        record(info, node, None)
        subprocess.run(
            [
                str(info.kubectl),
                "label",
                "node",
                node,
                "gpufleet.io/nvlink-cluster-",
                "gpufleet.io/nvlink-clique-",
            ],
            env=info.kube_env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
