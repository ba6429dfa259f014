"""Silent data corruption found in a training's own telemetry, reported on a real apiserver.

A replica-group training (one rank per group, each group on its own KWOK node of this
module) writes the telemetry of the contract (``gpufleet.domain.stragglers``): real
fingerprints of its numpy weights every five steps, losses and gradient norms every step.
One group's weights get bit 20 of their first element flipped after a step, as a GPU with
a silent fault does (and as the example job does on a node whose simulated GPUs say
``sdc_flip_at_step``). The nodes' agents run their real loop against the apiserver:

- three groups, one diverges: the majority names that group's node, whose agent raises
  ``GpuProblem`` with an ``sdc-mismatch`` naming the training, the step, the group, both
  fingerprints and the GPU; the other agents raise nothing;
- two groups disagree: nobody is trusted, both agents run the active SDC check at once
  (beside the job); on the node whose simulated GPU corrupts silently it fails and raises
  ``GpuProblem`` naming that GPU; on the other it passes and nothing is raised.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from controller_harness import Api, labelled_kwok_nodes
from waiting import wait_for_async

from gpufleet.domain import conditions, sdc_vote
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.policy import Detection, default_policy
from gpufleet.domain.stragglers import StepSample, rank_file_name, sample_line
from gpufleet.health.agent import Agent, AgentSettings
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.kube_report import KubeReporter
from gpufleet.health.skus import bundled
from gpufleet.health.telemetry import JobTelemetry

pytestmark = pytest.mark.integration

NAMED = ["sdc-vote-0", "sdc-vote-1", "sdc-vote-2"]
CHECKED = ["sdc-check-0", "sdc-check-1"]
GPU = 5
"""The local GPU every rank reports it ran on."""


@pytest.fixture(scope="module")
def api(local_cluster: Any) -> Iterator[Api]:
    api = Api(local_cluster)
    with labelled_kwok_nodes(
        api, "gpufleet.io/test-sdc", {"named": NAMED, "checked": CHECKED}, pool="sdc"
    ):
        yield api


async def train(root: Path, training: str, nodes: list[str], flip: dict[int, int]) -> None:
    """One rank per group ``g<i>`` on ``nodes[i]``, 20 steps; group ``i`` in ``flip`` flips
    a weight bit right after step ``flip[i]``'s update. Weights, losses and gradient norms
    are the same computation in every group (the groups average their gradients)."""
    weights = [
        [np.linspace(0.1, 0.9, 12, dtype=np.float32).reshape(3, 4), np.ones(4, np.float32)]
        for _ in nodes
    ]
    files = [root / f"{training}.0" / rank_file_name(i, n) for i, n in enumerate(nodes)]
    files[0].parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for step in range(1, 21):
        loss = 2.0 + 0.05 * rng.standard_normal()
        for i, (node, params) in enumerate(zip(nodes, weights, strict=True)):
            for p in params:
                p -= np.float32(0.01) * (p * np.float32(0.1) + np.float32(step * 0.001))
            if flip.get(i) == step:
                params[0].reshape(-1).view(np.uint32)[0] ^= np.uint32(1 << 20)
            digest = sdc_vote.fingerprint(np.ascontiguousarray(p).data for p in params)
            line = StepSample(
                training,
                0,
                i,
                node,
                step,
                0.05,
                time.time(),
                group=f"g{i}",
                fingerprint=digest if step % 5 == 0 else None,
                loss=loss + 0.01 * i,
                grad_norm=0.5,
                gpu=GPU,
            )
            with files[i].open("a") as f:
                f.write(sample_line(line) + "\n")
        await asyncio.sleep(0.05)


def agent_on(info: Any, node: str, hw: SimulatedHardware, root: Path) -> Agent:
    policy = default_policy().model_copy(
        update={"detection": Detection(raise_after_seconds=0, clear_after_seconds=1.0)}
    )
    return Agent(
        hw,
        bundled().get("h100-sxm"),
        policy,
        node=node,
        reporter=KubeReporter(node, kubeconfig=str(info.kubeconfig)),
        settings=AgentSettings(interval_s=0.2, telemetry_every_s=0.3),
        telemetry=JobTelemetry(root, node, policy.detection.stragglers),
    )


def gpu_problem(api: Api, node: str) -> dict[str, Any]:
    for c in api.node(node).get("status", {}).get("conditions") or []:
        if c["type"] == "GpuProblem":
            return dict(c)
    return {}


def faults(api: Api, node: str) -> list[Any]:
    c = gpu_problem(api, node)
    return conditions.faults_of(node, "GpuProblem", c.get("status", ""), c.get("message", ""))


async def run_agents(
    api: Api, agents: list[Agent], training: Any, raised: str
) -> dict[str, dict[str, Any]]:
    """The agents' loops while the training writes; until ``raised`` has GpuProblem=True."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop)) for a in agents]
    try:
        nodes = [a.node for a in agents]
        await wait_for_async(
            "GpuProblem=False at the start",
            lambda: all(gpu_problem(api, n).get("status") == "False" for n in nodes),
            15,
        )
        await training
        await wait_for_async(
            f"{raised}: GpuProblem=True",
            lambda: gpu_problem(api, raised).get("status") == "True",
            15,
        )
        await asyncio.sleep(1.0)  # the others have read the same steps meanwhile
        return {a.node: gpu_problem(api, a.node) for a in agents}
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def test_the_majority_of_replica_groups_names_the_diverged_node(api: Api, tmp_path: Path) -> None:
    hws = [SimulatedHardware(node=n) for n in NAMED]
    agents = [agent_on(api.info, n, hw, tmp_path) for n, hw in zip(NAMED, hws, strict=True)]

    async def scenario() -> dict[str, dict[str, Any]]:
        training = train(tmp_path, "llm", NAMED, flip={1: 7})
        return await run_agents(api, agents, training, NAMED[1])

    try:
        found = asyncio.run(scenario())
    finally:
        for hw in hws:
            hw.close()
    assert [found[n]["status"] for n in NAMED] == ["False", "True", "False"]
    (fault,) = faults(api, NAMED[1])
    assert fault.kind is FaultKind.SDC_MISMATCH and fault.evidence.gpu_index == GPU
    message = fault.evidence.message
    m = re.fullmatch(
        r"training llm step (\d+): group g1 holds weights ([0-9a-f]{16}), 2 of 3 replica "
        rf"groups hold ([0-9a-f]{{16}}); GPU {GPU}",
        message,
    )
    assert m is not None, message
    step, odd, majority = int(m[1]), m[2], m[3]
    assert step in (10, 15, 20) and odd != majority  # the first fingerprint after the flip
    lines = (tmp_path / "llm.0" / rank_file_name(0, NAMED[0])).read_text().splitlines()
    assert json.loads(lines[step - 1])["fingerprint"] == majority
    assert all(a.last_results == [] for a in agents)  # the vote was enough: no check ran


def test_two_groups_that_disagree_both_run_the_sdc_check(api: Api, tmp_path: Path) -> None:
    healthy, silent = SimulatedHardware(node=CHECKED[0]), SimulatedHardware(node=CHECKED[1])
    silent.inject(f"sdc-silent,gpu={GPU},step=12")
    for hw in (healthy, silent):
        hw.inject("busy")  # the job runs: the suspicion's check runs beside it
    agents = [agent_on(api.info, CHECKED[0], healthy, tmp_path)]
    agents.append(agent_on(api.info, CHECKED[1], silent, tmp_path))

    async def scenario() -> dict[str, dict[str, Any]]:
        training = train(tmp_path, "pair", CHECKED, flip={1: 12})
        return await run_agents(api, agents, training, CHECKED[1])

    try:
        found = asyncio.run(scenario())
    finally:
        healthy.close()
        silent.close()
    assert [found[n]["status"] for n in CHECKED] == ["False", "True"]
    assert [(r.name, r.status.label) for a in agents for r in a.last_results] == [
        ("sdc", "pass"),
        ("sdc", "fail"),
    ]
    (fault,) = faults(api, CHECKED[1])
    assert fault.kind is FaultKind.SDC_MISMATCH and fault.evidence.gpu_index == GPU
    message = fault.evidence.message
    assert message.startswith(f"GPU {GPU} GEMM result differs from the reference"), message
    assert re.search(r"training pair step (15|20): 2 replica groups hold different", message)
