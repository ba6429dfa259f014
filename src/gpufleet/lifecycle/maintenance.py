"""MaintenancePlans: roll a reimage, a reboot or a drain-verify-return across nodes, in batches.

On every tick, for each MaintenancePlan the watch delivered (``on_plan``):

1. the selected nodes and where each is (:func:`gpufleet.domain.maintenance.node_phase`,
   read from the node's record: a restarted controller carries on);
2. a node of a ``noop`` plan waiting in ``maintenance`` gets ``MaintenanceCompleted``
   (verification next); a node of a ``command`` plan waits there for its agent's
   answer (the request went out with the record that entered ``maintenance``), and
   one with no answer past the command's timeout gets ``MaintenanceFailed``; a node
   asked for but not taken out yet (a rail held it) is asked again;
3. the next batch (:func:`gpufleet.domain.maintenance.next_batch`): recorded in the
   plan's status *first*, then asked for with ``MaintenanceRequested`` through the
   ordinary node pass, so pause, dry-run, the breaker and the budget gate it;
4. a verified reimage records the image version on the Node;
5. the status, written only when it changed (docs/decisions/0110).

Pause and abort start nothing new; nodes already out finish their cycle (they
are never left cordoned without their record's reason). A plan stops by itself
once ``maxFailures`` nodes failed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpufleet.api import conditions as cr_conditions
from gpufleet.api import maintenanceplan as api
from gpufleet.clock import Clock
from gpufleet.domain import agent_requests, node_reports, policy_groups, topology, well_known
from gpufleet.domain import events as ev
from gpufleet.domain import maintenance as mt
from gpufleet.domain.policy import DomainBudget
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.kubeapi import NODES, ApiError, NotFound, custom
from gpufleet.lifecycle.core import Feed, Json, log
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.lifecycle.ports import WritePort

PLANS = custom(api.PLURAL)
P = mt.NodePhase
BLOCKED = "blocked: "
"""A domain-scope plan's message when a whole domain can never be out at once."""


class MaintenancePlans:
    """``on_plan`` keeps the watched plans; ``run`` moves each one on (every tick).

    It asks for nodes through the ordinary node pass (``feed``), so the rails and
    the gate apply to what a plan starts as to any repair.
    """

    def __init__(
        self,
        client: WritePort,
        *,
        book: NodeBook,
        fleet: Fleet,
        policies: PolicyKeeper,
        feed: Feed,
        clock: Clock,
    ) -> None:
        self.client = client
        self.book = book
        self.fleet = fleet
        self.policies = policies
        self.feed = feed
        self.clock = clock
        self._plans: dict[str, Json] = {}
        """MaintenancePlans as the watch last delivered them."""

    def on_plan(self, body: Mapping[str, Any]) -> None:
        """A MaintenancePlan changed (watch event): kept for the next tick, unless it is
        older than the plan as this controller last wrote it (a late event would bring
        back a status without the nodes just started)."""
        name = str(body["metadata"]["name"])
        if not _older(body, self._plans.get(name)):
            self._plans[name] = dict(body)

    def on_plan_deleted(self, name: str) -> None:
        """A deleted plan starts nothing more; nodes it took out finish their cycle."""
        self._plans.pop(name, None)

    def reimage_version(self, name: str) -> str | None:
        """The ``spec.image`` of the plan whose reimage the node is in (its incident names
        the plan); None for a repair's reimage (the machine keeps its version) or a plan
        deleted since (the reimage installs the version the machine has)."""
        record = self.fleet.records.get(name)
        inc = record.incident if record is not None else None
        if inc is None or not inc.key.startswith(mt.KEY_PREFIX):
            return None
        plan = self._plans.get(inc.key.removeprefix(mt.KEY_PREFIX))
        spec = (plan or {}).get("spec") or {}
        image = spec.get("image") if spec.get("action") == mt.Action.REIMAGE.value else None
        return str(image) if image else None

    async def run(self) -> None:
        for name in sorted(self._plans):
            body = self._plans.get(name)
            if body is None:
                continue
            try:
                await self._run_plan(name, body)
            except ApiError as exc:
                log.warning("maintenanceplan=%s not moved on: %s", name, exc)

    async def _run_plan(self, name: str, body: Json) -> None:
        now = self.clock.now()
        try:
            spec = api.MaintenancePlanSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            problem = "; ".join(e["msg"] for e in exc.errors()[:3])
            await self._save_plan_status(name, body, _invalid(body, problem, now))
            return
        rollout = spec.rollout()
        old = (body.get("status") or {}).get("nodes") or []
        stored = {str(n.get("name")): n for n in old if n.get("name")}
        entries: dict[str, dict[str, Any]] = {}
        selected = set(self._selected(spec))
        for node in sorted(selected | set(stored)):
            prev = stored.get(node, {})
            started = prev.get("startedAt")
            started = float(started) if isinstance(started, int | float) else None
            phase = P(prev.get("phase", P.PENDING))
            if phase is P.PENDING and started is None and node not in selected:
                continue  # never started and no longer selected: not the plan's
            progress = mt.node_phase(self.fleet.records.get(node), name, phase, started)
            said = progress.message if phase not in mt.FINISHED else prev.get("message", "")
            entries[node] = {
                "name": node,
                "phase": progress.phase.value,
                "domain": self._domain(node, spec),
                "startedAt": started,
                "message": said[:300],
            }
            if prev.get("imageVersion"):
                entries[node]["imageVersion"] = prev["imageVersion"]
        stage = mt.plan_phase(rollout, (P(e["phase"]) for e in entries.values()), now=now)
        holding = stage in (mt.PlanPhase.PAUSED, mt.PlanPhase.ABORTED, mt.PlanPhase.STOPPED)
        for node, e in entries.items():
            if e["phase"] != P.REQUESTED:
                continue
            # Asked, never taken out: not started after all when the plan holds, or when the
            # node left production meanwhile (a fault, a person): asked again, it could be
            # taken from triage; it waits for production like any pending node.
            record = self.fleet.records.get(node)
            if holding:
                e.update(phase=P.PENDING.value, startedAt=None, message=f"not started ({stage})")
            elif record is not None and record.state is not NodeState.PRODUCTION:
                e.update(
                    phase=P.PENDING.value,
                    startedAt=None,
                    message=f"not started: the node left production ({record.state})",
                )
        await self._finish_held_nodes(name, spec, entries, now, stage)
        await self._record_versions(spec, entries)
        why = await self._start_batch(name, body, spec, rollout, entries, now)
        await self._save_plan_status(name, body, _status(body, rollout, entries, why, now))

    # ----------------------------------------------------------------- steps

    def _selected(self, spec: api.MaintenancePlanSpec) -> list[str]:
        wanted = spec.node_selector.items()
        found = []
        for node, nbody in self.book.items():
            labels = (nbody.get("metadata") or {}).get("labels") or {}
            if all(labels.get(k) == v for k, v in wanted):
                found.append(node)
        return found

    def _domain(self, node: str, spec: api.MaintenancePlanSpec) -> str:
        """The node's failure domain for the plan: the value of its failureDomainLabel, or
        for scope nvlinkDomain the NVLink domain domain.topology places it in."""
        labels = self.book.labels(node)
        if spec.scope is mt.Scope.NVLINK_DOMAIN:
            return self._nvlink(node, labels)
        return str(labels.get(spec.failure_domain_label, ""))

    def _nvlink(self, node: str, labels: Mapping[str, str]) -> str:
        """The NVLink domain of ``node`` as the per-domain budget reads it (its label, the
        fleet's ``perDomain.label`` or Topograph's default; the agent's clique wins)."""
        per_domain = self.policies.effective().safety.budget.per_domain
        label = (per_domain or DomainBudget()).label
        return topology.nvlink_domain_of(node, labels, label)

    async def _finish_held_nodes(
        self,
        name: str,
        spec: api.MaintenancePlanSpec,
        entries: Mapping[str, Json],
        now: float,
        stage: mt.PlanPhase,
    ) -> None:
        """Nodes of the plan waiting in ``maintenance``: a noop's are done at once; a
        command's wait for the agent's answer (read by the node pass), up to its timeout.
        A domain-scope plan moves each domain's trays together (:meth:`_move_domains`)."""
        if spec.action not in (mt.Action.NOOP, mt.Action.COMMAND):
            return
        whole = spec.scope is mt.Scope.NVLINK_DOMAIN
        if whole:
            stopped = stage in (mt.PlanPhase.ABORTED, mt.PlanPhase.STOPPED)
            await self._move_domains(name, spec, entries, stopped=stopped)
        for node in entries:
            record = self.fleet.records.get(node)
            if record is None or not mt.awaits_completion(record, name):
                continue
            if whole and spec.action is mt.Action.NOOP:
                continue
            if spec.action is mt.Action.NOOP:
                log.info("node=%s maintenance plan %s: done, verifying", node, name)
                await self.feed(node, mt.completion(name))
                continue
            overdue = mt.command_overdue(record, now)
            if overdue is not None:
                log.warning("node=%s %s", node, overdue.reason)
                await self.feed(node, overdue)

    async def _move_domains(
        self,
        name: str,
        spec: api.MaintenancePlanSpec,
        entries: Mapping[str, Json],
        *,
        stopped: bool,
    ) -> None:
        """Each NVLink domain's trays: the command asked of all once all are empty, all
        returned once all answered (:func:`gpufleet.domain.maintenance.domain_moves`)."""
        by_domain: dict[str, list[mt.Tray]] = {}
        for node, e in entries.items():
            record = self.fleet.records.get(node)
            if record is None or not e["domain"]:
                continue
            tray = mt.Tray(node, record, P(e["phase"]), self._answered(node, record))
            by_domain.setdefault(str(e["domain"]), []).append(tray)
        for domain, trays in sorted(by_domain.items()):
            moves = mt.domain_moves(
                name,
                spec.action,
                trays,
                command=spec.command,
                command_timeout_s=spec.command_timeout_seconds,
                stopped=stopped,
            )
            for node, event in moves:
                log.info(
                    "node=%s maintenance plan %s (NVLink domain %s): %s",
                    node,
                    name,
                    domain,
                    type(event).__name__,
                )
                await self.feed(node, event)

    def _answered(self, node: str, record: NodeRecord) -> bool:
        """Whether the agent answered the command the record asks for, and it passed."""
        body = self.book.get(node)
        result = node_reports.result_of(body) if body is not None else None
        expected = agent_requests.request_id(record)
        return (
            result is not None and expected is not None and result.id == expected and result.passed
        )

    async def _record_versions(
        self, spec: api.MaintenancePlanSpec, entries: Mapping[str, dict[str, Any]]
    ) -> None:
        """A verified reimage: the image version asked goes on the Node (once)."""
        if spec.action is not mt.Action.REIMAGE or not spec.image:
            return
        for node, e in entries.items():
            if e["phase"] != P.SUCCEEDED or e.get("imageVersion") == spec.image:
                continue
            annotations = self.book.annotations(node)
            if annotations.get(well_known.ANNOTATION_IMAGE_VERSION) != spec.image:
                patch = {
                    "metadata": {"annotations": {well_known.ANNOTATION_IMAGE_VERSION: spec.image}}
                }
                try:
                    await self.client.patch(NODES, node, patch)
                except NotFound:
                    continue
                except ApiError as exc:
                    log.warning("node=%s image version not recorded yet: %s", node, exc)
                    e["phase"] = P.VERIFYING.value  # not finished until it is recorded
                    continue
            e["imageVersion"] = spec.image

    async def _start_batch(
        self,
        name: str,
        body: Json,
        spec: api.MaintenancePlanSpec,
        rollout: mt.Rollout,
        entries: dict[str, dict[str, Any]],
        now: float,
    ) -> str:
        """Ask again for held nodes; start the next batch. Returns why not more."""
        whole = spec.scope is mt.Scope.NVLINK_DOMAIN

        def request(domain: str) -> ev.MaintenanceRequested:
            return mt.request(
                name,
                spec.action,
                image=spec.image,
                command=spec.command,
                command_timeout_s=spec.command_timeout_seconds,
                requeue=spec.requeue,
                drain_mode=spec.drain_mode,
                whole_domain=domain if whole else "",
            )

        for node, e in entries.items():
            if e["phase"] == P.REQUESTED:
                await self.feed(node, request(str(e["domain"])))
        policy = self.policies.effective()
        if policy.paused or policy.dry_run:
            return "the FleetPolicy is " + ("paused" if policy.paused else "in dry-run")
        candidates = []
        for node, e in entries.items():
            record = self.fleet.records.get(node)
            if record is None:
                continue
            candidates.append(
                mt.Candidate(
                    node,
                    record.pool,
                    e["domain"],
                    record.state,
                    P(e["phase"]),
                    group=record.group,
                    nvlink=str(e["domain"]) if whole else record.nvlink_domain,
                )
            )
        if whole:
            batch = mt.next_domains(
                rollout,
                candidates,
                self._room(),
                now=now,
                sizes=self._domain_sizes(),
                capacity=self._capacity(),
            )
        else:
            batch = mt.next_batch(rollout, candidates, self._room(), now=now)
        if not batch.start:
            return batch.why
        for node in batch.start:
            entries[node].update(phase=P.REQUESTED.value, startedAt=now, message="asked for")
        # Write-ahead: the plan says it started them before they are asked for.
        await self._save_plan_status(name, body, _status(body, rollout, entries, batch.why, now))
        for node in batch.start:
            asked = request(batch.domains.get(node, ""))
            log.info("node=%s maintenance plan %s: %s", node, name, asked.reason)
            await self.feed(node, asked)
            record = self.fleet.records.get(node)
            progress = mt.node_phase(record, name, P.REQUESTED, now)
            entries[node].update(phase=progress.phase.value, message=progress.message[:300])
        return batch.why

    def _room(self) -> mt.Room:
        """What every budget still allows (pools, node groups with a budget, NVLink domains
        with a per-domain budget, the fleet), less the nodes held in ``maintenance`` (not
        counted by the budgets, but out all the same): docs/decisions/0243."""
        policy = self.policies.effective()
        budget = policy.safety.budget
        records = self.fleet.records.values()
        held = [r for r in records if r.state is NodeState.MAINTENANCE]
        in_pool = Counter(r.pool for r in held)
        view = self.fleet.view()
        pools = {
            pool: mt.budget_room(budget, v.size, v.out_of_service, in_pool[pool])
            for pool, v in view.pools.items()
        }
        in_group = Counter(r.group for r in held)
        groups = {
            o.name: mt.budget_room(
                o.budget.over(budget),
                view.group(o.name).size,
                view.group(o.name).out_of_service,
                in_group[o.name],
            )
            for o in policy.overrides
            if o.budget is not None
        }
        domains: dict[str, int] = {}
        if budget.per_domain is not None:
            in_domain = Counter(r.nvlink_domain for r in held)
            limits = policy_groups.domain_limits(
                policy, ((r.nvlink_domain, r.group) for r in records)
            )
            for d, v in view.domains.items():
                k = limits.get(d, budget.per_domain.max_nodes)
                domains[d] = max(0, k - v.out_of_service - in_domain[d])
        out = sum(p.out_of_service for p in view.pools.values())
        fleet = mt.fleet_budget_room(budget, view.size, out, len(held))
        return mt.Room(pools=pools, groups=groups, domains=domains, fleet=fleet)

    def _domain_sizes(self) -> dict[str, int]:
        """Nodes per NVLink domain, every Node the controller sees (not only the selected
        ones: a domain-scope plan empties a domain only when it selected every tray)."""
        return dict(Counter(self._nvlink(n, self.book.labels(n)) for n, _ in self.book.items()))

    def _capacity(self) -> mt.Room:
        """What the pools', the groups' and the fleet's budgets allow with nothing out."""
        policy = self.policies.effective()
        budget = policy.safety.budget
        view = self.fleet.view()
        return mt.Room(
            pools={pool: budget.allowed(v.size) for pool, v in view.pools.items()},
            groups={
                o.name: o.budget.over(budget).allowed(view.group(o.name).size)
                for o in policy.overrides
                if o.budget is not None
            },
            fleet=budget.fleet_allowed(view.size),
        )

    async def _save_plan_status(self, name: str, body: Json, status: Json) -> None:
        """One merge patch of the status, only when it differs from what is stored."""
        if body.get("status") == status:
            return
        try:
            written = await self.client.patch(PLANS, name, {"status": status}, status=True)
        except NotFound:
            self._plans.pop(name, None)
            return
        if name in self._plans:
            self._plans[name] = written
        body["status"] = written.get("status")


def _older(body: Mapping[str, Any], known: Mapping[str, Any] | None) -> bool:
    """Whether ``body`` is an older version than ``known`` (etcd revisions; a version that
    is not a number is never taken for older)."""
    if known is None:
        return False
    a = str((body.get("metadata") or {}).get("resourceVersion", ""))
    b = str((known.get("metadata") or {}).get("resourceVersion", ""))
    return a.isdigit() and b.isdigit() and int(a) < int(b)


# ------------------------------------------------------------------- status


def _conditions(body: Json, now: float, *items: tuple[str, bool, str, str]) -> list[Json]:
    """The plan's conditions with each (type, true?, reason, message) set (api.conditions:
    merged by type, lastTransitionTime kept while the status holds)."""
    out: list[Json] = list((body.get("status") or {}).get("conditions") or [])
    generation = (body.get("metadata") or {}).get("generation")
    for type_, value, reason, message in items:
        out = cr_conditions.set_condition(
            out,
            type_,
            "True" if value else "False",
            reason,
            message,
            now=now,
            observed_generation=generation,
        )
    return out


def _status(
    body: Json, rollout: mt.Rollout, entries: Mapping[str, Json], why: str, now: float
) -> Json:
    phases = Counter(P(e["phase"]) for e in entries.values())
    stage = mt.plan_phase(rollout, phases.elements(), now=now)
    total = sum(phases.values())
    finished = sum(phases[p] for p in mt.FINISHED)
    busy = sum(phases[p] for p in mt.IN_PROGRESS)
    conditions = _conditions(
        body,
        now,
        ("Valid", True, "Valid", "the spec is valid"),
        ("Progressing", stage is mt.PlanPhase.PROGRESSING or busy > 0, stage.value, why),
        (
            "Complete",
            stage is mt.PlanPhase.COMPLETED,
            stage.value,
            f"{phases[P.SUCCEEDED]} succeeded, {phases[P.FAILED]} failed of {total}",
        ),
        (
            "Stopped",
            stage is mt.PlanPhase.STOPPED,
            stage.value,
            f"{phases[P.FAILED]} failed (maxFailures {rollout.max_failures})",
        ),
        *(
            [
                (
                    "Blocked",
                    why.startswith(BLOCKED),
                    "BudgetTooSmall" if why.startswith(BLOCKED) else "NotBlocked",
                    why if why.startswith(BLOCKED) else "every domain fits the budgets",
                )
            ]
            if rollout.scope is mt.Scope.NVLINK_DOMAIN
            else []
        ),
    )
    return {
        "phase": stage.value,
        "message": why,
        "total": total,
        "succeeded": phases[P.SUCCEEDED],
        "failed": phases[P.FAILED],
        "inProgress": busy,
        "pending": phases[P.PENDING],
        "progress": f"{finished}/{total}",
        "nodes": [{k: v for k, v in entries[n].items() if v is not None} for n in sorted(entries)],
        "observedGeneration": (body.get("metadata") or {}).get("generation", 0),
        "conditions": conditions,
    }


def _invalid(body: Json, problem: str, now: float) -> Json:
    status = dict(body.get("status") or {})
    status["message"] = f"invalid spec: {problem}"
    status["conditions"] = _conditions(body, now, ("Valid", False, "Invalid", problem))
    return status
