"""Replacing outdated slurmd pods the Slurm way: drain, wait for the jobs, replace, resume.

A slurmd pod's containers hold the job steps of its node (slurmstepd is slurmd's
child, in the pod's cgroup): deleting the pod kills them. So the chart's slurmd
DaemonSet updates ``OnDelete`` and the SlurmCluster operator replaces outdated pods
itself, deciding here (decision 0204). The rules, for each node the DaemonSet runs on:

1. **Fail closed.** A node Slurm does not know (unknown, future, not read) gets
   nothing; when Slurm cannot be read at all the caller plans nothing.
2. **Never under a job.** A pod is deleted only when Slurm holds its node out
   (drained, by anyone, or down) and the node runs no job: no running job lists it,
   its base state is not allocated or mixed, and no job is completing there.
3. **Own what you touch.** The roll drains with its own reason (``gpufleet:
   slurmd upgrade``, :data:`~gpufleet.domain.slurm_reasons.ROLL_REASON`) and
   resumes only a drain with that reason, once the node's new pod is current, ready, and its slurmd
   registered with slurmctld after the pod was created.
4. **Someone else's hold stays.** A node drained by an admin, by the syncer (a
   fault, a MaintenancePlan, a lend) or down is never drained or resumed by the
   roll: once it is empty its pod is replaced, and it stays as its owner left it.
   Such nodes do not wait for a turn: their capacity is out already, so a
   MaintenancePlan window that empties a node is when its slurmd is replaced.
5. **Bounded.** At most ``max_unavailable`` nodes are out because of the roll at
   once (drained by it, or not drained by anyone else with a slurmd pod being
   deleted, not ready, or gone while Slurm shows the node down); idle nodes are
   taken first, then by name.
6. **Pause.** A paused roll drains nothing new and deletes no pod; a node whose
   new slurmd registered is still resumed (that only gives capacity back).

Pure: no I/O, no clock (times are arguments).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.slurm_reasons import is_roll_reason
from gpufleet.domain.slurm_sync import SlurmView

REGISTER_SKEW_S = 5.0
"""How much earlier than its pod's creation (apiserver clock) a slurmd's start time
(the node's clock, as slurmctld reports it) may read and still count as the new
slurmd: clocks kept by NTP differ by far less; the old slurmd started at least one
pod lifetime earlier."""

BUSY_STATES = frozenset({"allocated", "mixed"})
"""Base states of a node with a job's CPUs allocated."""


@dataclass(frozen=True, slots=True)
class SlurmdPod:
    """The part of a slurmd pod the roll decides on."""

    name: str
    current: bool
    """Its template is the DaemonSet's current one (template generation or hash)."""
    ready: bool
    deleting: bool
    created_at: float
    """Epoch seconds (``metadata.creationTimestamp``)."""


@dataclass(frozen=True, slots=True)
class RollNode:
    """One node of the DaemonSet as both sides see it."""

    name: str
    pod: SlurmdPod | None
    slurm: SlurmView | None
    jobs: int = 0
    """Running jobs that list this node."""

    @property
    def busy(self) -> bool:
        s = self.slurm
        return (
            self.jobs > 0 or s is None or s.state.lower() in BUSY_STATES or "COMPLETING" in s.flags
        )

    @property
    def ours(self) -> bool:
        return self.slurm is not None and self.slurm.drained and is_roll_reason(self.slurm.reason)

    @property
    def held(self) -> bool:
        """Out of service in Slurm by someone else's hold (a drain not ours, or down)."""
        s = self.slurm
        return s is not None and ((s.drained and not self.ours) or s.down)

    @property
    def registered(self) -> bool:
        """The node's slurmd registered after its current pod was created."""
        s, pod = self.slurm, self.pod
        if s is None or pod is None or s.slurmd_started is None or s.down:
            return False
        return s.slurmd_started >= pod.created_at - REGISTER_SKEW_S


class Act(StrEnum):
    DRAIN = "drain"
    REPLACE = "replace"
    """Delete the outdated pod (the DaemonSet controller creates the new one)."""
    RESUME = "resume"
    WAIT = "wait"
    DONE = "done"
    """The pod is current and the roll holds nothing on the node."""


@dataclass(frozen=True, slots=True)
class RollStep:
    node: str
    act: Act
    why: str
    pod: str | None = None
    """The pod a REPLACE deletes."""


@dataclass(frozen=True, slots=True)
class RollPlan:
    steps: tuple[RollStep, ...]
    out: int
    """Nodes out because of the roll now (rule 5)."""

    @property
    def acts(self) -> tuple[RollStep, ...]:
        """The steps that change something."""
        return tuple(s for s in self.steps if s.act not in (Act.WAIT, Act.DONE))

    @property
    def outdated(self) -> int:
        """Nodes whose slurmd is not yet the current one, running and registered."""
        return sum(1 for s in self.steps if s.act is not Act.DONE)


def decide(node: RollNode, *, paused: bool) -> RollStep | None:
    """The step for one node, or None when it is a candidate for a new drain (in service,
    its pod outdated: :func:`plan` decides whether its turn has come)."""
    s, pod = node.slurm, node.pod
    if s is None or not s.known:
        return RollStep(node.name, Act.WAIT, "Slurm does not know the node (fail closed)")
    if pod is None or pod.deleting:
        return RollStep(node.name, Act.WAIT, "no slurmd pod yet (the DaemonSet makes it)")
    if pod.current:
        if not node.ours:
            return RollStep(node.name, Act.DONE, "slurmd is current")
        if pod.ready and node.registered:
            return RollStep(node.name, Act.RESUME, "the new slurmd registered")
        return RollStep(node.name, Act.WAIT, "waiting for the new slurmd to register")
    if node.ours or node.held:
        if node.busy:
            return RollStep(node.name, Act.WAIT, "drained; waiting for its jobs to end")
        if paused:
            return RollStep(node.name, Act.WAIT, "paused")
        return RollStep(node.name, Act.REPLACE, "empty and held out of service", pod.name)
    return None


def counts_out(node: RollNode) -> bool:
    """Whether the node is out of service because of the roll (rule 5): drained by it, or
    not drained by anyone else while its slurmd pod is going, not Ready, or gone with its
    slurmd (Slurm shows it down). Down alone does not excuse a node: deleting its pod is
    what made it down, and an admin's resume in the meantime (the simulation found it,
    decision 0217) had it counted as someone else's hold while the next node was drained."""
    if node.ours:
        return True
    s, pod = node.slurm, node.pod
    if s is not None and s.drained:
        return False  # someone else's drain holds it (rule 4)
    if pod is None:
        return s is not None and s.down
    return pod.deleting or not pod.ready


def plan(nodes: Iterable[RollNode], *, max_unavailable: int, paused: bool) -> RollPlan:
    """Every node's step; at most ``max_unavailable`` nodes out because of the roll."""
    steps: list[RollStep] = []
    candidates: list[RollNode] = []
    listed = sorted(nodes, key=lambda n: n.name)
    out = sum(1 for n in listed if counts_out(n))
    for node in listed:
        step = decide(node, paused=paused)
        if step is None:
            candidates.append(node)
        else:
            steps.append(step)
    slots = 0 if paused else max(0, max_unavailable - out)
    for node in sorted(candidates, key=lambda n: (n.busy, n.name)):
        if slots > 0:
            slots -= 1
            out += 1
            steps.append(RollStep(node.name, Act.DRAIN, "its slurmd pod is outdated"))
        else:
            why = f"{out} node(s) out for the upgrade (max {max_unavailable})"
            why = "paused" if paused else why
            steps.append(RollStep(node.name, Act.WAIT, why))
    return RollPlan(tuple(sorted(steps, key=lambda s: s.node)), out)


def still(step: RollStep, fresh: Sequence[RollNode], *, paused: bool) -> bool:
    """Whether ``step`` still holds on a fresh read of its node (read right before the
    write): the same act, for the same pod. A candidate's DRAIN holds while the node is
    still in service with its pod outdated."""
    node = next((n for n in fresh if n.name == step.node), None)
    if node is None:
        return False
    again = decide(node, paused=paused)
    if step.act is Act.DRAIN:
        return again is None and not paused
    return again is not None and again.act is step.act and again.pod == step.pod
