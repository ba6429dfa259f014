"""Invariant 7, the slurmd roll's (decisions 0204, 0217), checked where it can first fail.

7a. **no slurmd pod replaced under a job**: when the operator marks a slurmd pod for
    deletion, Slurm runs no job on its node. A job allocated after the operator's last
    read of the running jobs is traced ``in flight`` (no Slurm API closes that window:
    an admin's resume, then a job, while the delete is on its way), not counted.
7b. **bounded**: when the roll drains a node, at most ``maxUnavailable`` nodes are out
    because of the roll: drained with its reason, or not drained by anyone else while
    their slurmd pod is terminating or not Ready, or gone with its slurmd.
7c. **only its own drain resumed**: the operator resumes a node only when Slurm holds
    it with the roll's reason, or not at all (a drain set after the operator's last
    read of the node is traced ``in flight``: ``scontrol update state=resume`` has no
    compare-and-swap).
7d. **no node left drained by the roll once it is safe to resume**: a node drained with
    the roll's reason whose new slurmd pod is current, Ready and registered with
    slurmctld, while the operator runs (not in dry-run, not cut off) and Slurm answers,
    is resumed within :data:`RESUME_WITHIN_S`.
7e. **dry-run writes nothing**: an operator started with ``--dry-run`` never drains,
    resumes or deletes a pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.domain.enrollment import parse_rfc3339
from gpufleet.domain.slurm_reasons import NOT_RESPONDING_SUFFIX, ROLL_REASON
from gpufleet.domain.slurmd_roll import REGISTER_SKEW_S
from gpufleet.dst.kube import Write
from gpufleet.dst.slurmd import NAMESPACE, OPERATOR, OPERATOR_IDENTITY, SlurmdFleet
from gpufleet.dst.world import CURRENT, Violation
from gpufleet.kubeapi import PODS

if TYPE_CHECKING:
    from gpufleet.dst.world import Proc, World

ROLLS = (ROLL_REASON, ROLL_REASON + NOT_RESPONDING_SUFFIX)
"""The roll's drain as Slurm shows it: its reason, or with slurmctld's suffix once the node
went unanswered while its pod was replaced (the model appends only that)."""
RESUME_WITHIN_S = 30.0
"""How long a node drained by the roll may stay so once safe to resume: a few passes of
the operator (2 s apart) and their slowest calls."""


@dataclass
class RollChecks:
    world: World
    fleet: SlurmdFleet
    max_unavailable: int
    safe_since: dict[str, float] = field(default_factory=dict)
    """Node drained by the roll -> since when it has been safe to resume."""
    replaced: int = 0
    resumed: int = 0

    def attach(self) -> None:
        self.world.api.on_write.insert(0, self.on_write)  # before the kubelet stops slurmd
        self.world.slurm.on_write.append(self.on_slurm_write)

    def _fail(self, inv: str, node: str, text: str, category: str) -> None:
        v = Violation(inv, self.world.loop.time(), node, text, {"category": category})
        self.world.violate(v)

    @staticmethod
    def _operator() -> Proc | None:
        proc = CURRENT.get()
        return proc if proc is not None and proc.name == OPERATOR else None

    def _dry_run(self, proc: Proc, what: str, node: str) -> None:
        roll = getattr(proc.obj, "roll", None)
        if roll is not None and roll.settings.dry_run:
            self._fail("7e", node, f"{proc.label} in dry-run: {what}", "7e")

    # ------------------------------------------------------------- 7a, 7e

    def on_write(self, w: Write) -> None:
        if (
            w.resource != str(PODS)
            or w.namespace != NAMESPACE
            or w.verb != "delete"
            or w.after is None
            or w.identity != OPERATOR_IDENTITY
        ):
            return
        proc = self._operator()
        node = str(((w.before or {}).get("spec") or {}).get("nodeName") or "")
        if proc is None or not node:
            return
        self.replaced += 1
        self._dry_run(proc, f"deleted pod {w.name}", node)
        slurm = self.world.slurm
        looked = self.world.job_looks.get(proc.label, -1.0)
        offset = self.world.clock.now() - self.world.loop.time()
        jobs = slurm.jobs_on(node)
        late = [j.id for j in jobs if j.started - offset > looked]
        held = [j.id for j in jobs if j.id not in late]
        if late:
            self.world.trace.add(
                "invariant",
                "in flight",
                f"pod {w.name} deleted: jobs {late} allocated on {node} after the operator's "
                "last read of the jobs",
                key=True,
            )
        if held:
            n = slurm.nodes[node]
            self._fail(
                "7a",
                node,
                f"{proc.label} deleted slurmd pod {w.name} while Slurm runs jobs {held} there "
                f"(node {n.state}{'+DRAIN' if 'DRAIN' in n.flags else ''}, reason {n.reason!r})",
                "7a",
            )

    # ------------------------------------------------------- 7b, 7c, 7e

    def on_slurm_write(self, verb: str, node: str, reason: str | None) -> None:
        proc = self._operator()
        if proc is None:
            return
        self._dry_run(proc, f"{verb} {node}", node)
        if verb == "drain":
            self._bound(node)
            return
        n = self.world.slurm.nodes[node]
        if "DRAIN" not in n.flags or n.reason in ROLLS:
            self.resumed += "DRAIN" in n.flags
            return
        set_at = self.world.slurm.reason_at.get(node, 0.0) - (
            self.world.clock.now() - self.world.loop.time()
        )
        looked = self.world.slurm_looks.get((proc.label, node), -1.0)
        if set_at > looked:
            self.world.trace.add(
                "invariant",
                "in flight",
                f"{proc.label} resumed {node}: drain {n.reason!r} set after its last read",
                key=True,
            )
            return
        self._fail(
            "7c", node, f"{proc.label} resumed {node}, drained by someone else: {n.reason!r}", "7c"
        )

    def _out(self) -> list[str]:
        """Nodes out because of the roll (its drain, or its pod replaced in service)."""
        out = []
        for name, n in self.world.slurm.nodes.items():
            drained = "DRAIN" in n.flags
            if drained and n.reason in ROLLS:
                out.append(name)
                continue
            pod = self.fleet.pod_of(name)
            gone = not n.slurmd if pod is None else not self._serving(pod)
            if not drained and not n.booting and gone:
                out.append(name)
        return out

    def _serving(self, pod: dict[str, Any]) -> bool:
        return not pod["metadata"].get("deletionTimestamp") and self.fleet.ready(pod)

    def _bound(self, node: str) -> None:
        out = sorted({*self._out(), node})
        if len(out) > self.max_unavailable:
            self._fail(
                "7b",
                node,
                f"the roll drains {node} with {', '.join(out)} out for it "
                f"(max {self.max_unavailable})",
                "7b",
            )

    # ------------------------------------------------------------------ 7d

    def check_liveness(self) -> None:
        """Every second: a node drained by the roll, safe to resume, is resumed in time."""
        w = self.world
        now = w.loop.time()
        for name, n in w.slurm.nodes.items():
            if "DRAIN" not in n.flags or n.reason not in ROLLS or not self._safe(name):
                self.safe_since.pop(name, None)
                continue
            since = self.safe_since.setdefault(name, now)
            if now - since > RESUME_WITHIN_S:
                self._fail(
                    "7d",
                    name,
                    f"drained by the roll and safe to resume for {now - since:.0f}s "
                    "(its new slurmd registered, the operator running, Slurm answering)",
                    "7d",
                )
                self.safe_since[name] = float("inf")

    def _safe(self, node: str) -> bool:
        w = self.world
        proc = w.procs.get(OPERATOR)
        if proc is None or not proc.alive or w.partitioned(proc) or self.fleet.dry_run:
            return False
        if w.slurm.ctld_down or w.slurm.restd_down:
            return False
        pod = self.fleet.pod_of(node)
        if pod is None or not self._serving(pod) or not self.fleet.current(pod):
            return False
        n = w.slurm.nodes[node]
        created = parse_rfc3339(pod["metadata"].get("creationTimestamp")) or 0.0
        return (
            n.slurmd
            and not n.booting
            and n.slurmd_started is not None
            and n.slurmd_started >= created - REGISTER_SKEW_S
        )
