"""The slurmd DaemonSet, its pods, slurmd itself, and the Slurm operator that rolls them.

In a run with ``Config.slurmd_roll`` (decision 0217) every node runs a slurmd pod of
the chart's DaemonSet (``updateStrategy: OnDelete``), and the Slurm operator runs as a
process: the real :class:`~gpufleet.slurm.operator.ClusterOperator` with the real
:class:`~gpufleet.slurm.slurmd_roll.SlurmdRoll`, on this process's Kubernetes and Slurm
clients, as ``gpufleet slurm operator --slurmd-daemonset`` wires them.

:class:`SlurmdFleet` plays what is not gpufleet's: the apiserver moving the template
generation on a ``helm upgrade`` (:meth:`SlurmdFleet.upgrade`), the DaemonSet controller
making a pod of the current generation for a node whose pod is gone, the kubelet
starting it (Ready a few seconds later) and stopping the old one's containers when its
deletion is marked (slurmd and its job steps end: the jobs are lost), and the new
slurmd registering with slurmctld (a new ``slurmd_start_time``). Its delays are fixed,
so a seed's story depends only on its events and choices.
"""

from __future__ import annotations

from typing import Any

from gpufleet.domain import well_known
from gpufleet.dst.kube import KubeClient, Write
from gpufleet.dst.slurm import Scontrol, SlurmRest
from gpufleet.dst.world import Proc, ProcSpec, World
from gpufleet.kubeapi import PODS
from gpufleet.slurm.operator import ClusterOperator, OperatorSettings
from gpufleet.slurm.slurmd_roll import (
    ANNOTATION_ROLL,
    DAEMONSETS,
    POD_TEMPLATE_GENERATION,
    TEMPLATE_GENERATION,
    RollSettings,
    SlurmdRoll,
)

NAMESPACE = "slurm"
NAME = "gpufleet-slurmd"
POD_LABELS = {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": "gpufleet"}
NODE_SELECTOR = {well_known.LABEL_SLURM_CLUSTER: "dst"}
OPERATOR = "operator"
"""The operator's process name."""
OPERATOR_IDENTITY = "gpufleet-slurm-syncer"
"""The chart runs the operator in the syncer's pod, under its account."""
ADMIN = "admin"
MAX_UNAVAILABLE = 1
"""The chart's ``slurm.slurmd.maxUnavailable`` (its default)."""
OPERATOR_SETTINGS = OperatorSettings(interval_s=2.0, reconfigure=False)
RECREATE_S = 1.0
"""The DaemonSet controller makes a node's new pod this long after the old one is gone."""
START_S = 3.0
"""A new pod is Ready this long after it was made (image present, slurmd starting)."""
REGISTER_S = 1.0
"""Its slurmd registers with slurmctld this long after the pod is Ready."""
SLURMD_TIMEOUT_S = 5.0
"""slurmctld marks a node whose slurmd is gone this long down (the local cluster's
``SlurmdTimeout``): shorter than a replacement here (about 7 s), so the roll's drain
meets Slurm 24.11's ``: Not responding`` suffix on every replacement."""


class SlurmdFleet:
    """The DaemonSet, the DaemonSet controller and the kubelets, for the slurmd pods."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.dry_run = False
        """The operator's ``--dry-run`` (the chart's ``syncer.dryRun``), read at its start."""
        self._made = 0
        self._stops: dict[str, int] = {}
        """Node -> how many times its slurmd was stopped (a timer of an earlier stop is
        stale)."""

    # ---------------------------------------------------------------- set-up

    def install(self) -> None:
        """The DaemonSet at generation 1, a Ready pod of it on every node, the operator."""
        w = self.world
        w.slurmd = self
        w.slurm.release = "24.11"  # the chart's Slurm
        body = {
            "metadata": {"name": NAME, "annotations": {TEMPLATE_GENERATION: "1"}},
            "spec": {
                "selector": {"matchLabels": dict(POD_LABELS)},
                "updateStrategy": {"type": "OnDelete"},
                "template": {
                    "metadata": {"labels": dict(POD_LABELS)},
                    "spec": {"nodeSelector": dict(NODE_SELECTOR)},
                },
            },
        }
        w.api.create(ADMIN, DAEMONSETS, body, NAMESPACE)
        for node in w.node_names:
            self._make(node, ready=True)
            w.slurm.nodes[node].slurmd_started = w.clock.now()
        w.api.on_write.append(self.on_write)
        w.add_process(OPERATOR, operator_spec())
        w.start(OPERATOR)

    # ---------------------------------------------------------------- facts

    def daemonset(self) -> dict[str, Any]:
        ds = self.world.api.find(DAEMONSETS, NAME, NAMESPACE)
        assert ds is not None
        return ds

    def generation(self) -> str:
        return str(self.daemonset()["metadata"]["annotations"][TEMPLATE_GENERATION])

    def pod_of(self, node: str) -> dict[str, Any] | None:
        """The node's slurmd pod (a terminating one too), the newest if two."""
        pods = [
            p
            for p in self.world.api.all(PODS, NAMESPACE)
            if (p.get("spec") or {}).get("nodeName") == node
        ]
        return pods[-1] if pods else None

    @staticmethod
    def ready(pod: dict[str, Any]) -> bool:
        conds = (pod.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    def current(self, pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return labels.get(POD_TEMPLATE_GENERATION) == self.generation()

    # ---------------------------------------------------------------- events

    def upgrade(self) -> str:
        """``helm upgrade`` with a changed slurmd pod: the apiserver moves the generation;
        ``OnDelete``, so no pod is replaced by Kubernetes."""
        gen = int(self.generation()) + 1
        self.world.api.patch(
            ADMIN,
            DAEMONSETS,
            NAME,
            {
                "metadata": {"annotations": {TEMPLATE_GENERATION: str(gen)}},
                "spec": {"template": {"metadata": {"annotations": {"checksum": str(gen)}}}},
            },
            namespace=NAMESPACE,
        )
        outdated = sum(
            1
            for n in self.world.node_names
            if (p := self.pod_of(n)) is not None and not self.current(p)
        )
        return f"DaemonSet {NAMESPACE}/{NAME} at generation {gen}: {outdated} pod(s) outdated"

    def pause(self, seconds: float) -> str:
        """``kubectl annotate ds gpufleet.io/slurmd-roll=paused``, removed ``seconds`` later."""
        api = self.world.api

        def set_to(value: str | None) -> None:
            patch = {"metadata": {"annotations": {ANNOTATION_ROLL: value}}}
            api.patch(ADMIN, DAEMONSETS, NAME, patch, namespace=NAMESPACE)

        set_to("paused")

        def unpause() -> None:
            set_to(None)
            self.world.trace.add("env", "slurmd roll unpaused", "annotation removed", key=True)

        self.world.loop.call_later(seconds, unpause)
        return f"slurmd roll paused for {seconds:g}s"

    def dry_run_for(self, seconds: float) -> str:
        """The operator restarted with ``--dry-run``, and again without it later."""
        w = self.world
        self.dry_run = True
        w.kill(OPERATOR, restart_s=1.0, why="restarted with --dry-run")

        def back() -> None:
            self.dry_run = False
            w.kill(OPERATOR, restart_s=1.0, why="restarted without --dry-run")
            w.trace.add("env", "operator --dry-run off", "restarting", key=True)

        w.loop.call_later(seconds, back)
        return f"operator in dry-run for {seconds:g}s"

    # ---------------------------------------------------- Kubernetes' side

    def _make(self, node: str, *, ready: bool = False) -> str:
        self._made += 1
        name = f"{NAME}-{node}-{self._made}"
        body: dict[str, Any] = {
            "metadata": {
                "name": name,
                "labels": {**POD_LABELS, POD_TEMPLATE_GENERATION: self.generation()},
                "ownerReferences": [{"kind": "DaemonSet", "name": NAME, "controller": True}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "slurmd", "image": "slurm"}]},
            "status": {"phase": "Running" if ready else "Pending"},
        }
        if ready:
            body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        self.world.api.create("daemonset-controller", PODS, body, NAMESPACE)
        return name

    def on_write(self, w: Write) -> None:
        if w.resource != str(PODS) or w.namespace != NAMESPACE or w.verb != "delete":
            return
        node = str(((w.before or {}).get("spec") or {}).get("nodeName") or "")
        if not node:
            return
        loop = self.world.loop
        if w.after is not None:  # deletion marked: the kubelet stops its containers
            loop.call_later(0.0, self._stop, node, w.name)
        else:  # gone: the DaemonSet controller makes the node's pod again
            loop.call_later(RECREATE_S, self._recreate, node)

    def _stop(self, node: str, pod: str) -> None:
        slurm = self.world.slurm
        lost = slurm.slurmd_stopped(node)
        stop = self._stops[node] = self._stops.get(node, 0) + 1

        def timeout() -> None:
            if self._stops.get(node) == stop:
                slurm.not_responding(node)

        self.world.loop.call_later(SLURMD_TIMEOUT_S, timeout)
        for job in lost:
            self.world.trace.add(
                "slurmctld", f"job {job.id} on {node}", "lost: slurmd pod deleted", key=True
            )
        self.world.trace.add("kubelet", f"pod {NAMESPACE}/{pod}", "slurmd stopped", key=True)

    def _recreate(self, node: str) -> None:
        if self.pod_of(node) is not None:
            return
        name = self._make(node)
        self.world.trace.add(
            "daemonset-controller", f"pod {NAMESPACE}/{name}", f"gen {self.generation()}", key=True
        )
        self.world.loop.call_later(START_S, self._started, node, name)

    def _started(self, node: str, name: str) -> None:
        api = self.world.api
        pod = api.find(PODS, name, NAMESPACE)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        api.patch("kubelet", PODS, name, {"status": status}, namespace=NAMESPACE, status=True)

        def registered() -> None:
            now = api.find(PODS, name, NAMESPACE)
            if now is not None and not now["metadata"].get("deletionTimestamp"):
                self.world.slurm.slurmd_registered(node)
                self.world.trace.add("slurmctld", f"node {node}", "new slurmd registered", key=True)

        self.world.loop.call_later(REGISTER_S, registered)


def operator_spec() -> ProcSpec:
    """``gpufleet slurm operator --slurmd-daemonset slurm/gpufleet-slurmd``."""

    async def main(world: World, proc: Proc) -> None:
        fleet = world.slurmd
        assert fleet is not None
        kube = KubeClient(world, proc)
        roll = SlurmdRoll(
            kube=kube,
            rest=SlurmRest(world, proc),
            writes=Scontrol(world, proc),
            settings=RollSettings(
                NAMESPACE, NAME, max_unavailable=MAX_UNAVAILABLE, dry_run=fleet.dry_run
            ),
        )
        op = ClusterOperator(
            kube=kube,
            scontrol=None,
            rest=None,
            settings=OPERATOR_SETTINGS,
            clock=world.clock,
            roll=roll,
        )
        proc.obj = op
        await op.run()

    return ProcSpec(identity=OPERATOR_IDENTITY, main=main, restart_s=5.0)


__all__ = ["OPERATOR", "OPERATOR_IDENTITY", "SlurmdFleet", "operator_spec"]
