"""The invariants, checked where they can first fail: at the write, the reset, the GPU reset.

Numbers follow the safety rules gpufleet promises (docs/reliability.md):

1. **no disruption under work**: no BMC reset (other than the ``On`` half of
   ``ForceOff`` + ``On``) and no GPU reset while a pod that holds the node
   (:func:`~gpufleet.domain.emptiness.pod_holds_node`) or a Slurm job runs on it, looked
   at by the BMC and hardware models the moment they accept the act; ``1b``: a
   one-time network boot (a reimage waiting for the next reset) armed on a machine
   whose record has no reimage in progress or in verification, a reset of another
   step with one armed, or one removed before the firmware of the reset read it;
2. **one reset per decision**: at most one performed disruptive reset per (node,
   incident ``openedAt``, step, attempt, ``startedAt``), as the Node's record says when
   the BMC accepts it (``On`` after ``ForceOff`` of the same attempt allowed);
3. **held faults kept, raised faults heard**: a record's ``pending`` fault leaves it only
   into an incident of that fault or with a ``Notice`` Event (3a); every fault the agent
   raised on its Node is in the controller's ``faults-seen`` watermark by the end (3b);
4. **disruption budget**: never more Nodes whose gpufleet-written state label is out of
   service than the policy's budget allows;
5. **circuit breaker**: no isolation while the saved breaker is open (5a); an open
   breaker closes once its cooldown passed without a new fault (5b: held faults
   retried are not new faults);
6. **own what you touch**: a gpufleet identity changes only ``gpufleet.io/`` labels,
   annotations and taints, gpufleet's conditions, and the cordon gpufleet set.

8. **a domain burnt in as a unit**: a tray that waited for its NVLink domain's burn-in
   (its record's ``domainWait``) enters production only with a passed verdict of that
   domain on its Node, kept after the wait began (decision 0247).

17, a noticed job that left is requeued, is :mod:`gpufleet.dst.notices`'.

14-16, the pod scheduler's (a fit node, one live job per group, only its own pods and
jobs), are :class:`gpufleet.dst.pods.PodChecks`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.domain import (
    agent_requests,
    conditions,
    domain_burnin,
    maintenance,
    node_reports,
    policy_groups,
    topology,
    well_known,
)
from gpufleet.domain.emptiness import SlurmWork
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import DomainBudget, Policy
from gpufleet.domain.records import NodeRecord, record_from_json
from gpufleet.domain.states import OUT_OF_SERVICE, NodeState
from gpufleet.dst import notices
from gpufleet.dst.domain_faults import DomainFaultChecks
from gpufleet.dst.dra_checks import DeviceTaintChecks
from gpufleet.dst.kube import Write
from gpufleet.dst.procs import CONTROLLER_SETTINGS
from gpufleet.dst.quarantine import QuarantineChecks
from gpufleet.dst.world import CURRENT, Proc, Violation
from gpufleet.gate.attempts import network_boot_may_be_starting
from gpufleet.kubeapi import EVENTS, LEASES, NODES, PODS, custom
from gpufleet.lifecycle import crds
from gpufleet.remediate.evidence import ActionMark

if TYPE_CHECKING:
    from gpufleet.dst.bmc import BmcModel
    from gpufleet.dst.world import World

GPUFLEET_CONDITIONS = frozenset(
    {
        *well_known.CONDITIONS.values(),
        well_known.CONDITION_SLURM,
        well_known.CONDITION_BMC_MISMATCH,
        well_known.CONDITION_REQUEST,
        well_known.CONDITION_HARDWARE,
    }
)
POLICIES = custom(crds.FLEET_POLICY_PLURAL)
LOOK_FRESH_S = 5.0
"""A look at a node's pods this long before a reset's POST at most is that act's last look
(the gate's after its mark; slowest answer in the model: 2.5 s)."""
NOTICE_WAIT_S = 10.0
"""How long after a record drops a held fault its Notice Event may come."""
ARMED_GRACE_S = 30.0
"""How long a one-time network boot may stay armed with no reimage in progress, once a
controller leads: its cleanup runs at the tick after the controller's own view shows
the attempt ended, which lags a write whose answer was lost until the Node's watch
delivers it (16 s in seed 1015 of the roll's weight set, decision 0256). The run's
drain-out (``Invariants.armed_due``) judges one still armed at the end."""


def record_in(obj: Mapping[str, Any] | None) -> NodeRecord | None:
    text = (
        ((obj or {}).get("metadata") or {}).get("annotations", {}).get(well_known.ANNOTATION_RECORD)
    )
    if not text:
        return None
    try:
        return record_from_json(text)
    except ValueError:
        return None


def _whole_domain_of(record: NodeRecord | None) -> str:
    """The NVLink domain a domain-scope plan's incident empties ("" none)."""
    inc = record.incident if record is not None else None
    return inc.whole_domain if inc is not None else ""


def _gpufleet(identity: str) -> bool:
    return identity in (well_known.CONTROLLER, "gpufleet-slurm-syncer") or identity.startswith(
        well_known.AGENT
    )


@dataclass
class _Drop:
    node: str
    key: str
    at: float
    writer: Proc | None
    """The incarnation that wrote the record (a killed one never posted its Notice)."""
    state: str
    """The state the record moved to when it dropped the fault."""
    was: str = ""
    """The state it was in."""
    done: bool = False


@dataclass
class Invariants:
    """Watches one world; files a :class:`Violation` with it at the first sign of one."""

    world: World
    policy: Policy
    resets: dict[tuple[Any, ...], list[tuple[str, str, bool]]] = field(default_factory=dict)
    """Decision key -> (reset type, process, posted for a stale attempt) of every reset
    performed for it."""
    record_writer: dict[str, str] = field(default_factory=dict)
    """Node -> the identity that last wrote its record."""
    raised: dict[tuple[str, str, float], str] = field(default_factory=dict)
    """(node, condition type, fault time) -> fault key, for every fault an agent raised."""
    state_labels: dict[str, str] = field(default_factory=dict)
    """Node -> the state label gpufleet last wrote."""
    drops: list[_Drop] = field(default_factory=list)
    genuine: list[tuple[float, str]] = field(default_factory=list)
    """(time, node) of controller writes that recorded a new fault occurrence."""
    breaker_open_since: float | None = None
    breaker_status: dict[str, Any] = field(default_factory=dict)
    """The breaker as the controller last saved it in the FleetPolicy status."""
    isolations: list[tuple[float, str]] = field(default_factory=list)
    held_drained: dict[str, float] = field(default_factory=dict)
    """Node -> incident openedAt of a record stored draining with the drain done (held)."""
    armed_since: dict[str, float] = field(default_factory=dict)
    notices: list[tuple[float, str, str]] = field(default_factory=list)
    """(time, node, message) of the controller's Notice Events (posted before the write
    that drops the fault they tell of, or after it)."""
    pod_born: dict[str, float] = field(default_factory=dict)
    """namespace/name -> loop time the pod came onto its node (created with ``nodeName``,
    or bound: the pod scheduler's pods)."""
    in_flight: list[tuple[float, str]] = field(default_factory=list)
    """(time, node) of acts that work reached while their request was on its way."""
    lease: tuple[str, float, float] | None = None
    """(holder, since when, last renewed) of the controller Lease as last written."""

    def attach(self) -> None:
        w = self.world
        w.api.on_write.append(self.on_write)
        w.api.on_write.append(QuarantineChecks(self._fail, record_in).on_write)  # 9
        w.api.on_write.append(DomainFaultChecks(self._fail).on_write)  # 10: dst.domain_faults
        w.api.on_write.append(DeviceTaintChecks(self._fail, w.api, record_in).on_write)  # 13
        w.on_reset.append(self.on_reset)
        w.on_gpu_reset.append(self.on_gpu_reset)
        w.on_disk_boot.append(self.on_disk_boot)

    def _fail(self, inv: str, node: str, text: str, **detail: Any) -> None:
        self.world.violate(Violation(inv, self.world.loop.time(), node, text, dict(detail)))

    # ------------------------------------------------------ 1, 2: the acts

    def _work(self, node: str) -> tuple[list[str], list[int]]:
        pods = [
            f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
            for p in self.world.pods_on(node)
        ]
        jobs = [j.id for j in self.world.slurm.jobs_on(node)]
        return pods, jobs

    def _job_born(self, job: int) -> float:
        """Loop time the job was allocated (Slurm keeps wall time)."""
        j = self.world.slurm.jobs.get(job)
        if j is None:
            return -1.0
        return j.started - (self.world.clock.now() - self.world.loop.time())

    def route(self, node: str, jobs: list[int]) -> tuple[str, str]:
        """Which known route led to an act under work: (category, the record's story)."""
        obj = self.world.api.find(NODES, node)
        rec = record_in(obj)
        if self.record_writer.get(node, well_known.CONTROLLER) != well_known.CONTROLLER:
            return "forged-record", f"the record was written by {self.record_writer[node]}"
        if rec is None or rec.incident is None:
            return "no-incident", "no incident on the record"
        inc = rec.incident
        bits = [f"state {rec.state.value}", f"incident {inc.key} opened {inc.opened_at:.0f}"]
        prev = inc.tried[-2] if len(inc.tried) >= 2 else None
        if prev is not None:
            bits.append(f"after {prev.step.value} {prev.outcome.value if prev.outcome else '?'}")
        last = rec.history[-1] if rec.history else None
        if last is not None:
            bits.append(f"entered via {last.trigger.value} from {last.source.value}")
        ann = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        work = SlurmWork.from_annotation(ann.get(well_known.ANNOTATION_SLURM_WORK))
        if work is not None and work.incident == inc.opened_at:
            bits.append(f"slurm-work says {work.state} jobs={list(work.jobs)}")
        held = self.held_drained.get(node) == inc.opened_at
        if held:
            bits.append("drain completion was held, then the hold lifted")
        text = "; ".join(bits)
        if last is not None and last.trigger.value == "verification-failed":
            return "after-failed-verification", text
        if prev is not None and prev.outcome is not None and prev.outcome.value == "timed-out":
            return "after-step-timeout", text
        if prev is not None and prev.outcome is not None and prev.outcome.value == "failed":
            return "after-failed-step", text
        if prev is not None and prev.outcome is not None and prev.outcome.value == "succeeded":
            # The step worked, its verification was held (a rail), and the tick's retry
            # started the next rung instead.
            return "after-held-success", text
        if held:
            return "hold-lifted-drained", text
        slurm = self.world.slurm
        if jobs:
            drained = slurm.drained_at.get(node, 0.0)
            resumed = slurm.resumed_at.get(node, 0.0)
            started = [j.started for j in slurm.jobs_on(node)]
            if resumed > inc.opened_at and any(t >= resumed for t in started):
                return "admin-resume-then-job", text
            if any(inc.opened_at - 5 <= t <= drained for t in started):
                return "stale-slurm-report", text
            return "job-after-drain", text
        return "pod-after-drain", text

    def on_reset(self, proc: Proc, m: BmcModel, reset_type: str, sent: float) -> None:
        node = m.node
        rec = record_in(self.world.api.find(NODES, node))
        inc = rec.incident if rec is not None else None
        last = inc.tried[-1] if inc is not None and inc.tried else None
        key = (
            node,
            inc.opened_at if inc else None,
            inc.current.value if inc and inc.current else None,
            last.attempt if last else None,
            last.started_at if last else None,
        )
        ann = ((self.world.api.find(NODES, node) or {}).get("metadata") or {}).get(
            "annotations"
        ) or {}
        mark = ActionMark.from_json(ann.get(well_known.ANNOTATION_BMC_ACTION))
        if (
            m.boot_override is not None
            and reset_type != "ForceOff"
            and (mark is None or mark.step != Step.REIMAGE.value)
        ):
            self._fail(
                "1b",
                node,
                f"{reset_type} ({mark.step if mark else 'no mark'}) with a one-time "
                f"{m.boot_override} boot armed: it reimages the machine",
                category="1b/reset-not-reimage",
            )
        # A POST whose write-ahead mark names another attempt than the record's: a task
        # that carried on after the ladder had moved past its attempt.
        stale = (
            mark is not None
            and key[2] is not None
            and not mark.binds(str(key[2]), int(key[3] or 0), float(key[4] or 0.0))
        )
        done = self.resets.setdefault(key, [])
        second_half = reset_type == "On" and [t for t, _, _ in done[-1:]] == ["ForceOff"]
        if done and not second_half:
            names = {p.split("#")[0] for _, p, _ in done}
            if stale or any(s for _, _, s in done):
                how = "stale-attempt"
            elif {p for _, p, _ in done} == {proc.label}:
                how = "same-incarnation"
            elif names == {proc.name}:
                how = "after-restart"
            else:
                how = "two-replicas"
            before = " + ".join(
                f"{t} by {p}" + (" (stale attempt)" if s else "") for t, p, s in done
            )
            self._fail(
                "2",
                node,
                f"{proc.label} posted Reset {reset_type} after {before} for the same decision "
                f"(step {key[2]} attempt {key[3]} startedAt {key[4]})",
                key=key,
                category=f"2/{how}",
            )
        done.append((reset_type, proc.label, stale))
        if not second_half:
            # A pod counts from the acting process's last look at the node's pods (the
            # gate's, after the mark): its answer may take seconds to arrive, and nothing
            # the gate does after the look can see a pod bound since (0147).
            look = self.world.pod_looks.get((proc.label, node), sent)
            if sent - look > LOOK_FRESH_S:
                look = sent  # not this act's look: a gate that did not look is not excused
            self._under_work(
                node, f"{proc.label} posted Reset {reset_type}", "", sent=sent, looked=look
            )

    def on_gpu_reset(self, node: str, index: int | None) -> None:
        self._under_work(node, f"GPU {index} reset", "gpu-reset-")

    def _under_work(
        self,
        node: str,
        act: str,
        kind: str,
        *,
        sent: float | None = None,
        looked: float | None = None,
    ) -> None:
        """1: the act took effect while a pod or a Slurm job was on the node.

        Work that arrived while the request was on its way (a pod after the gate's last
        look at the node's pods, ``looked``; a job after ``sent``) is the one race no API
        closes (a pod bound by ``nodeName``, a job Slurm allocates, between the gate's
        last look and the BMC acting): traced and counted, not a violation
        (docs/decisions/0147)."""
        pods, jobs = self._work(node)
        if sent is not None:
            since = min(sent, looked if looked is not None else sent)
            late_pods = [p for p in pods if self.pod_born.get(p, -1.0) > since]
            late_jobs = [j for j in jobs if self._job_born(j) > sent]
            if late_pods or late_jobs:
                self.in_flight.append((self.world.loop.time(), node))
                self.world.trace.add(
                    "invariant",
                    "in flight",
                    f"{act}: pods {late_pods} bound after the last look at its pods, jobs "
                    f"{late_jobs} allocated after it was sent",
                    key=True,
                )
            pods = [p for p in pods if p not in late_pods]
            jobs = [j for j in jobs if j not in late_jobs]
        if pods or jobs:
            cat, why = self.route(node, jobs)
            self._fail(
                "1",
                node,
                f"{act} while pods {pods} and Slurm jobs {jobs} run there ({why})",
                pods=pods,
                jobs=jobs,
                category=f"1/{kind}{cat}",
            )

    def on_disk_boot(self, m: BmcModel) -> None:
        """1b: a reimage's network boot removed before the machine's firmware read it:
        the machine booted its old disk and the reimage was silently not done."""
        rec = record_in(self.world.api.find(NODES, m.node))
        state = rec.state.value if rec is not None else "?"
        self._fail(
            "1b",
            m.node,
            f"the network boot armed at its reset was removed while the machine was "
            f"starting (record {state}): it booted its disk, the reimage not done",
            category="1b/network-boot-cancelled",
        )

    def armed_due(self) -> float | None:
        """When the last override armed now with nothing in progress is due to be judged
        (None: none): a run that ends sooner drains out till then, so a boot left armed
        in the run's last seconds is judged like any other (decision 0256)."""
        leading = self.leading_since()
        if leading is None or not self.armed_since:
            return None
        live = [t for t in self.armed_since.values() if t != float("inf")]
        return max(max(t, leading) for t in live) + ARMED_GRACE_S if live else None

    def check_armed(self) -> None:
        """1b: a one-time network boot armed while no reimage is in progress or being
        verified (until verification ends the firmware may still read it, 0177)."""
        now = self.world.loop.time()
        for m in self.world.bmcs.values():
            rec = record_in(self.world.api.find(NODES, m.node))
            reimaging = (
                rec is not None
                and rec.state is NodeState.REMEDIATING
                and rec.incident is not None
                and rec.incident.current is Step.REIMAGE
            ) or network_boot_may_be_starting(rec)
            # A machine starting from a reset that found it armed reads it as it boots
            # (removed now, it boots its disk: the other half of 1b): kept, not left.
            if m.boot_override is None or reimaging or m.firmware_reads:
                self.armed_since.pop(m.node, None)
                continue
            since = self.armed_since.setdefault(m.node, now)
            leading = self.leading_since()
            if leading is None:
                continue  # nobody could remove it now
            if now - max(since, leading) >= ARMED_GRACE_S:
                state = rec.state.value if rec is not None else "?"
                self._fail(
                    "1b",
                    m.node,
                    f"one-time {m.boot_override} boot armed for {now - since:.0f}s on a node in "
                    f"{state} with no reimage in progress: its next reset reimages it",
                )
                self.armed_since[m.node] = float("inf")

    # ------------------------------------------------------------ the writes

    def on_write(self, w: Write) -> None:
        if w.resource == str(NODES):
            self._node_write(w)
        elif w.resource == str(EVENTS) and w.after is not None:
            self._event_write(w)
        elif w.resource == str(POLICIES) and w.identity == well_known.CONTROLLER:
            self._breaker_write(w)
        elif w.resource == str(PODS) and w.verb in ("create", "bind") and w.after is not None:
            # a pod arrives on its node when created with nodeName or when bound
            self.pod_born[f"{w.namespace}/{w.name}"] = w.at
        elif w.resource == str(LEASES):
            holder = str(((w.after or {}).get("spec") or {}).get("holderIdentity") or "")
            lapsed = (
                self.lease is None
                or self.lease[0] != holder
                or w.at - self.lease[2] > CONTROLLER_SETTINGS.lease_duration_s
            )
            since = w.at if lapsed or self.lease is None else self.lease[1]
            self.lease = (holder, since, w.at)

    def leading_since(self) -> float | None:
        """Since when a live controller has held the Lease (None: nobody acts now).
        What only a leader does (close the breaker, sweep an armed boot) is owed only
        once one has led for a while."""
        if self.lease is None or not self.lease[0]:
            return None
        holder, since, renewed = self.lease
        if self.world.loop.time() - renewed > CONTROLLER_SETTINGS.lease_duration_s:
            return None  # not renewed (a partition): its holder has stopped acting
        proc = next((p for p in self.world.procs.values() if p.alive and p.label == holder), None)
        if proc is None:
            return None
        # A holder cut from the apiserver still holds the Lease until it lapses, but none
        # of its writes lands: it leads again from the end of its partition.
        cut_until = self.world.partitions.get(proc.name)
        if cut_until is not None and cut_until > since:
            return None if self.world.partitioned(proc) else cut_until
        return since

    def _node_write(self, w: Write) -> None:
        before, after = w.before or {}, w.after or {}
        if w.identity.startswith(well_known.AGENT):
            self._raised(w.name, after)
        if _gpufleet(w.identity):
            self._ownership(w, before, after)
        rb = ((before.get("metadata") or {}).get("annotations") or {}).get(
            well_known.ANNOTATION_RECORD
        )
        ra = ((after.get("metadata") or {}).get("annotations") or {}).get(
            well_known.ANNOTATION_RECORD
        )
        if rb != ra:
            self.record_writer[w.name] = w.identity
        if w.identity == well_known.CONTROLLER:
            self._record_write(w, record_in(before), record_in(after))
        label = ((after.get("metadata") or {}).get("labels") or {}).get(well_known.LABEL_STATE)
        old = ((before.get("metadata") or {}).get("labels") or {}).get(well_known.LABEL_STATE)
        if label != old and w.identity == well_known.CONTROLLER:
            if label is None:
                self.state_labels.pop(w.name, None)
            else:
                self.state_labels[w.name] = label
            self._budget(w.name)

    def _domain_burn_in(self, w: Write, old: NodeRecord | None, new: NodeRecord) -> None:
        """8: no tray that waited for its domain's burn-in returns before it passed."""
        if old is None or old.domain_wait is None or new.state is not NodeState.PRODUCTION:
            return
        ann = ((w.after or {}).get("metadata") or {}).get("annotations") or {}
        kept = domain_burnin.read_recorded(ann.get(well_known.ANNOTATION_DOMAIN_BURN_IN))
        if (
            kept is None
            or not kept.passed
            or kept.domain != old.nvlink_domain
            or kept.at <= old.domain_wait
        ):
            self._fail(
                "8",
                w.name,
                f"entered production while waiting for the burn-in of NVLink domain "
                f"{old.nvlink_domain} (since {old.domain_wait:.1f}) without a passed verdict "
                f"kept after it (found: {kept})",
                category="8/returned-before-domain-burn-in",
            )

    def _raised(self, node: str, obj: Mapping[str, Any]) -> None:
        for c in (obj.get("status") or {}).get("conditions") or []:
            ctype = str(c.get("type", ""))
            for f in conditions.faults_of(
                node, ctype, str(c.get("status")), str(c.get("message", ""))
            ):
                self.raised.setdefault((node, ctype, f.at), f.key)

    def _record_write(self, w: Write, old: NodeRecord | None, new: NodeRecord | None) -> None:
        if new is None:
            return
        now = w.at
        self._domain_burn_in(w, old, new)
        if old is not None and old.pending is not None and new.pending is None:
            into = (
                new.incident is not None
                and new.incident.key == old.pending.key
                and (old.incident is None or old.incident.opened_at != new.incident.opened_at)
            )
            if not into:
                drop = _Drop(
                    w.name,
                    old.pending.key,
                    now,
                    CURRENT.get(),
                    new.state.value,
                    old.state.value,
                )
                drop.done = any(
                    node == w.name and drop.key in msg and now - at <= NOTICE_WAIT_S
                    for at, node, msg in self.notices
                )
                self.drops.append(drop)
                self.world.loop.call_later(NOTICE_WAIT_S, self._drop_due, drop)
        old_occ = set(old.occurrences) if old is not None else set()
        if any(o not in old_occ for o in new.occurrences):
            self.genuine.append((now, w.name))
        if (
            new.state is NodeState.DRAINING
            and (old is None or old.state is NodeState.PRODUCTION)
            and new.incident is not None
            and new.incident.plan is not None
            and new.incident.key != "operator"
        ):
            self.isolations.append((now, w.name))
            b = self.breaker_status
            wall = self.world.clock.now()
            cooldown = self.policy.safety.breaker.cooldown_seconds
            genuine = max(
                (at for at, n in self.genuine if not (n == w.name and at == now)), default=-1e9
            )
            # Open by the saved status, and rightly so: a new fault within the cooldown (a
            # status kept open by retried held faults, 5b, does not count here). Judged by
            # when the isolation was decided (the incident opens then), not when its write
            # landed: one decided before the trip counts among the nodes the breaker lets
            # through, however slow its write (seed 67 of bench/dst_soak.py: decided 0.8 s
            # before the fault that tripped it, written 1.7 s after; decision 0297).
            decided_before_trip = new.incident.opened_at < float(b.get("trippedAt") or 0.0)
            if (
                b.get("open")
                and not decided_before_trip
                and wall - float(b.get("lastFaultAt") or 0.0) < cooldown
                and now - genuine < cooldown
            ):
                self._fail(
                    "5a",
                    w.name,
                    f"isolated ({new.incident.key}) while the saved breaker is open (tripped at "
                    f"{float(b.get('trippedAt') or 0) - wall + now:.1f}, last fault at "
                    f"{float(b.get('lastFaultAt') or 0) - wall + now:.1f}: within its cooldown)",
                )
        inc = new.incident
        if new.state is NodeState.DRAINING and inc is not None and inc.drained:
            self.held_drained[w.name] = inc.opened_at
        self._whole_domain(w.name, old, new)

    def _whole_domain(self, node: str, old: NodeRecord | None, new: NodeRecord) -> None:
        """Invariant 12: a domain-scope MaintenancePlan (decision 0244) asks a tray's command
        only while every tray of its NVLink domain is empty (maintenance, triage or rma),
        and returns none to verification while another tray of the domain has a command
        asked and not answered."""
        inc, was = new.incident, old.incident if old is not None else None
        asked = (
            inc is not None
            and inc.whole_domain != ""
            and inc.acting_since is not None
            and (was is None or was.acting_since is None)
        )
        returned = (
            old is not None
            and was is not None
            and was.whole_domain != ""
            and old.state is NodeState.MAINTENANCE
            and new.state is NodeState.VERIFYING
        )
        domain = _whole_domain_of(new) if asked else _whole_domain_of(old)
        if not (asked or returned) or not domain:
            return
        per_domain = self.policy.safety.budget.per_domain
        label = (per_domain or DomainBudget()).label
        for other in self.world.node_names:
            obj = self.world.api.find(NODES, other)
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
            rec = record_in(obj)
            if other == node or rec is None:
                continue
            if topology.nvlink_domain_of(other, labels, label) != domain:
                continue
            if asked and rec.state not in maintenance.EMPTY:
                self._fail(
                    "12",
                    node,
                    f"its domain-scope command asked while {other} of NVLink domain {domain} "
                    f"is {rec.state}",
                    category="12/not-empty",
                )
            waiting = rec.incident is not None and rec.incident.acting_since is not None
            if returned and rec.state is NodeState.MAINTENANCE and waiting:
                result = node_reports.result_of(obj or {})
                expected = agent_requests.request_id(rec)
                if result is None or result.id != expected or not result.passed:
                    self._fail(
                        "12",
                        node,
                        f"returned to verification while {other} of NVLink domain {domain} "
                        "has its command unanswered",
                        category="12/returned-early",
                    )

    def _event_write(self, w: Write) -> None:
        ev = w.after or {}
        if ev.get("reason") != "Notice" or w.identity != well_known.CONTROLLER:
            return
        node = (ev.get("involvedObject") or {}).get("name")
        msg = str(ev.get("message", ""))
        self.notices.append((w.at, str(node), msg))
        for d in self.drops:
            if not d.done and d.node == node and d.key in msg:
                d.done = True

    def _drop_due(self, d: _Drop) -> None:
        if d.done:
            return
        rec = record_in(self.world.api.find(NODES, d.node))
        state = rec.state.value if rec is not None else "?"
        how = {"draining": "isolate", "production": "to-production"}.get(d.state, d.state)
        if d.state == d.was == "production":
            how = "let-go-notice-lost"  # dismissed or let go: its Notice never landed
        if d.writer is not None and not d.writer.alive:
            how = "notice-lost"  # the writer was killed before its Notice Event landed
        self._fail(
            "3a",
            d.node,
            f"held fault {d.key} dropped from the record at {d.at:.1f} as it went {d.state} "
            f"(now {state}) with no Notice Event in {NOTICE_WAIT_S:g}s"
            + (
                f" ({d.writer.label} was killed since)" if how == "notice-lost" and d.writer else ""
            ),
            category=f"3a/{how}",
        )

    def _budget(self, node: str) -> None:
        """Invariant 4: per pool, per node group of the policy's overrides (its own
        budget, counted on the nodes its selector matches now: domain.policy_groups) and
        per NVLink domain when the policy sets a per-domain budget (the domain the node's
        labels say now: domain.topology); a tray out for a domain-scope MaintenancePlan of
        its own domain is not counted against that domain's k (the plan's consent,
        decision 0244), only against the others."""
        out: dict[str, int] = {}
        size: dict[str, int] = {}
        limits: dict[str, int] = {}
        budgets = {o.name: o.budget for o in self.policy.overrides if o.budget is not None}
        members: list[tuple[str, str]] = []
        for name in self.world.node_names:
            obj = self.world.api.find(NODES, name)
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
            scopes = [f"pool {labels.get(well_known.LABEL_POOL, 'default')}"]
            group = policy_groups.group_of(self.policy, labels)
            if group in budgets:
                scopes.append(f"group {group}")
            domain = policy_groups.domain_of(self.policy, name, labels)
            if domain:
                scopes.append(f"domain {domain}")
                members.append((domain, group))
            consented = _whole_domain_of(record_in(obj)) == domain != ""
            for scope in scopes:
                size[scope] = size.get(scope, 0) + 1
                if consented and scope.startswith("domain "):
                    continue  # out for a plan that empties its domain (decision 0244)
                if self.state_labels.get(name) in {s.value for s in OUT_OF_SERVICE}:
                    out[scope] = out.get(scope, 0) + 1
        fleet_budget = self.policy.safety.budget
        per_domain = fleet_budget.per_domain
        domain_ks = policy_groups.domain_limits(self.policy, members)
        for scope in size:
            kind, _, group = scope.partition(" ")
            if kind == "domain" and per_domain is not None:
                limits[scope] = domain_ks.get(group, per_domain.max_nodes)
                continue
            chosen = budgets[group].over(fleet_budget) if kind == "group" else fleet_budget
            limits[scope] = chosen.allowed(size[scope])
        for pool, n in out.items():
            allowed = limits[pool]
            if n > allowed:
                names = sorted(
                    k
                    for k, v in self.state_labels.items()
                    if v in {s.value for s in OUT_OF_SERVICE}
                )
                ctls = sorted(
                    p.label
                    for p in self.world.procs.values()
                    if p.alive and p.identity == well_known.CONTROLLER
                )
                self._fail(
                    "4",
                    node,
                    f"{n} nodes of {pool} out of service ({', '.join(names)}); the budget "
                    f"allows {allowed} (controllers running: {', '.join(ctls)})",
                    category="4/" + ("two-replicas" if len(ctls) > 1 else "one-replica"),
                )

    def _breaker_write(self, w: Write) -> None:
        b = ((w.after or {}).get("status") or {}).get("breaker")
        if not isinstance(b, dict):
            return
        self.breaker_status = dict(b)
        if b.get("open") and self.breaker_open_since is None:
            self.breaker_open_since = float(b.get("trippedAt") or w.at)
        elif not b.get("open"):
            self.breaker_open_since = None

    def check_breaker(self) -> None:
        """5b: an open breaker with no new fault for its cooldown must have closed."""
        if self.breaker_open_since is None:
            return
        cfg = self.policy.safety.breaker
        now = self.world.clock.now()
        t = self.world.loop.time()
        slack = 3 * 2.0 + 5.0  # ticks and the status save
        leading = self.leading_since()
        if leading is None or t - leading < slack:
            return  # nobody acts (a takeover waits out the old lease): nobody closes it
        last = max((at for at, _ in self.genuine), default=0.0)
        # A fault leaves the controller's window at its next tick after the window, too.
        recent = {n for at, n in self.genuine if t - at < cfg.window_seconds + slack}
        if t - last >= cfg.cooldown_seconds + slack and len(recent) <= cfg.threshold(
            len(self.world.node_names)
        ):
            obj = self.world.api.find(POLICIES, "default")
            b = ((obj or {}).get("status") or {}).get("breaker") or {}
            self._fail(
                "5b",
                "-",
                f"the breaker is still open {t - last:.0f}s after the last new fault (cooldown "
                f"{cfg.cooldown_seconds:g}s); it counts its last fault at "
                f"{float(b.get('lastFaultAt') or 0) - (now - t):.1f}",
            )
            self.breaker_open_since = None

    # ------------------------------------------------------------ ownership

    def _ownership(self, w: Write, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        bm, am = before.get("metadata") or {}, after.get("metadata") or {}
        bad: list[str] = []
        for sect in ("labels", "annotations"):
            b, a = bm.get(sect) or {}, am.get(sect) or {}
            for k in set(b) | set(a):
                if b.get(k) != a.get(k) and not k.startswith(f"{well_known.GROUP}/"):
                    bad.append(f"{sect[:-1]} {k}")
        bs, as_ = dict(before.get("spec") or {}), dict(after.get("spec") or {})
        bt = {t.get("key"): t for t in bs.pop("taints", None) or []}
        at = {t.get("key"): t for t in as_.pop("taints", None) or []}
        for k in set(bt) | set(at):
            if bt.get(k) != at.get(k) and not str(k).startswith(f"{well_known.GROUP}/"):
                bad.append(f"taint {k} ({'removed' if k not in at else 'changed'})")
        bu, au = bool(bs.pop("unschedulable", False)), bool(as_.pop("unschedulable", False))
        if bu != au:
            ours_before = (bm.get("annotations") or {}).get(well_known.ANNOTATION_CORDONED)
            ours_after = (am.get("annotations") or {}).get(well_known.ANNOTATION_CORDONED)
            if w.identity != well_known.CONTROLLER:
                bad.append("the cordon (not the controller)")
            elif au and ours_after != well_known.CONTROLLER:
                bad.append("a cordon without gpufleet.io/cordoned-by")
            elif not au and ours_before != well_known.CONTROLLER:
                bad.append("someone else's cordon (cleared)")
        if bs != as_:
            bad.append(
                "spec " + ",".join(sorted(k for k in set(bs) | set(as_) if bs.get(k) != as_.get(k)))
            )
        bc = {c.get("type"): c for c in (before.get("status") or {}).get("conditions") or []}
        ac = {c.get("type"): c for c in (after.get("status") or {}).get("conditions") or []}
        for k in set(bc) | set(ac):
            if bc.get(k) != ac.get(k) and k not in GPUFLEET_CONDITIONS:
                bad.append(f"condition {k}")
        if bad:
            self._fail(
                "6", w.name, f"{w.identity} changed what it does not own: {'; '.join(sorted(bad))}"
            )

    # -------------------------------------------------------------- the end

    def check_end(self) -> None:
        """3b: every fault an agent raised is in the controller's watermark; 17: every job
        that left after a departure notice was requeued (dst.notices)."""
        notices.check_end(self.world, self._fail)
        for (node, ctype, at), key in sorted(self.raised.items()):
            obj = self.world.api.find(NODES, node)
            ann = ((obj or {}).get("metadata") or {}).get("annotations") or {}
            try:
                seen = json.loads(ann.get(well_known.ANNOTATION_FAULTS_SEEN) or "{}")
            except ValueError:
                seen = {}
            mark = float(seen.get(ctype, float("-inf")))
            if mark < at:
                rec = record_in(obj)
                state = rec.state.value if rec is not None else "?"
                when = at - self.world.clock.now() + self.world.loop.time()
                self._fail(
                    "3b",
                    node,
                    f"{key} raised on {ctype} at {when:.1f}"
                    f" was never recorded by a controller (node {state}, watermark "
                    f"{'none' if mark == float('-inf') else f'{mark:.1f}'})",
                )
                return
