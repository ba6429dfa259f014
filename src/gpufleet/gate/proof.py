"""The fresh proof that a node is empty, read at the moment of the act.

Kubernetes: the node's pods listed from the apiserver (never a cache), judged
by :func:`gpufleet.domain.emptiness.pod_holds_node`. Slurm: a probe written on
the Node, answered by the syncer with a report it read from Slurm after it saw
the probe (:class:`gpufleet.domain.emptiness.Probe`); a report taken before the
drain, or before the probe, does not count (docs/decisions/0145).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.clock import Clock
from gpufleet.domain import emptiness, well_known
from gpufleet.domain.policy import SlurmSilence, SlurmWait
from gpufleet.kubeapi import NODES, PODS, KubePort


@dataclass(frozen=True, slots=True)
class Verdict:
    """Empty or not, and a sentence saying what was seen."""

    empty: bool
    why: str


async def pods_holding(kube: KubePort, node: str) -> list[str]:
    """``namespace/name`` of every pod on the node that is work (read from the apiserver)."""
    listing = await kube.list(PODS, field_selector=f"spec.nodeName={node}")
    return [_pod_name(p) for p in listing.items if emptiness.pod_holds_node(p)]


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


async def slurm_verdict(
    kube: KubePort,
    node: str,
    *,
    incident: float | None,
    mode: SlurmWait,
    if_silent: SlurmSilence,
    clock: Clock,
    timeout_s: float,
    poll_s: float,
) -> Verdict:
    """Ask the syncer what Slurm says about ``node`` now, and judge its answer.

    Bounded: at most ``timeout_s`` of polls of the Node. No answer is silence:
    the node is not empty unless the rule says ``ifSlurmSilent: proceed``.
    """
    if mode is SlurmWait.NEVER:
        return Verdict(True, "the policy says no Slurm runs here (drain.slurm: never)")
    probe = emptiness.Probe(secrets.token_hex(8), clock.now(), incident)
    await kube.patch(
        NODES,
        node,
        {"metadata": {"annotations": {well_known.ANNOTATION_SLURM_PROBE: probe.to_annotation()}}},
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        body = await kube.get(NODES, node)
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        work = emptiness.SlurmWork.from_annotation(
            annotations.get(well_known.ANNOTATION_SLURM_WORK)
        )
        if work is not None and work.probe == probe.id:
            return _judge(work, mode)
        if loop.time() >= deadline:
            break
        await asyncio.sleep(poll_s)
    if if_silent is SlurmSilence.PROCEED:
        return Verdict(True, f"Slurm did not answer in {timeout_s:g}s; the rule says proceed")
    return Verdict(
        False,
        f"Slurm did not answer the probe in {timeout_s:g}s (syncer or slurmctld silent): "
        "failing closed",
    )


def _judge(work: emptiness.SlurmWork, mode: SlurmWait) -> Verdict:
    if work.absent:
        if mode is SlurmWait.ALWAYS:
            return Verdict(False, "Slurm has no node for it, but drain.slurm is always")
        return Verdict(True, "Slurm has no node for it (the syncer looked, just now)")
    if work.empty:
        return Verdict(True, f"Slurm says {work.state}, no job (read just now)")
    if not work.idle:
        jobs = ", ".join(work.jobs) or "none listed"
        return Verdict(False, f"Slurm says {work.state}, running jobs: {jobs}")
    return Verdict(False, f"Slurm says {work.state}: not drained")
