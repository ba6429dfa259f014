"""The slurmd roll: the operator replaces outdated slurmd pods the Slurm way.

The chart's slurmd DaemonSet updates ``OnDelete``: after a ``helm upgrade`` that
changes its pod template, Kubernetes replaces nothing. Each pass of
:class:`SlurmdRoll` reads the DaemonSet, its pods, the Nodes it selects and Slurm's
nodes and jobs, asks :func:`gpufleet.domain.slurmd_roll.plan` what to do, and does it:
drain (``gpufleet: slurmd upgrade``), delete an empty held node's outdated pod, resume
the roll's own drain once the new slurmd registered. Every write is preceded by a
fresh read of that node and of the running jobs, decided again (``still``): a job that
started or an admin's drain a moment ago is never acted on from the pass's snapshot.

Fail closed: a DaemonSet that is not ``OnDelete``, has no template generation, or a
Slurm that does not answer: nothing is done. ``dry_run`` logs the steps and writes
nothing; the DaemonSet's annotation ``gpufleet.io/slurmd-roll: paused`` pauses the
roll (``kubectl annotate ds/<name> gpufleet.io/slurmd-roll=paused``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import slurmd_roll
from gpufleet.domain.enrollment import parse_rfc3339
from gpufleet.domain.slurm_reasons import ROLL_REASON
from gpufleet.domain.slurmd_roll import Act, RollNode, RollPlan, RollStep, SlurmdPod
from gpufleet.kubeapi import NODES, PODS, KubePort, NotFound, Resource, get_or_none
from gpufleet.slurm.errors import SlurmError
from gpufleet.slurm.ports import ScontrolPort, SlurmRestPort

log = logging.getLogger("gpufleet.slurm.slurmd_roll")

DAEMONSETS = Resource("daemonsets", "apps/v1")
TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"
"""DaemonSet annotation the apiserver moves on every pod template change."""
POD_TEMPLATE_GENERATION = "pod-template-generation"
"""Pod label the DaemonSet controller sets to the generation the pod was made from."""
ANNOTATION_ROLL = "gpufleet.io/slurmd-roll"
"""DaemonSet annotation, set by a person: ``paused`` pauses the roll."""


@dataclass(frozen=True)
class RollSettings:
    namespace: str
    daemonset: str
    max_unavailable: int = 1
    """Nodes out because of the roll at once (the chart's ``slurm.slurmd.maxUnavailable``)."""
    dry_run: bool = False


def selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def pod_view(pod: Mapping[str, Any], generation: str) -> SlurmdPod:
    meta = pod["metadata"]
    conditions = (pod.get("status") or {}).get("conditions") or []
    return SlurmdPod(
        name=meta["name"],
        current=(meta.get("labels") or {}).get(POD_TEMPLATE_GENERATION) == generation,
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        deleting=bool(meta.get("deletionTimestamp")),
        created_at=parse_rfc3339(meta.get("creationTimestamp")) or 0.0,
    )


class SlurmdRoll:
    """One DaemonSet's roll; :meth:`run_pass` is called by the operator's loop."""

    def __init__(
        self,
        *,
        kube: KubePort,
        rest: SlurmRestPort,
        writes: ScontrolPort,
        settings: RollSettings,
    ) -> None:
        self.kube, self.rest, self.writes = kube, rest, writes
        self.settings = settings
        self._said: dict[str, str] = {}
        """Per node, the last wait logged (a wait is logged when it changes)."""

    async def run_pass(self) -> RollPlan | None:
        """Read, plan, act; None when nothing could be planned (fail closed)."""
        s = self.settings
        ds = await get_or_none(self.kube, DAEMONSETS, s.daemonset, namespace=s.namespace)
        if ds is None:
            self._say("-", f"no DaemonSet {s.namespace}/{s.daemonset}")
            return None
        meta, spec = ds["metadata"], ds.get("spec") or {}
        strategy = (spec.get("updateStrategy") or {}).get("type")
        generation = (meta.get("annotations") or {}).get(TEMPLATE_GENERATION)
        if strategy != "OnDelete" or not generation:
            self._say("-", f"DaemonSet {s.daemonset}: {strategy} (Kubernetes rolls it), no roll")
            return None
        paused = (meta.get("annotations") or {}).get(ANNOTATION_ROLL) == "paused"
        try:
            nodes = await self._read(ds, generation)
        except SlurmError as e:
            self._say("-", f"Slurm cannot be read, nothing done: {e}")
            return None
        planned = slurmd_roll.plan(nodes, max_unavailable=s.max_unavailable, paused=paused)
        for step in planned.steps:
            if step.act in (Act.WAIT, Act.DONE):
                self._say(step.node, step.why if step.act is Act.WAIT else "")
                continue
            try:
                await self._act(step, ds, generation, paused)
            except (SlurmError, NotFound) as e:
                log.warning("node=%s %s failed: %s", step.node, step.act.value, e)
        return planned

    async def _read(self, ds: Mapping[str, Any], generation: str) -> list[RollNode]:
        s = self.settings
        spec = ds.get("spec") or {}
        match = (spec.get("selector") or {}).get("matchLabels") or {}
        pods = await self.kube.list(PODS, namespace=s.namespace, label_selector=selector(match))
        by_node = {
            p["spec"]["nodeName"]: pod_view(p, generation)
            for p in pods.items
            if (p.get("spec") or {}).get("nodeName")
        }
        wanted = ((spec.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
        selected = await self.kube.list(NODES, label_selector=selector(wanted)) if wanted else None
        names = set(by_node) | {n["metadata"]["name"] for n in (selected.items if selected else [])}
        if self.rest.version is None:
            await self.rest.connect()
        views = await self.rest.nodes()
        jobs = await self.rest.running_jobs()
        return [
            RollNode(
                name=n,
                pod=by_node.get(n),
                slurm=views.get(n),
                jobs=sum(1 for j in jobs if n in j.nodes),
            )
            for n in sorted(names)
        ]

    async def _fresh(self, step: RollStep, ds: Mapping[str, Any], generation: str) -> RollNode:
        """The step's node read again right before its write: its pod, then Slurm's node
        and the running jobs, the one the write depends on most read last (the jobs before
        a pod's delete, the node's drain and reason before a drain or a resume): nothing in
        Slurm can make the write conditional, so what changes between that read and the
        write is the only window left (a drain set by the syncer's take-over just after
        the node was read was resumed when the node was read before the jobs and the pod;
        found by the simulation, decision 0217)."""
        s = self.settings
        match = ((ds.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        pods = await self.kube.list(
            PODS,
            namespace=s.namespace,
            label_selector=selector(match),
            field_selector=f"spec.nodeName={step.node}",
        )
        pod = pod_view(pods.items[0], generation) if pods.items else None
        if step.act is Act.REPLACE:
            view = await self.rest.node(step.node)
            jobs = await self.rest.running_jobs()
        else:
            jobs = await self.rest.running_jobs()
            view = await self.rest.node(step.node)
        busy = sum(1 for j in jobs if step.node in j.nodes)
        return RollNode(name=step.node, pod=pod, slurm=view, jobs=busy)

    async def _act(
        self, step: RollStep, ds: Mapping[str, Any], generation: str, paused: bool
    ) -> None:
        fresh = await self._fresh(step, ds, generation)
        if not slurmd_roll.still(step, [fresh], paused=paused):
            log.info("node=%s %s not done: changed since the pass read it", step.node, step.act)
            return
        what = {
            Act.DRAIN: f"drain ({ROLL_REASON!r}): {step.why}",
            Act.REPLACE: f"delete pod {step.pod}: {step.why}",
            Act.RESUME: f"resume: {step.why}",
        }[step.act]
        if self.settings.dry_run:
            self._say(step.node, f"dry-run: would {what}")
            return
        if step.act is Act.DRAIN:
            await self.writes.drain(step.node, ROLL_REASON)
        elif step.act is Act.REPLACE and step.pod is not None:
            await self.kube.delete(PODS, step.pod, namespace=self.settings.namespace)
        elif step.act is Act.RESUME:
            await self.writes.undrain(step.node)
        self._said.pop(step.node, None)
        log.info("node=%s slurmd roll: %s", step.node, what)

    def _say(self, node: str, text: str) -> None:
        if text and self._said.get(node) != text:
            log.info("node=%s slurmd roll: %s", node, text)
        self._said[node] = text
