"""Is a node empty enough to be disrupted? Kubernetes *and* Slurm must agree.

A node leaves ``draining`` (and a reboot-class step may start) only when
nothing runs on it any more. Kubernetes says so by its pods (the controller's
drain loop); Slurm says so through the syncer, which writes what Slurm reports
about the node on the Node itself (:data:`~gpufleet.domain.well_known.ANNOTATION_SLURM_WORK`,
a :class:`SlurmWork`). The controller never talks to Slurm: the annotation is
the contract, so the controller, the agent (which refuses disruptive requests
on a busy node) and the tests read the same words.

Fail closed: a node that may belong to Slurm and has no report *for the current
incident* saying "drained and idle" is not empty. If Slurm stays silent (the
syncer or slurmctld is down) the node waits; a rule may say ``ifSlurmSilent:
proceed`` for faults where waiting is worse than the risk (docs/decisions/0076).
A node is not Slurm's only when the policy says so (``drain.slurm: never``) or
the syncer said so (a report with state ``absent``: no Slurm node has its name,
host name or address); the absence of a mark proves nothing (docs/decisions/0146).

Right before a disruptive act the gate asks again (a *probe*): the syncer reads
Slurm after it saw the probe and answers with a report carrying the probe's id
(:attr:`SlurmWork.probe`), so the act is judged on what Slurm says now.

Pure: no I/O, no clock (ages are arguments).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.domain.policy import SlurmSilence, SlurmWait

ABSENT = "absent"
"""The state of a report that says Slurm has no node for this Node."""
IDLE_BASE_STATES = frozenset({"idle", "down"})
"""Slurm base states in which no job holds the node's resources."""
BUSY_FLAGS = frozenset({"COMPLETING"})
"""Flags that mean a job is still leaving (epilog running, processes ending)."""


@dataclass(frozen=True, slots=True)
class SlurmWork:
    """What Slurm said about a node, as the syncer last wrote it on the Node."""

    state: str
    """Base state and flags, ``idle+DRAIN`` style (:attr:`SlurmView.label`)."""
    jobs: tuple[str, ...] = ()
    """Ids of running jobs that use the node."""
    incident: float | None = None
    """``opened_at`` of the lifecycle incident the syncer saw on the Node; binds
    the report to one incident, so an old "drained" never empties a new one."""
    at: float = 0.0
    """When the syncer read it (seconds since the epoch; a heartbeat, not compared
    across clocks by the controller)."""
    probe: str | None = None
    """The id of the gate's probe this report answers: read from Slurm after the
    syncer saw the probe (None: an ordinary report)."""

    @property
    def absent(self) -> bool:
        """Slurm has no node for this Node (the syncer looked: name, host name, address)."""
        return self.base == ABSENT

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0].lower()

    @property
    def flags(self) -> frozenset[str]:
        parts = self.state.split("+")[1:]
        return frozenset(p.upper() for p in parts if p)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def idle(self) -> bool:
        """No job on the node by Slurm's own account (state, flags and job list)."""
        return not self.jobs and self.base in IDLE_BASE_STATES and not self.flags & BUSY_FLAGS

    @property
    def empty(self) -> bool:
        """Drained (no new job can start) and idle (none runs)."""
        return self.drained and self.idle

    def to_annotation(self) -> str:
        data = {"state": self.state, "jobs": list(self.jobs), "incident": self.incident}
        data["at"] = round(self.at, 3)
        if self.probe is not None:
            data["probe"] = self.probe
        return json.dumps(data, separators=(",", ":"))

    def same_report(self, other: SlurmWork | None) -> bool:
        """Equal except for the time it was read (a heartbeat is not news)."""
        return other is not None and (self.state, self.jobs, self.incident) == (
            other.state,
            other.jobs,
            other.incident,
        )

    @classmethod
    def from_annotation(cls, text: str | None) -> SlurmWork | None:
        """Parse the annotation; None when absent or not a report (treated as no report)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            state = data["state"]
            jobs = data.get("jobs") or []
            incident = data.get("incident")
            at = float(data.get("at") or 0.0)
            probe = data.get("probe")
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if probe is not None and not isinstance(probe, str):
            return None
        if not isinstance(state, str) or not isinstance(jobs, list):
            return None
        if incident is not None and not isinstance(incident, int | float):
            return None
        return cls(
            state=state,
            jobs=tuple(str(j) for j in jobs),
            incident=float(incident) if incident is not None else None,
            at=at,
            probe=probe,
        )


def work_report(
    label: str,
    jobs: Iterable[int | str],
    incident: float | None,
    at: float,
    *,
    probe: str | None = None,
) -> SlurmWork:
    """The report the syncer writes for a node (``label`` is ``SlurmView.label``)."""
    return SlurmWork(
        state=label,
        jobs=tuple(sorted(str(j) for j in jobs)),
        incident=incident,
        at=at,
        probe=probe,
    )


@dataclass(frozen=True, slots=True)
class Probe:
    """The gate's challenge to the syncer (``gpufleet.io/slurm-probe``)."""

    id: str
    at: float
    incident: float | None

    def to_annotation(self) -> str:
        data = {"id": self.id, "at": round(self.at, 3), "incident": self.incident}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str | None) -> Probe | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            pid, at, incident = data["id"], float(data["at"]), data.get("incident")
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not isinstance(pid, str) or not pid or len(pid) > 64:
            return None
        if incident is not None and not isinstance(incident, int | float):
            return None
        return cls(pid, at, float(incident) if incident is not None else None)


def is_slurm_node(work: SlurmWork | None, mode: SlurmWait) -> bool:
    """Whether Slurm must confirm the node is empty before it is disrupted.

    ``auto``: every node, unless the syncer reported that Slurm has no node for it
    (a report with state ``absent``). Marks are not needed and their absence proves
    nothing: a Slurm whose syncer runs without the hold taint, an external Slurm,
    or a node the operator did not label still holds jobs (docs/decisions/0146).
    ``always``: every node, even one the syncer reports absent. ``never``: no node
    (Kubernetes-only fleets say so).
    """
    if mode is SlurmWait.NEVER:
        return False
    if mode is SlurmWait.ALWAYS:
        return True
    return not (work is not None and work.absent)


def pod_holds_node(pod: Mapping[str, Any]) -> bool:
    """Whether a pod is work on its node: it must be gone before the node is disrupted.

    DaemonSet and static (mirror) pods belong to the node (the agent is one);
    finished pods are gone. A terminating pod still counts: its containers may
    run until its grace period ends. One rule for the controller's drain and the
    agent's refusal of a disruptive request.
    """
    meta = pod.get("metadata") or {}
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the node may be disrupted now, and a sentence saying why (or why not)."""

    ready: bool
    why: str


def ready_to_disrupt(
    *,
    pods_left: int,
    slurm_node: bool,
    work: SlurmWork | None,
    incident_opened_at: float,
    slurm_silent_for: float,
    silent_limit: float,
    if_silent: SlurmSilence,
) -> Readiness:
    """Kubernetes empty **and** (not a Slurm node, or Slurm confirms it empty).

    ``slurm_silent_for`` is how long the controller has gone without a new
    Slurm report for this node (measured on its own clock, so clocks of other
    machines never enter). Only with ``if_silent`` = proceed, and only after
    ``silent_limit`` seconds of silence, does a Slurm node go ahead without
    Slurm's word; a report that says jobs are running is never overridden.
    """
    if pods_left:
        return Readiness(False, f"waiting for {pods_left} pod(s) to leave")
    if not slurm_node:
        return Readiness(True, "no workload left (not a Slurm node)")
    current = work is not None and work.incident == incident_opened_at
    if current and work is not None and work.empty:
        return Readiness(True, f"no workload left; Slurm reports {work.state}, no job")
    if current and work is not None and work.absent:
        return Readiness(False, "Slurm has no node for it, but the policy says drain.slurm: always")
    if current and work is not None and not work.idle:
        jobs = ", ".join(work.jobs) or "none listed"
        return Readiness(False, f"waiting for Slurm: node {work.state}, running jobs: {jobs}")
    if current and work is not None and not work.drained:
        return Readiness(False, f"waiting for Slurm to drain the node (now {work.state})")
    if if_silent is SlurmSilence.PROCEED and slurm_silent_for >= silent_limit:
        return Readiness(
            True,
            f"Slurm silent for {slurm_silent_for:.0f}s; the rule says proceed (ifSlurmSilent)",
        )
    return Readiness(
        False,
        "waiting for Slurm to confirm the node is empty (no report from the syncer for this"
        f" incident; silent {slurm_silent_for:.0f}s; failing closed; a cluster without Slurm"
        " says drain.slurm: never)",
    )


def disruptive_work(pods_left: int, work: SlurmWork | None, gpu_busy: bool | None) -> str | None:
    """Why a disruptive action on this node would hit work (None: nothing seen).

    Used by the agent before a GPU reset or a stress check: ``gpu_busy`` None
    means the GPUs could not be read, which counts as busy (fail closed).
    """
    if pods_left:
        return f"{pods_left} pod(s) run on the node"
    if work is not None and not work.absent and not work.idle:
        return f"Slurm reports the node {work.state} with jobs {', '.join(work.jobs) or '?'}"
    if gpu_busy is None:
        return "GPU processes could not be read"
    if gpu_busy:
        return "processes run on the GPUs"
    return None
