"""The discrete-event simulation of a fleet running one large synchronous job.

The world (faults, durations, people, the job) is simulated here; every
decision about a node is made by :func:`gpufleet.domain.decide` under the
policy the controller uses. The loop feeds it the events the controller would
see (a fault report, a finished drain, a step result, a check result, an
operator's action) and carries out the actions it returns.

Cost discipline (docs/simulator.md): per-node state is a few scalars and the
node's :class:`NodeRecord`; failures of all nodes form one superposed Poisson
stream; checkpoints are not events (a running segment is settled in O(1) when
it ends); active checks of idle nodes are sampled, not simulated one by one.
So memory grows with the number of nodes, not with simulated time.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

from gpufleet.domain import events as ev
from gpufleet.domain import policy_groups, well_known
from gpufleet.domain import spares as spare_pool
from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.apply import apply_decision
from gpufleet.domain.decide import decide
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step, severity
from gpufleet.domain.policy import Policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.sim import analytic
from gpufleet.sim.model import CURES, Category, Effect, Model, Scope
from gpufleet.sim.result import BUCKETS, RunResult

S = NodeState
DAY = 86400.0
TIMELINE_POINTS = 400


class _Ev(IntEnum):
    FAILURE = 0
    OTHER_FAILURE = 1
    PLANNED = 2
    REPORT = 3  # a monitor reports a node's fault
    DRAIN_DONE = 4
    STEP_DONE = 5
    TICK = 6
    CHECKS_DONE = 7
    TRIAGE = 8  # a person picks up a triaged node
    HUMAN_FIXED = 9
    REPLACED = 10
    REGISTERED = 11
    MAINT_DONE = 12
    HUMAN_DIAG = 13  # a person found the bad node of a failed job
    RECRASH = 14
    SYMPTOM = 15
    PERF_REPORT = 16
    IDLE_CHECK = 17
    JOB_DETECTED = 18
    JOB_STARTED = 19
    SAMPLE = 20
    GROUP_BACK = 21  # a replica group trains again (replacement rejoined, or restarted in place)


class _Phase(IntEnum):
    RUNNING = 0
    DETECT = 1
    DIAGNOSE = 2
    RESTART = 3
    WAIT = 4


_PHASE_BUCKET = {
    _Phase.DETECT: "detection",
    _Phase.DIAGNOSE: "detection",
    _Phase.RESTART: "recovery",
    _Phase.WAIT: "recovery",
}


@dataclass(slots=True)
class _Job:
    phase: _Phase = _Phase.WAIT
    since: float = 0.0
    gen: int = 0
    detect_until: float = 0.0
    seg_start: float = 0.0
    rate: float = 1.0
    rate_since: float = 0.0
    rate_area: float = 0.0
    save_extra: float = 0.0
    """Seconds of the current restart spent on an on-demand checkpoint."""
    nodes: set[int] = field(default_factory=set)


class Simulator:
    """One run: ``Simulator(model, policy, gpus=..., days=..., seed=...).run()``."""

    def __init__(
        self,
        model: Model,
        policy: Policy,
        *,
        gpus: int,
        days: float,
        seed: int = 0,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        if gpus < 1 or days <= 0:
            raise ValueError("gpus must be >= 1 and days > 0")
        self.model = model
        self.policy = policy
        self.days = days
        self.seed = seed
        self.horizon = days * DAY
        self.progress = progress
        gpn = model.fleet.gpus_per_node
        self.job_nodes = -(-gpus // gpn)
        self.spares = model.fleet.spares(self.job_nodes)
        self.n = self.job_nodes + self.spares
        self.min_nodes = max(1, math.ceil(self.job_nodes * model.job.min_fraction - 1e-9))
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        ck = model.job.checkpoint
        self.ckpt_cost = ck.blocking_seconds
        self.interval = analytic.checkpoint_interval(model, self.job_nodes)
        self.now = 0.0
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, int, int, int, object]] = []

        cats = model.failures.categories
        self.cats = cats
        self.cat_index = {c.name: i for i, c in enumerate(cats)}
        per = 1.0 / 1000.0 / DAY
        self.lemon_cats = [i for i, c in enumerate(cats) if c.lemon and c.rate > 0]
        self.other_cats = [i for i, c in enumerate(cats) if not c.lemon and c.rate > 0]
        self.lemon_rate = sum(cats[i].rate for i in self.lemon_cats) * per
        self.other_rate = sum(cats[i].rate for i in self.other_cats) * per
        self.planned_rate = model.failures.planned.rate * per
        self.lemon_cum = list(itertools.accumulate(cats[i].rate for i in self.lemon_cats))
        self.other_cum = list(itertools.accumulate(cats[i].rate for i in self.other_cats))

        # --- per-node state (compact: scalars and the domain record)
        lem = model.failures.lemons
        self.is_lemon = [bool(x) for x in self.np_rng.random(self.n) < lem.fraction]
        self._norm = 1.0
        raw = [self._fresh_factor(bool(x)) for x in self.is_lemon]
        # The fleet's mean factor is exactly 1, so category rates are fleet means.
        self._norm = self.n / sum(raw)
        self.mult = [x * self._norm for x in raw]
        self._rebuild_weights()
        # The policy's hot spares come from the nodes beyond the job's (domain.spares).
        hot = min(policy.spares.wanted(self.n), self.spares)
        self.records = [
            replace(
                NodeRecord.new(f"node-{i:05d}", at=0.0, state=S.PRODUCTION, reason="in service"),
                spare=i >= self.n - hot,
            )
            for i in range(self.n)
        ]
        self.node_policy = self._node_policies()
        """Per node, the policy it follows (domain.policy_groups: its override or the fleet's)."""
        self.promotions = 0
        self.spare_set = {i for i, r in enumerate(self.records) if r.is_spare}
        self.fleet = FleetView.of(self.records)
        self.gen = [0] * self.n
        self.fault = [-1] * self.n
        self.cure = [0] * self.n
        self.evidence: dict[int, Evidence] = {}
        self.crashes = [0] * self.n
        self.maint_seconds: dict[int, float] = {}
        self.tick_pending: set[int] = set()
        self.backoff: dict[int, float] = {}
        self.sdc_mark: dict[int, float] = {}
        self.silent: set[int] = set()
        self.broken: set[int] = set()
        self.diag_pending: set[int] = set()
        self.idle: set[int] = set(range(self.n))
        self.state_count: dict[NodeState, int] = {s: 0 for s in NodeState}
        self.state_count[S.PRODUCTION] = self.n

        # --- outputs
        self.buckets = dict.fromkeys(BUCKETS, 0.0)
        self.onsets = [0] * len(cats)
        self.job_onsets = [0] * len(cats)
        self.interruptions: dict[str, int] = {}
        self.handled: dict[str, dict[str, int]] = {c.name: {} for c in cats}
        self.decisions = 0
        self.held = 0
        self.human_actions = 0
        self.planned_count = 0
        self.replaced = 0
        self.rolled_back = 0.0
        self.lemons_replaced = 0
        self.timeline: dict[str, list[float]] = {
            "t_days": [],
            "production": [],
            "out": [],
            "people": [],
            "job_nodes": [],
            "running": [],
        }
        self.job = _Job()
        self.waited = 0.0
        rg = model.job.replica_groups
        self.replica = rg if rg.enabled else None
        self.share = min(1.0, rg.nodes_per_group / self.job_nodes)
        """The fraction of the job one replica group is."""
        self.group_out: dict[int, tuple[float, float]] = {}
        """Job nodes whose group is out (fault): (since, the report's delay)."""
        self.missing: list[float] = []
        """Groups out with no replacement yet: since when each is out."""
        self.rejoining: dict[int, float] = {}
        """Replacement (or restarting) node -> since when its group is out."""
        self.sdc_onset: dict[int, float] = {}
        self.pending: dict[str, dict[str, float]] = {"degraded": {}, "useful": {}}
        """Replica charges, moved at settlement out of the bucket they were counted in."""

    # ------------------------------------------------------------ scheduling

    def _at(self, t: float, kind: _Ev, node: int = -1, gen: int = 0, data: object = None) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), int(kind), node, gen, data))

    def _fresh_factor(self, lemon: bool) -> float:
        sigma = self.model.failures.lemons.spread
        x = self.rng.lognormvariate(-sigma * sigma / 2.0, sigma) if sigma > 0 else 1.0
        k = self.model.failures.lemons.multiplier if lemon else 1.0
        return self._norm * x * k

    def _rebuild_weights(self) -> None:
        self.weight_cum = list(itertools.accumulate(self.mult))

    def _next_arrival(self, kind: _Ev, rate_per_node: float, weight: float) -> None:
        total = rate_per_node * weight
        if total > 0:
            self._at(self.now + self.rng.expovariate(total), kind)

    # ------------------------------------------------------------------- run

    def run(self) -> RunResult:
        """Simulate the horizon and return the result."""
        self._next_arrival(_Ev.FAILURE, self.lemon_rate, self.weight_cum[-1])
        self._next_arrival(_Ev.OTHER_FAILURE, self.other_rate, self.n)
        self._next_arrival(_Ev.PLANNED, self.planned_rate, self.n)
        self._at(0.0, _Ev.SAMPLE)
        self._job_try_start()
        heap = self._heap
        handlers = self._handlers()
        step_progress = self.horizon / 100.0
        next_progress = step_progress
        while heap:
            t, _, kind, node, gen, data = heapq.heappop(heap)
            if t > self.horizon:
                break
            self.now = t
            handlers[kind](node, gen, data)
            if self.progress is not None and t >= next_progress:
                self.progress(t / self.horizon)
                next_progress += step_progress
        self.now = self.horizon
        self._settle_end()
        if self.progress is not None:
            self.progress(1.0)
        return self._result()

    def _handlers(self) -> dict[int, Callable[[int, int, object], None]]:
        return {
            _Ev.FAILURE: self._on_failure_arrival,
            _Ev.OTHER_FAILURE: self._on_other_arrival,
            _Ev.PLANNED: self._on_planned,
            _Ev.REPORT: self._on_report,
            _Ev.DRAIN_DONE: self._gen_guard(lambda i, d: self._decide(i, ev.DrainCompleted())),
            _Ev.STEP_DONE: self._gen_guard(self._on_step_done),
            _Ev.TICK: self._on_tick,
            _Ev.CHECKS_DONE: self._gen_guard(self._on_checks_done),
            _Ev.TRIAGE: self._gen_guard(self._on_triage),
            _Ev.HUMAN_FIXED: self._gen_guard(self._on_human_fixed),
            _Ev.REPLACED: self._gen_guard(self._on_replaced),
            _Ev.REGISTERED: self._gen_guard(lambda i, d: self._decide(i, ev.Registered())),
            _Ev.MAINT_DONE: self._gen_guard(self._on_maintenance_done),
            _Ev.HUMAN_DIAG: lambda i, g, d: self._on_human_diag(i),
            _Ev.RECRASH: self._on_recrash,
            _Ev.SYMPTOM: self._on_symptom,
            _Ev.PERF_REPORT: self._on_perf_report,
            _Ev.IDLE_CHECK: self._on_idle_check,
            _Ev.JOB_DETECTED: self._on_job_detected,
            _Ev.JOB_STARTED: self._on_job_started,
            _Ev.SAMPLE: self._on_sample,
            _Ev.GROUP_BACK: lambda i, g, d: self._on_group_back(i, d),
        }

    def _gen_guard(self, fn: Callable[[int, object], None]) -> Callable[[int, int, object], None]:
        def guarded(i: int, gen: int, data: object) -> None:
            if self.gen[i] == gen:
                fn(i, data)

        return guarded

    # -------------------------------------------------------------- decisions

    def _node_policies(self) -> list[Policy]:
        """Each node's policy, resolved from the labels a simulated node carries (its pool,
        its hostname and, with ``fleet.nvlinkDomainNodes``, its NVLink domain), the
        controller's way; each record gets its node group and NVLink domain."""
        per_domain = self.policy.safety.budget.per_domain
        size = self.model.fleet.nvlink_domain_nodes
        if not self.policy.overrides and (per_domain is None or size is None):
            return [self.policy] * self.n
        by_group: dict[str, Policy] = {}
        chosen: list[Policy] = []
        for i, record in enumerate(self.records):
            labels = {well_known.LABEL_POOL: record.pool, well_known.LABEL_HOSTNAME: record.name}
            if per_domain is not None and size is not None:
                labels[per_domain.label] = f"nvl-{i // size:04d}"
            group = policy_groups.group_of(self.policy, labels)
            if group not in by_group:
                by_group[group] = policy_groups.policy_for(self.policy, labels).policy
            chosen.append(by_group[group])
            domain = policy_groups.domain_of(self.policy, record.name, labels)
            self.records[i] = replace(record, group=group, nvlink_domain=domain)
        return chosen

    def _decide(self, i: int, event: ev.Event) -> None:
        before = self.records[i]
        d = decide(before, self.fleet, event, self.node_policy[i], self.now)
        self.decisions += 1
        after = d.record
        if len(after.history) > 1:  # reports keep counts, not per-node logs: flat memory
            after = replace(after, history=after.history[-1:])
        self.records[i] = after
        if after.is_spare:
            self.spare_set.add(i)
        else:
            self.spare_set.discard(i)
        self.fleet = apply_decision(self.fleet, before, d, now=self.now, policy=self.policy)
        if d.hold is not None:
            self.held += 1
            self._retry(i)
        elif not isinstance(event, ev.Tick):
            self.backoff.pop(i, None)
        if after.state is not before.state:
            self.gen[i] += 1
            self.state_count[before.state] -= 1
            self.state_count[after.state] += 1
            self._left(i, before.state, after.state)
        for action in d.actions:
            self._act(i, action)
        if after.state is not before.state:
            self._entered(i, after.state)

    def _retry(self, i: int) -> None:
        """Tick a held node again later: one pending retry per node, backing off to 1 h."""
        if i in self.tick_pending:
            return
        wait = self.backoff.get(i, self.model.remediation.retry_seconds)
        self.backoff[i] = min(2.0 * wait, 3600.0)
        self.tick_pending.add(i)
        self._at(self.now + wait, _Ev.TICK, i, -1)

    def _on_tick(self, i: int, gen: int, _d: object) -> None:
        if gen == -1:
            self.tick_pending.discard(i)
        self._decide(i, ev.Tick())

    def _act(self, i: int, a: Action) -> None:
        rem = self.model.remediation
        kind = a.kind
        if kind is ActionKind.DRAIN:
            self._at(self.now + rem.drain_seconds, _Ev.DRAIN_DONE, i, self.gen[i])
        elif kind is ActionKind.RUN_STEP:
            assert a.step is not None
            cost = rem.steps[a.step]
            took = cost.seconds * (0.5 + self.rng.random())
            ok = self.rng.random() < cost.success
            timeout = a.timeout_seconds
            if timeout is not None and took >= timeout:
                self._at(self.now + timeout, _Ev.TICK, i)
            else:
                self._at(self.now + took, _Ev.STEP_DONE, i, self.gen[i], (a.step, ok))
        elif kind is ActionKind.RUN_CHECKS:
            burn = a.profile == self.policy.checks.burn_in_profile
            took = rem.burn_in_seconds if burn else rem.verify_seconds
            self._at(self.now + took, _Ev.CHECKS_DONE, i, self.gen[i])

    def _left(self, i: int, source: NodeState, target: NodeState) -> None:
        if source is S.PRODUCTION:
            self.idle.discard(i)
            self._promote_spares(f"{self.records[i].name} left production")
            if i in self.job.nodes:
                self._job_release(i)
            elif i in self.rejoining:  # the replacement's node failed: another one
                self.missing.append(self.rejoining.pop(i))
                self._regroup()

    def _promote_spares(self, why: str) -> None:
        """The controller's rule: the spares the pool must give up now step in."""
        # spare_pool.promotions() with the counts the simulator keeps (one pool), not a
        # pass over every record: the same shortfall and the same choice.
        serving = self.state_count[S.PRODUCTION] - len(self.spare_set)
        missing = spare_pool.shortfall(self.n, serving, self.policy)
        for name in spare_pool.choose((self.records[k].name for k in self.spare_set), missing):
            j = int(name.rsplit("-", 1)[1])
            self._decide(j, ev.SparePromoted(why))
            if not self.records[j].spare:
                self.promotions += 1

    def _entered(self, i: int, state: NodeState) -> None:
        rem = self.model.remediation
        g = self.gen[i]
        if state is S.PRODUCTION:
            self.idle.add(i)
            self.crashes[i] = 0
            self._maybe_idle_check(i)
            if self.fault[i] >= 0 and self.cats[self.fault[i]].effect.silent:
                self._silent_watch(i)
            if self.job.phase is _Phase.WAIT:
                self._job_try_start()
            elif self.missing:
                self._regroup()
        elif state is S.TRIAGE:
            self._at(
                self.now + self.rng.expovariate(1.0 / rem.human.response_seconds), _Ev.TRIAGE, i, g
            )
        elif state is S.RMA:
            self._at(self.now + self.rng.expovariate(1.0 / rem.rma_seconds), _Ev.REPLACED, i, g)
        elif state is S.MAINTENANCE:
            took = self.maint_seconds.pop(i, rem.human.repair_seconds)
            self._at(self.now + took, _Ev.MAINT_DONE, i, g)
        elif state is S.PROVISIONING:
            self._at(self.now + rem.provisioning_seconds, _Ev.REGISTERED, i, g)

    # ---------------------------------------------------------------- faults

    def _on_failure_arrival(self, _n: int, _g: int, _d: object) -> None:
        total = self.weight_cum[-1]
        i = min(bisect.bisect_right(self.weight_cum, self.rng.random() * total), self.n - 1)
        c = self.lemon_cats[self._pick(self.lemon_cum)]
        self._fail(i, c)
        self._next_arrival(_Ev.FAILURE, self.lemon_rate, total)

    def _on_other_arrival(self, _n: int, _g: int, _d: object) -> None:
        i = self.rng.randrange(self.n)
        c = self.other_cats[self._pick(self.other_cum)]
        self._fail(i, c)
        self._next_arrival(_Ev.OTHER_FAILURE, self.other_rate, self.n)

    def _pick(self, cum: list[float]) -> int:
        return min(bisect.bisect_right(cum, self.rng.random() * cum[-1]), len(cum) - 1)

    def _fail(self, i: int, c: int) -> None:
        """A fault starts on node ``i`` (only serving nodes are exposed)."""
        if self.records[i].state is not S.PRODUCTION or self.fault[i] >= 0:
            return
        cat = self.cats[c]
        self.onsets[c] += 1
        if i in self.job.nodes:
            self.job_onsets[c] += 1
        cure = self._sample_cure(cat)
        evidence = self._evidence(cat)
        in_job = i in self.job.nodes
        det = self.model.detection
        if CURES[cure] is not Step.RESTART_JOB:
            self.fault[i] = c
            self.cure[i] = cure
            self.evidence[i] = evidence
        else:
            self._handled(c, "job-restart")
        if cat.effect.silent:
            self.silent.add(i)
            if in_job:
                if cat.effect is Effect.SDC:
                    self.sdc_onset[i] = self.now
                if cat.effect is Effect.SDC and self.job.phase is _Phase.RUNNING:
                    self.sdc_mark[i] = self._committed_at(self.now)
                elif cat.effect is Effect.SDC:
                    self.sdc_mark[i] = self.buckets["useful"]
                if cat.effect is Effect.SLOW:
                    self._update_rate()
            self._silent_watch(i)
            self._maybe_idle_check(i)
            return
        if self.fault[i] >= 0:
            self.broken.add(i)
        if det.passive and cat.attributed:  # queued first: isolation precedes the restart
            self._at(self.now + det.passive_seconds, _Ev.REPORT, i, c, self._fault_event(i, c))
        if in_job and self.job.phase in (_Phase.RUNNING, _Phase.RESTART):
            self._job_interrupted(c)
            if cat.effect is Effect.HANG and not (cat.attributed and det.passive):
                delay = det.hang_timeout_seconds
            else:
                delay = det.passive_seconds if det.passive else 0.0
            if self.replica is not None and self.job.phase is _Phase.RUNNING:
                self._group_lost(i, delay)
                if not cat.attributed and self.fault[i] >= 0:
                    self._start_diagnosis(i, delay)  # nobody names the node: a person
                return
            self._job_fail(delay)
            if not det.passive and self.fault[i] >= 0:
                self._start_diagnosis(i, delay)

    def _sample_cure(self, cat: Category) -> int:
        x = self.rng.random()
        acc = 0.0
        last = 0
        for step, p in cat.cure.items():
            acc += p
            last = CURES.index(step)
            if x < acc:
                return last
        return last

    def _evidence(self, cat: Category) -> Evidence:
        if cat.scope is Scope.GPU:
            return Evidence(gpu_index=self.rng.randrange(self.model.fleet.gpus_per_node))
        if cat.scope is Scope.LINK:
            return Evidence(
                hca=f"mlx5_{self.rng.randrange(self.model.fleet.gpus_per_node)}", port=1
            )
        return Evidence()

    def _fault_event(self, i: int, c: int, kind: FaultKind | None = None) -> FaultEvent:
        cat = self.cats[c]
        evidence = self.evidence.get(i) or self._evidence(cat)
        name = self.records[i].name
        if kind is None and cat.xid is not None:
            return FaultEvent(FaultKind.XID, name, self.now, xid=cat.xid, evidence=evidence)
        k = kind or cat.fault
        assert k is not None
        return FaultEvent(k, name, self.now, evidence=evidence)

    def _on_report(self, i: int, c: int, data: object) -> None:
        assert isinstance(data, FaultEvent)
        fault = replace(data, at=self.now)
        self._decide(i, ev.FaultObserved(fault))

    def _handled(self, c: int, how: str) -> None:
        h = self.handled[self.cats[c].name]
        h[how] = h.get(how, 0) + 1

    def _repair(self, i: int, how: str) -> None:
        """The node's fault is gone (a step, a person or new hardware fixed it)."""
        c = self.fault[i]
        if c < 0:
            return
        self._handled(c, how)
        self.fault[i] = -1
        self.evidence.pop(i, None)
        self.broken.discard(i)
        self.crashes[i] = 0
        if i in self.group_out:  # fixed in place (a job restart): the group starts again
            self._group_restarts(i)
        if i in self.silent:
            self.silent.discard(i)
            self.sdc_mark.pop(i, None)
            if i in self.job.nodes:
                self._update_rate()

    # ------------------------------------------------------- silent faults

    def _silent_watch(self, i: int) -> None:
        """Schedule the ways a silent fault can come to light while it lasts."""
        c = self.fault[i]
        cat = self.cats[c]
        self._at(self.now + self.rng.expovariate(1.0 / cat.symptom_mean_seconds), _Ev.SYMPTOM, i, c)
        det = self.model.detection
        if cat.effect is Effect.SLOW and det.performance_monitoring:
            self._at(self.now + self._report_every(), _Ev.PERF_REPORT, i, c)

    def _maybe_idle_check(self, i: int) -> None:
        ac = self.model.detection.active_checks
        c = self.fault[i]
        if not ac.enabled or c < 0 or i not in self.idle:
            return
        cov = self.cats[c].check_coverage if self.cats[c].effect.silent else 1.0
        if cov <= 0:
            return
        tries = 1
        while self.rng.random() >= cov:
            tries += 1
        wait = ac.idle_interval_seconds * (self.rng.random() + tries - 1)
        self._at(self.now + wait, _Ev.IDLE_CHECK, i, c)

    def _check_report(self, i: int, c: int) -> None:
        cat = self.cats[c]
        if i in self.sdc_mark:  # the job trained on it: its checkpoints since then are bad
            self._sdc_rollback(i)
        self._decide(i, ev.FaultObserved(self._fault_event(i, c, cat.check_fault)))

    def _on_idle_check(self, i: int, c: int, _d: object) -> None:
        if self.fault[i] == c and i in self.idle and self.records[i].state is S.PRODUCTION:
            self._check_report(i, c)

    def _on_symptom(self, i: int, c: int, _d: object) -> None:
        """The job's own symptoms reveal a silent fault (NaN loss, an MFU drop)."""
        if self.fault[i] != c or i not in self.job.nodes:
            if self.fault[i] == c:
                self._silent_watch_later(i, c)
            return
        cat = self.cats[c]
        if cat.effect is Effect.SDC:
            self._sdc_rollback(i)
        if self.model.detection.passive:
            self._decide(i, ev.FaultObserved(self._fault_event(i, c)))
        if self.fault[i] == c and self.records[i].state is S.PRODUCTION:
            self._start_diagnosis(i, 0.0)

    def _silent_watch_later(self, i: int, c: int) -> None:
        cat = self.cats[c]
        self._at(self.now + self.rng.expovariate(1.0 / cat.symptom_mean_seconds), _Ev.SYMPTOM, i, c)

    def _on_perf_report(self, i: int, c: int, _d: object) -> None:
        if self.fault[i] != c or self.records[i].state is not S.PRODUCTION:
            return
        if i in self.job.nodes and self.job.phase is _Phase.RUNNING:
            self._decide(i, ev.FaultObserved(self._fault_event(i, c)))
        if self.fault[i] == c and self.records[i].state is S.PRODUCTION:
            self._at(self.now + self._report_every(), _Ev.PERF_REPORT, i, c)

    def _report_every(self) -> float:
        """Straggler reports: the policy's interval, as the agents use it."""
        return self.policy.detection.stragglers.report_every_seconds

    def _sdc_rollback(self, i: int) -> None:
        """Checkpoints written since the corruption began are bad: roll back past them."""
        mark = self.sdc_mark.pop(i, None)
        if mark is not None and self.replica is not None and self.job.phase is _Phase.RUNNING:
            # The fingerprint vote names the group: its steps since the flip are discarded,
            # the other groups hold good weights (no rollback); the group leaves.
            since = self.sdc_onset.pop(i, self.now)
            self._charge("useful", "redone", self.share * (self.now - since))
            self.rolled_back += self.share * (self.now - since)
            self._group_lost(i, 0.0, step=False)
            return
        if mark is not None:
            if self.job.phase is _Phase.RUNNING:  # stop, and restart from an older checkpoint
                self._job_interrupted(self.fault[i])
                self._job_fail(0.0)
            back = max(0.0, self.buckets["useful"] - mark)
            self.buckets["useful"] -= back
            self.buckets["redone"] += back
            self.rolled_back += back

    # --------------------------------------------------------------- people

    def _start_diagnosis(self, i: int, delay: float) -> None:
        """Nobody's monitor named the node: a person looks for it; the job waits."""
        if i in self.diag_pending:
            return
        self.diag_pending.add(i)
        took = self.rng.expovariate(1.0 / self.model.remediation.human.diagnosis_seconds)
        self._at(self.now + delay + took, _Ev.HUMAN_DIAG, i)

    def _on_human_diag(self, i: int) -> None:
        self.diag_pending.discard(i)
        if self.records[i].state is S.PRODUCTION and self.fault[i] >= 0:
            self.human_actions += 1
            self.maint_seconds[i] = self._human_fix_seconds(i)
            self._decide(i, ev.MaintenanceRequested(reason="operator: job failures on this node"))
        if self.job.phase is _Phase.DIAGNOSE and not self._blocking_diagnoses():
            self._to_phase(_Phase.WAIT)
            self._job_try_start()

    def _human_fix_seconds(self, i: int) -> float:
        rem = self.model.remediation
        if CURES[self.cure[i]] is Step.RMA or self.is_lemon[i]:
            return self.rng.expovariate(1.0 / rem.rma_seconds)
        return self.rng.expovariate(1.0 / rem.human.repair_seconds)

    def _on_maintenance_done(self, i: int, _d: object) -> None:
        if self.fault[i] >= 0:
            rma = CURES[self.cure[i]] is Step.RMA or self.is_lemon[i]
            self._repair(i, "rma" if rma else "person")
            if rma:
                self._new_hardware(i)
        self._decide(i, ev.MaintenanceCompleted(reason="maintenance done"))

    def _on_triage(self, i: int, _d: object) -> None:
        self.human_actions += 1
        lemons = self.model.failures.lemons
        lemon_found = self.is_lemon[i] and self.rng.random() < lemons.found_by_triage
        if (self.fault[i] >= 0 and CURES[self.cure[i]] is Step.RMA) or lemon_found:
            self._decide(i, ev.OperatorRMA(reason="operator: hardware replacement"))
            return
        took = self.rng.expovariate(1.0 / self.model.remediation.human.repair_seconds)
        self._at(self.now + took, _Ev.HUMAN_FIXED, i, self.gen[i])

    def _on_human_fixed(self, i: int, _d: object) -> None:
        self._repair(i, "person")
        self._decide(i, ev.OperatorReturn(reason="operator: repaired"))

    def _on_replaced(self, i: int, _d: object) -> None:
        self._repair(i, "rma")
        self._new_hardware(i)
        self._decide(i, ev.HardwareReplaced(reason="vendor replaced the hardware"))

    def _new_hardware(self, i: int) -> None:
        self.replaced += 1
        self.lemons_replaced += int(self.is_lemon[i])
        # New hardware is drawn like the rest of the fleet: it may be a lemon too.
        lemons = self.model.failures.lemons
        if lemons.fraction > 0 or lemons.spread > 0:
            self.is_lemon[i] = self.rng.random() < lemons.fraction
            self.mult[i] = self._fresh_factor(self.is_lemon[i])
            self._rebuild_weights()

    # ------------------------------------------------------------ remediation

    def _on_step_done(self, i: int, data: object) -> None:
        assert isinstance(data, tuple)
        step, ok = data
        if ok and self.fault[i] >= 0:
            cure = CURES[self.cure[i]]
            if cure is not Step.RMA and severity(step) >= severity(cure):
                self._repair(i, str(step))
        self._decide(i, ev.StepCompleted(step=step, succeeded=ok))

    def _on_checks_done(self, i: int, _d: object) -> None:
        c = self.fault[i]
        passed = c < 0 or (
            self.cats[c].effect.silent and self.rng.random() >= self.cats[c].check_coverage
        )
        self._decide(i, ev.ChecksCompleted(passed=passed, detail="" if passed else "checks failed"))

    def _on_planned(self, _n: int, _g: int, _d: object) -> None:
        i = self.rng.randrange(self.n)
        if self.records[i].state is S.PRODUCTION:
            self.planned_count += 1
            if i in self.job.nodes:
                self.interruptions["planned"] = self.interruptions.get("planned", 0) + 1
            self.maint_seconds[i] = self.model.failures.planned.duration_seconds
            self._decide(i, ev.MaintenanceRequested(reason="planned maintenance"))
        self._next_arrival(_Ev.PLANNED, self.planned_rate, self.n)

    def _on_recrash(self, i: int, c: int, _d: object) -> None:
        """The job failed again on a node whose fault nobody repaired."""
        if self.fault[i] != c or i not in self.job.nodes or self.job.phase is not _Phase.RUNNING:
            return
        det = self.model.detection
        self.crashes[i] += 1
        self.interruptions["repeat"] = self.interruptions.get("repeat", 0) + 1
        delay = det.passive_seconds if det.passive else 0.0
        if det.passive and self.cats[c].attributed:
            self._at(self.now + det.passive_seconds, _Ev.REPORT, i, c, self._fault_event(i, c))
        if self.replica is not None:
            self._group_lost(i, delay)
        else:
            self._job_fail(delay)
        if not det.passive or self.crashes[i] >= self.model.remediation.human.after_crashes:
            self._start_diagnosis(i, delay)

    # -------------------------------------------------------------------- job

    def _committed_at(self, t: float) -> float:
        """Useful work secured by the last checkpoint before ``t`` (running job)."""
        j = self.job
        period = self.interval + self.ckpt_cost
        k = math.floor((t - j.seg_start) / period)
        area = j.rate_area + j.rate * (t - j.rate_since)
        avg = area / (t - j.seg_start) if t > j.seg_start else j.rate
        return self.buckets["useful"] + k * self.interval * avg

    def _to_phase(self, phase: _Phase) -> None:
        j = self.job
        if j.phase is not _Phase.RUNNING:
            spent = self.now - j.since
            if j.phase is _Phase.RESTART and j.save_extra > 0:
                saved = min(spent, j.save_extra)
                self.buckets["checkpoint"] += saved
                spent -= saved
                j.save_extra = 0.0
            self.buckets[_PHASE_BUCKET[j.phase]] += spent
            if j.phase is _Phase.WAIT:
                self.waited += spent
        j.phase = phase
        j.since = self.now
        j.gen += 1

    def _settle(self, *, failed: bool) -> None:
        """Close a running segment: useful, lost, checkpoint and degraded time."""
        j = self.job
        b = self.buckets
        wall = self.now - j.seg_start
        if wall <= 0:
            return
        period = self.interval + self.ckpt_cost
        k = math.floor(wall / period)
        rest = wall - k * period
        area = j.rate_area + j.rate * (self.now - j.rate_since)
        avg = area / wall
        if failed:
            kept = k * self.interval
            b["checkpoint"] += k * self.ckpt_cost
            b["redone"] += rest
        else:  # a graceful stop: the partial interval is saved on demand
            kept = k * self.interval + min(rest, self.interval)
            b["checkpoint"] += k * self.ckpt_cost + max(0.0, rest - self.interval)
        b["useful"] += kept * avg
        b["degraded"] += kept * (1.0 - avg)
        self._apply_charges()

    def _job_rate(self) -> float:
        j = self.job
        rate = len(j.nodes) / self.job_nodes
        if self.replica is not None:  # a node missing takes its whole group out
            missing = self.job_nodes - len(j.nodes) + len(self.group_out)
            rate = max(0.0, 1.0 - missing * self.share)
        for i in self.silent:
            if i in j.nodes:
                c = self.fault[i]
                if c >= 0 and self.cats[c].effect is Effect.SLOW:
                    rate *= 1.0 - self.cats[c].slowdown
        return rate

    def _update_rate(self) -> None:
        j = self.job
        if j.phase is not _Phase.RUNNING:
            return
        j.rate_area += j.rate * (self.now - j.rate_since)
        j.rate_since = self.now
        j.rate = self._job_rate()

    def _job_interrupted(self, c: int) -> None:
        name = self.cats[c].name
        self.interruptions[name] = self.interruptions.get(name, 0) + 1

    def _job_fail(self, delay: float) -> None:
        """The job stopped (crash, hang, rollback); it is noticed after ``delay``."""
        j = self.job
        if j.phase is _Phase.RUNNING:
            self._settle(failed=True)
        if j.phase in (_Phase.RUNNING, _Phase.RESTART):
            self._to_phase(_Phase.DETECT)
            j.detect_until = self.now + delay
        elif j.phase is _Phase.DETECT:
            j.detect_until = max(j.detect_until, self.now + delay)
        else:
            return
        j.gen += 1
        self._at(j.detect_until, _Ev.JOB_DETECTED, -1, j.gen)

    def _job_release(self, i: int) -> None:
        """A node of the job leaves production."""
        j = self.job
        j.nodes.discard(i)
        if j.phase is _Phase.RUNNING and self.replica is not None:
            self._group_released(i)
            return
        if j.phase is _Phase.RUNNING:
            # Drained on purpose while the job runs: save, then restart without it.
            self._settle(failed=False)
            self._to_phase(_Phase.WAIT)
            self._job_try_start(save=self.ckpt_cost)
        elif j.phase is _Phase.RESTART:
            self._fill()
            if len(j.nodes) < self.min_nodes:
                self._to_phase(_Phase.WAIT)

    def _blocking_diagnoses(self) -> bool:
        return any(self.records[i].state is S.PRODUCTION for i in self.diag_pending)

    def _on_job_detected(self, _n: int, gen: int, _d: object) -> None:
        if gen != self.job.gen or self.job.phase is not _Phase.DETECT:
            return
        if self._blocking_diagnoses():
            self._to_phase(_Phase.DIAGNOSE)
            return
        self._to_phase(_Phase.WAIT)
        self._job_try_start()

    def _fill(self) -> None:
        j = self.job
        want = self.job_nodes - len(j.nodes)
        if want <= 0:
            return
        ready = sorted(i for i in self.idle if not self.records[i].spare)
        for i in ready[:want]:
            if i not in self.diag_pending:
                j.nodes.add(i)
        self.idle.difference_update(j.nodes)

    def _job_try_start(self, save: float = 0.0) -> None:
        """Allocate nodes and begin a restart, or wait for nodes."""
        j = self.job
        if j.phase not in (_Phase.WAIT,):
            return
        self._fill()
        if len(j.nodes) < self.min_nodes:
            return
        if (
            self.model.detection.active_checks.preflight
            and self.model.detection.active_checks.enabled
        ):
            for i in sorted(self.silent & j.nodes):
                c = self.fault[i]
                if c >= 0 and self.rng.random() < self.cats[c].check_coverage:
                    self._check_report(i, c)
            if len(j.nodes) < self.min_nodes:
                self._fill()
                if len(j.nodes) < self.min_nodes:
                    return
        self._to_phase(_Phase.RESTART)
        j.save_extra = save
        job = self.model.job
        self._at(
            self.now + save + job.requeue_seconds + job.restart_seconds, _Ev.JOB_STARTED, -1, j.gen
        )

    def _on_job_started(self, _n: int, gen: int, _d: object) -> None:
        j = self.job
        if gen != j.gen or j.phase is not _Phase.RESTART:
            return
        self._to_phase(_Phase.RUNNING)
        j.seg_start = j.rate_since = self.now
        j.rate_area = 0.0
        j.rate = self._job_rate()
        mean = self.model.remediation.recrash_seconds
        for i in sorted(self.broken & j.nodes):
            self._at(self.now + self.rng.expovariate(1.0 / mean), _Ev.RECRASH, i, self.fault[i])
        for i in sorted(self.silent & j.nodes):
            c = self.fault[i]
            if c >= 0 and self.cats[c].effect is Effect.SDC:
                self.sdc_mark.setdefault(i, self.buckets["useful"])

    # ---------------------------------------------------------- replica groups

    def _charge(self, source: str, category: str, seconds: float) -> None:
        """Move ``seconds`` (of the whole job) from ``source`` to ``category`` at settlement."""
        if seconds > 0:
            pending = self.pending[source]
            pending[category] = pending.get(category, 0.0) + seconds

    def _apply_charges(self) -> None:
        b = self.buckets
        for source, pending in self.pending.items():
            total = sum(pending.values())
            if total <= 0:
                continue
            scale = min(1.0, b[source] / total)
            for category, seconds in pending.items():
                b[category] += seconds * scale
                b[source] -= seconds * scale
            pending.clear()

    def _charge_out(self, since: float, delay: float) -> None:
        """A fault's group outage up to now: detection until the report, then isolation."""
        spent = self.now - since
        found = min(delay, spent)
        self._charge("degraded", "detection", self.share * found)
        self._charge("degraded", "isolation", self.share * (spent - found))

    def _group_lost(self, i: int, delay: float, *, step: bool = True) -> None:
        """Node ``i``'s group stops; the others lose at most the step in progress."""
        rg = self.replica
        assert rg is not None
        if step:
            self._charge("useful", "redone", rg.step_seconds * (1.0 - self.share))
        if i in self.group_out or i in self.rejoining:
            return
        if self.fault[i] < 0 and i not in self.silent:
            # An application fault (cured by a restart): the group restarts in place.
            self.job.nodes.discard(i)
            self.rejoining[i] = self.now + delay
            self._charge("degraded", "detection", self.share * delay)
            self._at(self.now + delay + rg.rejoin_seconds, _Ev.GROUP_BACK, i)
        else:
            # Out until the node leaves production; if it stays (the policy waits for
            # more evidence), the group restarts on it after its report and a rejoin.
            self.group_out[i] = (self.now, delay)
            self._at(self.now + delay + rg.rejoin_seconds, _Ev.GROUP_BACK, i, 0, self.now)
        self._update_rate()

    def _group_restarts(self, i: int) -> None:
        """The fault on node ``i`` was cured while it stayed in production: its group restarts."""
        rg = self.replica
        assert rg is not None
        self._charge_out(*self.group_out.pop(i))
        self.job.nodes.discard(i)
        self.rejoining[i] = self.now
        self._at(self.now + rg.rejoin_seconds, _Ev.GROUP_BACK, i)
        self._update_rate()

    def _group_released(self, i: int) -> None:
        """Node ``i`` left production while in the job: its group is (or goes) out."""
        rg = self.replica
        assert rg is not None
        out = self.group_out.pop(i, None)
        if out is not None:
            self._charge_out(*out)
            self.missing.append(self.now)
        else:  # drained on purpose: the notice, the group finishes its step and leaves
            self._charge("degraded", "isolation", self.share * rg.depart_seconds)
            self.missing.append(self.now + rg.depart_seconds)
        self._regroup()
        self._update_rate()

    def _regroup(self) -> None:
        """Start a replacement group on each free node (a promoted spare first)."""
        rg = self.replica
        if rg is None or self.job.phase is not _Phase.RUNNING:
            return
        while self.missing:
            ready = sorted(
                i for i in self.idle if not self.records[i].spare and i not in self.diag_pending
            )
            if not ready:
                return
            i = ready[0]
            self.idle.discard(i)
            self.rejoining[i] = self.missing.pop(0)
            self._at(self.now + rg.rejoin_seconds, _Ev.GROUP_BACK, i)

    def _on_group_back(self, i: int, retry: object = None) -> None:
        if isinstance(retry, float):  # a group out on a node still in production
            out = self.group_out.get(i)
            if out is None or out[0] != retry or i not in self.job.nodes:
                return
            self._charge_out(*self.group_out.pop(i))
            self._update_rate()
            if self.fault[i] >= 0 and i in self.broken:
                mean = self.model.remediation.recrash_seconds
                c = self.fault[i]
                self._at(self.now + self.rng.expovariate(1.0 / mean), _Ev.RECRASH, i, c)
            return
        since = self.rejoining.pop(i, None)
        if since is None or self.job.phase is not _Phase.RUNNING:
            return
        if self.records[i].state is not S.PRODUCTION:
            self.missing.append(since)
            self._regroup()
            return
        self.job.nodes.add(i)
        self._charge("degraded", "recovery", self.share * (self.now - since))
        self._update_rate()

    def _settle_end(self) -> None:
        j = self.job
        if self.replica is not None and j.phase is _Phase.RUNNING:
            # Outages still going on at the horizon, charged as far as they got.
            for since, delay in self.group_out.values():
                self._charge_out(since, delay)
            for since in self.rejoining.values():
                self._charge("degraded", "recovery", self.share * (self.now - since))
            # self.missing: no replacement yet, degraded until the end (left where it is).
        if j.phase is _Phase.RUNNING:
            self._settle(failed=False)
            j.phase = _Phase.WAIT  # nothing more to account
            j.since = self.now
        else:
            self._to_phase(j.phase)
        for i in range(self.n):
            if self.fault[i] >= 0:
                self._handled(self.fault[i], "open")

    # ---------------------------------------------------------------- outputs

    def _on_sample(self, _n: int, _g: int, _d: object) -> None:
        tl = self.timeline
        sc = self.state_count
        tl["t_days"].append(self.now / DAY)
        tl["production"].append(sc[S.PRODUCTION])
        tl["out"].append(sc[S.DRAINING] + sc[S.REMEDIATING] + sc[S.VERIFYING])
        tl["people"].append(
            sc[S.TRIAGE] + sc[S.RMA] + sc[S.MAINTENANCE] + sc[S.PROVISIONING] + sc[S.BURN_IN]
        )
        tl["job_nodes"].append(len(self.job.nodes))
        tl["running"].append(1.0 if self.job.phase is _Phase.RUNNING else 0.0)
        self._at(self.now + self.horizon / TIMELINE_POINTS, _Ev.SAMPLE)

    def _result(self) -> RunResult:
        return RunResult(
            gpus=self.job_nodes * self.model.fleet.gpus_per_node,
            job_nodes=self.job_nodes,
            spare_nodes=self.spares,
            hot_spares=sum(1 for r in self.records if r.is_spare),
            spare_promotions=self.promotions,
            days=self.days,
            seed=self.seed,
            checkpoint_interval_seconds=self.interval,
            buckets=dict(self.buckets),
            incidents={c.name: self.onsets[k] for k, c in enumerate(self.cats)},
            job_incidents={c.name: self.job_onsets[k] for k, c in enumerate(self.cats)},
            interruptions=dict(sorted(self.interruptions.items())),
            handled={k: dict(sorted(v.items())) for k, v in self.handled.items() if v},
            planned=self.planned_count,
            lemons=int(sum(self.is_lemon)) + self.lemons_replaced,
            lemons_replaced=self.lemons_replaced,
            replaced=self.replaced,
            sdc_rollback_hours=self.rolled_back / 3600.0,
            waiting_hours=self.waited / 3600.0,
            decisions=self.decisions,
            held=self.held,
            human_actions=self.human_actions,
            timeline={k: list(v) for k, v in self.timeline.items()},
        )


def simulate(
    model: Model,
    policy: Policy,
    *,
    gpus: int,
    days: float,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
) -> RunResult:
    """Run one simulation (see :class:`Simulator`)."""
    return Simulator(model, policy, gpus=gpus, days=days, seed=seed, progress=progress).run()
