"""What gpufleet remembers about a node and sees of the fleet.

A :class:`NodeRecord` is everything :func:`~gpufleet.domain.decide` needs to
know about one node's past: its state and why, the open incident and its
ladder progress, recent fault occurrences (for repeat rules) and its lemon
score (:mod:`gpufleet.domain.lemon`). The controller stores it on the Node as an
annotation (Kubernetes is the database); the simulator keeps it in memory.

:class:`FleetView` is the part of the fleet a single decision needs: pool
sizes and how many nodes are out, the circuit breaker, recent disruptive
actions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from pydantic import TypeAdapter

from gpufleet.domain.faults import FaultEvent
from gpufleet.domain.ladder import Step
from gpufleet.domain.lemon import LemonScore
from gpufleet.domain.policy import DrainMode, RequeueMode, SlurmSilence, TaintEffect
from gpufleet.domain.safety import BreakerState
from gpufleet.domain.states import OUT_OF_SERVICE, NodeState, Transition

HISTORY_LIMIT = 20
"""Transitions kept per node; older ones live in Events and metrics."""


class Outcome(StrEnum):
    """How a remediation step ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    REFUSED = "refused"
    """Not carried out: the node was found not empty (it was drained again)."""


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One fault seen, kept to count repeats."""

    key: str
    scope: str
    at: float


@dataclass(frozen=True, slots=True)
class StepAttempt:
    """One try of a ladder step. Recorded *before* the step is carried out."""

    step: Step
    attempt: int
    started_at: float
    ended_at: float | None = None
    outcome: Outcome | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Incident:
    """Why the node is out, and how far its repair got."""

    key: str
    """Fault key (``xid-79``) or ``maintenance``."""
    description: str
    opened_at: float
    plan: Step | None
    """Where the ladder starts (or triage / rma); None for maintenance."""
    taint: TaintEffect = TaintEffect.NO_SCHEDULE
    drain_mode: DrainMode = DrainMode.EVICT
    requeue: RequeueMode = RequeueMode.NOW
    if_slurm_silent: SlurmSilence = SlurmSilence.WAIT
    """The rule's choice while Slurm is silent about the draining node."""
    drained: bool = False
    current: Step | None = None
    """The step in progress; None between steps (or before the first)."""
    tried: tuple[StepAttempt, ...] = ()
    checks_started_at: float | None = None
    command_timeout_s: float | None = None
    """A maintenance plan's command: how long the agent lets it run (its plan's
    ``commandTimeoutSeconds``, kept here so the controller needs no plan to ask)."""
    refusals: int = 0
    """Acts of this incident refused because the node was not empty (each sent the
    node back to draining; at :data:`~gpufleet.domain.decide.MAX_REFUSALS` it goes
    to triage instead: a person looks at what keeps landing on it)."""
    whole_domain: str = ""
    """A domain-scope MaintenancePlan's incident: the NVLink domain the plan empties as one
    (every tray at once). Its explicit scope is the operator's consent to exceed that
    domain's budget for this incident only (docs/decisions/0244); "" for any other."""
    acting_since: float | None = None
    """A domain-scope plan's command: when it was asked for, once every tray of the domain
    was empty (the node waited in ``maintenance`` before); None before, or for any other."""

    @property
    def maintenance(self) -> bool:
        """Whether an operator, not a fault, took the node out."""
        return self.plan is None


@dataclass(frozen=True, slots=True)
class QuarantinedGpu:
    """One GPU of a node taken out of service while the node stays in it
    (domain.gpu_quarantine): no new work is placed on it, the rest of the node keeps
    working, and it returns once the repair that needs the empty node verified it."""

    index: int
    """The GPU's index on the node (nvidia-smi's, Slurm's gres.conf order)."""
    uuid: str
    """The GPU's UUID as the agent reported it; "" where it did not say."""
    fault: str
    """The fault key as incidents name it (``xid-94``, ``row-remap-pending``)."""
    since: float
    """When the GPU was quarantined."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node's lifecycle memory."""

    name: str
    state: NodeState
    since: float
    reason: str
    pool: str = "default"
    group: str = ""
    """The node group (the FleetPolicy override its labels match, domain.policy_groups);
    "" for none. Like ``pool``, read again from the labels and the policy on every pass."""
    nvlink_domain: str = ""
    """The NVLink domain the node's labels place it in (domain.topology), counted only
    when the policy sets a per-domain budget; "" for none. Read again on every pass."""
    incident: Incident | None = None
    occurrences: tuple[Occurrence, ...] = ()
    lemon: LemonScore | None = None
    """The node's and its GPUs' decayed, class-weighted fault score (None: no
    fault counted since the hardware was new)."""
    pending: FaultEvent | None = None
    """A fault whose isolation a safety rail withheld: kept (even after its
    condition clears) and retried on every Tick until it is acted on or an
    operator dismisses it. Never dropped silently."""
    pending_step: Step | None = None
    """The ladder step decided for :attr:`pending` when it was held: a retry acts
    on this even after the occurrences that justified it age out of the window."""
    checks_started_at: float | None = None
    """When the current burn-in run started."""
    spare: bool = False
    """A hot spare: in production, verified, kept out of training work until promoted
    (domain.spares). Only a node in production is one."""
    history: tuple[Transition, ...] = ()
    quarantined_gpus: tuple[QuarantinedGpu, ...] = ()
    """GPUs taken out of service one by one while the node stays in production (or
    drains for the repair that releases them); () for none. Stored only when set."""
    domain_wait: float | None = None
    """The node passed its checks and waits for its NVLink domain's burn-in: only a
    verdict kept after this time counts (domain.domain_burnin). Stored only when set."""

    @classmethod
    def new(
        cls,
        name: str,
        *,
        at: float,
        pool: str = "default",
        state: NodeState = NodeState.PROVISIONING,
        reason: str = "new node",
    ) -> NodeRecord:
        """A record for a node gpufleet has not seen before."""
        return cls(name=name, state=state, since=at, reason=reason, pool=pool)

    def moved(self, t: Transition) -> NodeRecord:
        """This record after a transition (history kept to HISTORY_LIMIT); a node
        that leaves production stops being a spare, and any move ends a wait for the
        domain burn-in (it is a wait in the state the checks passed in)."""
        history = (*self.history, t)[-HISTORY_LIMIT:]
        spare = self.spare and t.target is NodeState.PRODUCTION
        return replace(
            self,
            state=t.target,
            since=t.at,
            reason=t.reason,
            history=history,
            spare=spare,
            domain_wait=None,
        )

    @property
    def is_spare(self) -> bool:
        """A hot spare now (in production and marked)."""
        return self.spare and self.state is NodeState.PRODUCTION


_RECORD = TypeAdapter(NodeRecord)


def record_to_json(record: NodeRecord) -> str:
    """Serialise for storage (a Node annotation). A node of no group (no counted NVLink
    domain, no quarantined GPU) is written without ``group`` (``nvlink_domain``,
    ``quarantined_gpus``), as before they existed: the record on every Node of a fleet
    without them reads the same, so an upgrade rewrites none of them."""
    data = _RECORD.dump_python(record, mode="json")
    for key in ("group", "nvlink_domain", "quarantined_gpus"):
        if not data.get(key):
            data.pop(key, None)
    if data.get("domain_wait") is None:  # 0.0 is a time (the simulations start there)
        data.pop("domain_wait", None)
    return json.dumps(data, separators=(",", ":"))


def record_from_json(text: str) -> NodeRecord:
    """Parse a stored record; raises ValueError if it is not one."""
    return _RECORD.validate_python(json.loads(text))


@dataclass(frozen=True, slots=True)
class PoolView:
    """Size of a node pool and how many of its nodes automation holds out."""

    size: int
    out_of_service: int = 0
    spares: int = 0
    """Hot spares (in production, kept out of training work)."""


_NO_POOLS: Mapping[str, PoolView] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class FleetView:
    """What one decision needs to know about the rest of the fleet."""

    pools: Mapping[str, PoolView] = field(default_factory=lambda: _NO_POOLS)
    breaker: BreakerState = field(default_factory=BreakerState)
    groups: Mapping[str, PoolView] = field(default_factory=lambda: _NO_POOLS)
    """Node groups (FleetPolicy overrides) counted like pools, across pools."""
    domains: Mapping[str, PoolView] = field(default_factory=lambda: _NO_POOLS)
    """NVLink domains counted like pools, across pools and groups (a per-domain budget)."""
    domains_checking: Mapping[str, int] = field(default_factory=lambda: _NO_COUNTS)
    """Trays of each NVLink domain in burn-in or verifying: all of them means the domain
    has no tray in production (its burn-in takes no work; domain.domain_burnin)."""
    recent_actions: tuple[float, ...] = ()
    """Times of recent disruptive actions (rate limit)."""

    @property
    def size(self) -> int:
        """Nodes in the fleet."""
        return sum(p.size for p in self.pools.values())

    def pool(self, name: str) -> PoolView:
        """A pool's view; an unknown pool has size 0, so nothing may be taken out of it."""
        return self.pools.get(name, PoolView(size=0))

    def group(self, name: str) -> PoolView:
        """A node group's view; an unknown group has size 0, so nothing may be taken out."""
        return self.groups.get(name, PoolView(size=0))

    def domain(self, name: str) -> PoolView:
        """An NVLink domain's view (an unknown domain: size 0, nothing out)."""
        return self.domains.get(name, PoolView(size=0))

    @classmethod
    def of(
        cls,
        records: Iterable[NodeRecord],
        *,
        breaker: BreakerState | None = None,
        recent_actions: tuple[float, ...] = (),
    ) -> FleetView:
        """Count pools, node groups, NVLink domains and out-of-service nodes from records."""
        sizes: dict[str, int] = {}
        out: dict[str, int] = {}
        spares: dict[str, int] = {}
        records_list = list(records)
        for r in records_list:
            sizes[r.pool] = sizes.get(r.pool, 0) + 1
            if r.state in OUT_OF_SERVICE:
                out[r.pool] = out.get(r.pool, 0) + 1
            if r.is_spare:
                spares[r.pool] = spares.get(r.pool, 0) + 1
        pools = {
            p: PoolView(size=n, out_of_service=out.get(p, 0), spares=spares.get(p, 0))
            for p, n in sizes.items()
        }
        return cls(
            pools=MappingProxyType(pools),
            breaker=breaker or BreakerState(),
            recent_actions=recent_actions,
            groups=_count_by(records_list, _GROUP),
            domains=_count_by(records_list, _DOMAIN),
            domains_checking=_checking(records_list),
        )

    def with_change(self, before: NodeRecord | None, after: NodeRecord) -> FleetView:
        """This view after one node's record changed (pool counts only).

        ``before`` is None for a node the view has not counted yet: its pool
        grows by one, as if the view were rebuilt with :meth:`of`.
        """
        groups = _count_change(self.groups, before, after, _GROUP)
        domains = _count_change(self.domains, before, after, _DOMAIN)
        checking = _checking_change(self.domains_checking, before, after)
        view = (
            self if checking is self.domains_checking else replace(self, domains_checking=checking)
        )
        if before is None:
            pools = dict(self.pools)
            p = pools.get(after.pool, PoolView(size=0))
            out = p.out_of_service + int(after.state in OUT_OF_SERVICE)
            pools[after.pool] = PoolView(
                size=p.size + 1, out_of_service=out, spares=p.spares + int(after.is_spare)
            )
            return replace(view, pools=MappingProxyType(pools), groups=groups, domains=domains)
        was = before.state in OUT_OF_SERVICE
        now = after.state in OUT_OF_SERVICE
        if was == now and before.is_spare == after.is_spare and before.pool == after.pool:
            if groups is self.groups and domains is self.domains:
                return view
            return replace(view, groups=groups, domains=domains)
        pools = dict(self.pools)
        for name, delta, spare in (
            (before.pool, -int(was), -int(before.is_spare)),
            (after.pool, int(now), int(after.is_spare)),
        ):
            p = pools.get(name, PoolView(size=0))
            pools[name] = PoolView(
                size=p.size, out_of_service=p.out_of_service + delta, spares=p.spares + spare
            )
        return replace(view, pools=MappingProxyType(pools), groups=groups, domains=domains)


_GROUP = attrgetter("group")
_DOMAIN = attrgetter("nvlink_domain")
_NO_COUNTS: Mapping[str, int] = MappingProxyType({})
CHECKING: frozenset[NodeState] = frozenset({NodeState.BURN_IN, NodeState.VERIFYING})
"""The states a domain burn-in may run in (no work on the tray)."""


def _checking_key(r: NodeRecord | None) -> str:
    return r.nvlink_domain if r is not None and r.state in CHECKING else ""


def _checking(records: Iterable[NodeRecord]) -> Mapping[str, int]:
    """Trays of each NVLink domain in burn-in or verifying."""
    counts = Counter(k for r in records if (k := _checking_key(r)))
    return MappingProxyType(dict(counts)) if counts else _NO_COUNTS


def _checking_change(
    counts: Mapping[str, int], before: NodeRecord | None, after: NodeRecord
) -> Mapping[str, int]:
    """``counts`` after one record changed (the same object when nothing counted changed)."""
    was, now = _checking_key(before), _checking_key(after)
    if was == now:
        return counts
    changed = dict(counts)
    if was:
        changed[was] -= 1
        if not changed[was]:
            del changed[was]
    if now:
        changed[now] = changed.get(now, 0) + 1
    return MappingProxyType(changed)


def _count_by(
    records: Iterable[NodeRecord], key: Callable[[NodeRecord], str]
) -> Mapping[str, PoolView]:
    """Each node group's (or NVLink domain's: ``key``) size and out-of-service nodes
    (nodes of none are not counted)."""
    sizes: Counter[str] = Counter()
    out: Counter[str] = Counter()
    for r in records:
        k = key(r)
        if k:
            sizes[k] += 1
            out[k] += int(r.state in OUT_OF_SERVICE)
    if not sizes:
        return _NO_POOLS
    return MappingProxyType({g: PoolView(size=n, out_of_service=out[g]) for g, n in sizes.items()})


def _count_change(
    groups: Mapping[str, PoolView],
    before: NodeRecord | None,
    after: NodeRecord,
    key: Callable[[NodeRecord], str],
) -> Mapping[str, PoolView]:
    """``groups`` (counted by ``key``: node group or NVLink domain) after one record
    changed from ``before`` to ``after`` (the same object when nothing counted changed)."""
    was = (key(before), before.state in OUT_OF_SERVICE) if before is not None else None
    now = (key(after), after.state in OUT_OF_SERVICE)
    if was == now or (not now[0] and (was is None or not was[0])):
        return groups
    changed = dict(groups)
    for counted, sign in ((was, -1), (now, 1)):
        if counted is None or not counted[0]:
            continue
        p = changed.get(counted[0], PoolView(size=0))
        if p.size + sign == 0:
            del changed[counted[0]]  # as a rebuild gives it: no node, no entry
            continue
        changed[counted[0]] = PoolView(
            size=p.size + sign, out_of_service=p.out_of_service + sign * int(counted[1])
        )
    return MappingProxyType(changed)


def as_plain(record: NodeRecord) -> dict[str, Any]:
    """The record as plain JSON-able data (for CLIs and reports)."""
    data: dict[str, Any] = _RECORD.dump_python(record, mode="json")
    return data
