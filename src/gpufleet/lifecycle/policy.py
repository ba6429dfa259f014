"""The FleetPolicy: validated before use, its status saved, the operator's breaker reset.

Until a valid FleetPolicy is seen the controller obeys a paused default (fail
closed). The status (breaker, recent actions, budget use per pool) is what
``kubectl`` and ``gpufleet status`` show and what a restarted controller restores
the breaker from; saves are coalesced so a burst of decisions writes it once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from gpufleet.api import conditions
from gpufleet.api.conditions import Status
from gpufleet.clock import Clock
from gpufleet.domain import policy_groups, well_known
from gpufleet.domain.policy import Policy, PolicyError, default_policy, load_policy
from gpufleet.domain.safety import BreakerState, breaker_reset, breaker_reset_refusal
from gpufleet.kubeapi import ApiError, KubePort, NotFound, custom
from gpufleet.lifecycle import crds
from gpufleet.lifecycle.core import ControllerSettings, Json, log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.tasks import TaskGroup

_POLICIES = custom(crds.FLEET_POLICY_PLURAL)


DEPRECATED = "Deprecated"
"""The FleetPolicy condition that says its spec uses fields an earlier version had."""


def _paused_default() -> Policy:
    return default_policy().model_copy(update={"paused": True})


class HoldNotices:
    """Per node, the last hold announced by an ``ActionWithheld`` Event.

    A hold retried every tick is announced once, not 30 times a minute (the
    acting side writes it); the FleetPolicy status counts the waiting nodes
    per rail from it (the policy keeper reads it).
    """

    def __init__(self) -> None:
        self._said: dict[str, str] = {}

    def said(self, name: str) -> str | None:
        return self._said.get(name)

    def say(self, name: str, text: str) -> None:
        self._said[name] = text

    def clear(self, name: str) -> None:
        self._said.pop(name, None)

    def rail_of(self, name: str) -> str:
        """The rail that holds the node, as last announced ("to be decided again" if none)."""
        return self._said.get(name, "to be decided again").split(":", 1)[0]


class PolicyKeeper:
    """Uses the FleetPolicy and keeps its status (and the fleet gauges) current.

    It owns the policy in force (a paused default until a valid FleetPolicy is
    seen: fail closed) and the status it writes; the fleet's breaker and
    recent actions are restored from that status.
    """

    def __init__(
        self,
        client: KubePort,
        settings: ControllerSettings,
        *,
        fleet: Fleet,
        metrics: Metrics,
        events: EventSink,
        tasks: TaskGroup,
        holds: HoldNotices,
        clock: Clock,
    ) -> None:
        self.client = client
        self.settings = settings
        self.fleet = fleet
        self.metrics = metrics
        self.events = events
        self.tasks = tasks
        self.holds = holds
        self.clock = clock
        self.policy: Policy = _paused_default()
        self.policy_seen = False
        self._policy_generation: tuple[Any, Any] = (None, None)
        self._saved_budget: dict[str, Any] | None = None
        self._saved_groups: dict[str, Any] | None = None
        """The groups' part of the last status saved (``groupBudget``)."""
        self._saved_domains: dict[str, Any] | None = None
        """The NVLink domains at their budget in the last status saved (``domainBudget``)."""
        """The budget part of the last FleetPolicy status saved (saved again when it changes)."""
        self._policy_conditions: list[dict[str, Any]] | None = None
        """The FleetPolicy's status conditions as last written (None: not read yet)."""
        self._breaker_reset_done: tuple[str, float] | None = None
        """(id, at) of the last breaker reset answered: a watch event that still shows it
        (before its removal lands) is not answered twice."""
        self._status_saver: asyncio.Task[None] | None = None
        self.may_act: Callable[[], bool] = lambda: True
        """Whether this replica acts (a standby writes no status and answers no request)."""
        self.domain_faults: Callable[[], dict[str, Any]] = dict
        """The NVLink domains faulty or held (``status.domainFaults``; the controller binds
        :meth:`gpufleet.lifecycle.domain_watch.DomainWatch.status`)."""
        self._saved_domain_faults: dict[str, Any] | None = None

    def reference(self) -> dict[str, Any]:
        """The FleetPolicy in force as an Event's object (its name and uid)."""
        return {"metadata": {"name": self.settings.policy_name, "uid": self._policy_generation[0]}}

    def effective(self) -> Policy:
        """The policy in force, with the process's own ``--dry-run`` on top."""
        if self.settings.dry_run and not self.policy.dry_run:
            return self.policy.model_copy(update={"dry_run": True})
        return self.policy

    def on_deleted(self) -> None:
        """The FleetPolicy was deleted: pause (fail closed) until one is seen again."""
        log.warning("policy=%s deleted: pausing (fail closed)", self.settings.policy_name)
        self.policy = self.policy.model_copy(update={"paused": True})
        self.tasks.stop_acting("the FleetPolicy was deleted")

    async def reload(self) -> None:
        """Read the FleetPolicy afresh (a replica that starts acting): its spec, and the
        breaker and recent actions from its status, never this process's older copy."""
        try:
            body = await self.client.get(_POLICIES, self.settings.policy_name)
        except NotFound:
            self.on_deleted()
            return
        except ApiError as exc:
            log.warning("policy=%s not read afresh: %s", self.settings.policy_name, exc)
            return
        status = body.get("status") or {}
        self._restore_breaker(status)
        self._policy_conditions = list(status.get("conditions") or [])
        self._policy_generation = (None, None)  # validated again, whatever was seen
        await self.on_policy(body)

    def use(self, policy: Policy) -> None:
        """Use ``policy`` as if a valid FleetPolicy had been seen (tests, local tools)."""
        self.policy = policy
        self.policy_seen = True

    async def on_policy(self, body: Mapping[str, Any]) -> None:
        """A FleetPolicy changed: validate it, use it if valid, report in its status."""
        if body.get("metadata", {}).get("name") != self.settings.policy_name:
            return
        generation = body.get("metadata", {}).get("generation")
        uid = body.get("metadata", {}).get("uid")
        # A status or metadata change (our own writes among them) leaves the generation
        # alone: only a spec change is validated again. An operator's breaker reset
        # is an annotation, so it is looked at on every change.
        if (uid, generation) != self._policy_generation:
            self._policy_generation = (uid, generation)
            await self._use_policy(body, generation)
        await self._breaker_reset_request(body)

    async def _use_policy(self, body: Mapping[str, Any], generation: Any) -> None:
        """Validate a new generation of the FleetPolicy; use it if valid; say so in its status."""
        spec = body.get("spec") or {}
        if not self.policy_seen:
            self._restore_breaker(body.get("status") or {})
        if self._policy_conditions is None:
            self._policy_conditions = list((body.get("status") or {}).get("conditions") or [])
        try:
            policy = load_policy(
                yaml.safe_dump(dict(spec)), f"FleetPolicy {self.settings.policy_name}"
            )
        except PolicyError as exc:
            problems = "; ".join(str(i) for i in exc.issues)
            log.error(
                "policy=%s invalid, keeping the last valid one: %s",
                self.settings.policy_name,
                problems,
            )
            self.metrics.policy_valid.set(0)
            valid: tuple[Status, str, str] = (
                "False",
                "Invalid",
                f"kept the last valid policy: {problems}",
            )
        else:
            changed = policy != self.policy or not self.policy_seen
            was_acting = not (self.policy.paused or self.policy.dry_run) and self.policy_seen
            self.policy = policy
            if was_acting and (policy.paused or policy.dry_run):
                self.tasks.stop_acting(
                    "the policy is " + ("paused" if policy.paused else "dry-run")
                )
            self.policy_seen = True
            self.metrics.policy_valid.set(1)
            if changed:
                log.info(
                    "policy=%s in use (paused=%s dryRun=%s)",
                    self.settings.policy_name,
                    policy.paused,
                    policy.dry_run,
                )
            valid = ("True", "Valid", "the policy is in use")
            self._say_deprecations(body, policy, generation)
        status: Json = {
            "conditions": self._set_policy_condition("Valid", *valid, generation=generation),
            "observedGeneration": generation,
        }
        with contextlib.suppress(ApiError):
            await self.client.patch(
                _POLICIES, self.settings.policy_name, {"status": status}, status=True
            )
        self.update_gauges()  # a new budget configuration changes what the status shows

    async def _breaker_reset_request(self, body: Mapping[str, Any]) -> None:
        """``gpufleet breaker reset``: close the breaker, save, say so, remove the request.

        Nothing happens until a valid policy is in use (the breaker's state is
        restored with it): the request then waits on the FleetPolicy.
        """
        meta = body.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(well_known.ANNOTATION_BREAKER_RESET)
        if text is None or not self.policy_seen or not self.may_act():
            return
        name = self.settings.policy_name
        request = _breaker_request(str(text))
        if isinstance(request, str):
            ok, message = False, f"refused: {request}"
        else:
            at, by, reason, rid = request
            if (rid, at) == self._breaker_reset_done:
                return  # already answered; the annotation's removal is on its way
            b = self.fleet.breaker
            why = breaker_reset_refusal(b, requested_at=at)
            if why is not None:
                ok, message = False, f"[{rid}] reset by {by}: refused: {why}"
            else:
                was = "open" if b.is_open else "closed"
                self.fleet.breaker = breaker_reset(b)
                self.fleet.dirty_breaker = True
                ok = True
                message = (
                    f"[{rid}] reset by {by}: accepted: the breaker was {was} "
                    f"({b.faulting_nodes()} faulting nodes in the window), now closed: {reason}"
                )
                await self.save_fleet_status()  # at once: status is what operators read
                self.update_gauges()
            self._breaker_reset_done = (rid, at)
        log.info("policy=%s breaker %s", name, message)
        self.events.policy(body, "Normal" if ok else "Warning", "BreakerReset", message)
        try:
            await self.client.patch(
                _POLICIES,
                name,
                {"metadata": {"annotations": {well_known.ANNOTATION_BREAKER_RESET: None}}},
            )
        except ApiError as exc:
            log.warning("policy=%s breaker reset request not removed: %s", name, exc)

    def _say_deprecations(self, body: Mapping[str, Any], policy: Policy, generation: Any) -> None:
        """Fields of an earlier version in the spec: a Warning Event (once per generation,
        which is when this runs) and the condition ``Deprecated``, which names each field
        and its replacement until the spec no longer has them (domain.policy_compat)."""
        name = self.settings.policy_name
        had = any(c.get("type") == DEPRECATED for c in self._policy_conditions or [])
        if not policy.deprecations:
            if had:
                self._set_policy_condition(
                    DEPRECATED, "False", "CurrentFields", "no removed field",
                    generation=generation,
                )  # fmt: skip
            return
        text = "; ".join(d.message() for d in policy.deprecations)
        log.warning("policy=%s written with removed fields: %s", name, text)
        self.events.policy(body, "Warning", "DeprecatedFields", text)
        self._set_policy_condition(
            DEPRECATED, "True", "RemovedFields", text, generation=generation
        )  # fmt: skip

    def _set_policy_condition(
        self, type_: str, status: Status, reason: str, message: str, *, generation: Any
    ) -> list[dict[str, Any]]:
        """Every condition of the FleetPolicy with ``type_`` set (metav1 semantics).

        A merge patch replaces the list whole, so each save sends all of them: the
        ``Valid`` condition survives a breaker save and the other way round. The list
        is this process's (the controller is the only writer), seeded from the object.
        """
        self._policy_conditions = conditions.set_condition(
            self._policy_conditions,
            type_,
            status,
            reason,
            message,
            now=self.clock.now(),
            observed_generation=generation if isinstance(generation, int) else None,
        )
        return self._policy_conditions

    def _restore_breaker(self, status: Mapping[str, Any]) -> None:
        b = status.get("breaker") or {}
        recent = tuple(
            (float(x["at"]), str(x["node"]))
            for x in b.get("recent") or []
            if "at" in x and "node" in x
        )
        self.fleet.breaker = BreakerState(
            recent=recent, tripped_at=b.get("trippedAt"), last_fault_at=b.get("lastFaultAt")
        )
        self.fleet.recent_actions = tuple(float(t) for t in status.get("recentActions") or [])

    _saved_fleet: dict[str, int | None] | None = None
    """The fleet-wide part of the last status saved (``fleetBudget``; saved again when it
    changes, e.g. a new ``fleetMaxNodes`` with every pool as it was)."""

    async def save_fleet_status(self) -> None:
        """Persist the breaker, recent actions and budget use in the FleetPolicy status."""
        if not self.policy_seen or not self.may_act():
            return
        fleet = self.fleet
        fleet.dirty_breaker = False
        b = fleet.breaker
        waiting, why = self._waiting()
        budget = self._budget_use(waiting)
        groups = self._group_use()
        domains = self._domain_use()
        faulty = self.domain_faults()
        self._set_policy_condition(
            "BreakerOpen",
            "True" if b.is_open else "False",
            "Tripped" if b.is_open else "Closed",
            f"{b.faulting_nodes()} nodes faulted within the window",
            generation=self._policy_generation[1],
        )
        status: Json = {
            "breaker": {
                "open": b.is_open,
                "trippedAt": b.tripped_at,
                "lastFaultAt": b.last_fault_at,
                "faultingNodes": b.faulting_nodes(),
                "recent": [{"at": t, "node": n} for t, n in b.recent],
            },
            "recentActions": list(fleet.recent_actions),
            # A merge patch keeps keys it does not name: a pool that is gone is removed.
            "budget": {**{p: None for p in self._saved_budget or {} if p not in budget}, **budget},
            "fleetBudget": self._fleet_use(budget),
            "groupBudget": {
                **{g: None for g in self._saved_groups or {} if g not in groups},
                **groups,
            },
            "domainBudget": {
                **{d: None for d in self._saved_domains or {} if d not in domains},
                **domains,
            },
            "domainFaults": {
                **{d: None for d in self._saved_domain_faults or {} if d not in faulty},
                **faulty,
            },
            # Every condition at once (a merge patch replaces the list whole).
            "conditions": self._set_policy_condition(
                "FaultsWaiting",
                *_waiting_condition(sum(waiting.values()), why),
                generation=self._policy_generation[1],
            ),
        }
        try:
            await self.client.patch(
                _POLICIES, self.settings.policy_name, {"status": status}, status=True
            )
        except ApiError as exc:
            fleet.dirty_breaker = True
            log.warning("policy=%s status not saved: %s", self.settings.policy_name, exc)
        else:
            self._saved_budget = budget
            self._saved_fleet = status["fleetBudget"]
            self._saved_groups = groups
            self._saved_domains = domains
            self._saved_domain_faults = faulty

    def update_gauges(self) -> None:
        """Metrics from the fleet view; and a status save when the budget use changed.

        The FleetPolicy status is what ``kubectl`` and ``gpufleet status`` show, so
        it follows the budget (nodes out per pool), not only the breaker.
        """
        m = self.metrics
        m.set_states(self.fleet.states())
        b = self.fleet.breaker
        m.breaker_open.set(1 if b.is_open else 0)
        m.breaker_nodes.set(b.faulting_nodes())
        budget = self._budget_use(self._waiting()[0])
        for pool, use in budget.items():
            m.budget_out.labels(pool=pool).set(use["outOfService"])
            m.budget_allowed.labels(pool=pool).set(use["allowed"])
            m.faults_waiting.labels(pool=pool).set(use["waiting"])
        if self.policy_seen and (
            budget,
            self._fleet_use(budget),
            self._group_use(),
            self._domain_use(),
            self.domain_faults(),
        ) != (
            self._saved_budget,
            self._saved_fleet,
            self._saved_groups,
            self._saved_domains,
            self._saved_domain_faults or {},
        ):
            self.fleet.dirty_breaker = True  # "dirty status": saved by the coalescing saver
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # called outside the event loop: the next pass saves it
                return
            self.schedule_status_save()

    def _budget_use(self, waiting: Counter[str]) -> dict[str, dict[str, int]]:
        """Per pool: its size, the nodes automation holds out, how many it may, and how
        many nodes wait with a fault the rails withheld (``waiting``, per pool, from
        :meth:`_waiting`): the status's ``budget``."""
        return {
            pool: {
                "size": p.size,
                "outOfService": p.out_of_service,
                "allowed": self.policy.safety.budget.allowed(p.size),
                "waiting": waiting.get(pool, 0),
            }
            for pool, p in self.fleet.view().pools.items()
        }

    def _fleet_use(self, budget: Mapping[str, Mapping[str, int]]) -> dict[str, int | None]:
        """The whole fleet, from the pools' use (:meth:`_budget_use`): size, nodes out, how
        many the policy's fleet-wide budget allows (None: it sets none), nodes waiting:
        the status's ``fleetBudget``."""
        size = sum(use["size"] for use in budget.values())
        return {
            "size": size,
            "outOfService": sum(use["outOfService"] for use in budget.values()),
            "allowed": self.policy.safety.budget.fleet_allowed(size),
            "waiting": sum(use["waiting"] for use in budget.values()),
        }

    def _group_use(self) -> dict[str, dict[str, int]]:
        """Per node group with a budget of its own: its size, nodes out, how many its
        budget allows and nodes waiting with a withheld fault: the status's
        ``groupBudget`` (docs/decisions/0225)."""
        view = self.fleet.view()
        waiting: Counter[str] = Counter(
            record.group for _name, record in self.fleet.ticking() if record.pending is not None
        )
        return {
            o.name: {
                "size": view.group(o.name).size,
                "outOfService": view.group(o.name).out_of_service,
                "allowed": o.budget.over(self.policy.safety.budget).allowed(
                    view.group(o.name).size
                ),
                "waiting": waiting.get(o.name, 0),
            }
            for o in self.policy.overrides
            if o.budget is not None
        }

    def _domain_use(self) -> dict[str, dict[str, int]]:
        """The NVLink domains at their budget (safety.budget.perDomain): size, nodes out,
        allowed, nodes waiting: the status's ``domainBudget`` (docs/decisions/0232). Only
        those at the limit, so a fleet of hundreds of domains at rest writes none; read
        from the view's per-domain counts, not from the records."""
        per_domain = self.policy.safety.budget.per_domain
        if per_domain is None:
            return {}
        limits = policy_groups.domain_limits(
            self.policy, ((r.nvlink_domain, r.group) for r in self.fleet.records.values())
        )
        full = {
            d: v
            for d, v in self.fleet.view().domains.items()
            if v.out_of_service >= limits.get(d, per_domain.max_nodes)
        }
        if not full:
            return {}
        waiting: Counter[str] = Counter(
            record.nvlink_domain
            for _name, record in self.fleet.ticking()
            if record.pending is not None and record.nvlink_domain in full
        )
        return {
            d: {
                "size": v.size,
                "outOfService": v.out_of_service,
                "allowed": limits.get(d, per_domain.max_nodes),
                "waiting": waiting.get(d, 0),
            }
            for d, v in sorted(full.items())
        }

    def _waiting(self) -> tuple[Counter[str], Counter[str]]:
        """Nodes holding a fault a safety rail withheld (kept, retried every tick: never
        dropped), counted per pool and per rail. Read from the tick's index, which holds
        every such node, so this costs what the busy nodes cost, not the fleet."""
        by_pool: Counter[str] = Counter()
        by_rail: Counter[str] = Counter()
        for name, record in self.fleet.ticking():
            if record.pending is None:
                continue
            by_pool[record.pool] += 1
            by_rail[self.holds.rail_of(name)] += 1
        return by_pool, by_rail

    def schedule_status_save(self) -> None:
        """Save the fleet status soon, coalescing bursts: one write in flight at most."""
        if self._status_saver is None or self._status_saver.done():
            self._status_saver = self.tasks.spawn(self._save_soon(), "fleet status")

    async def _save_soon(self) -> None:
        await asyncio.sleep(self.settings.status_save_delay_s)
        while self.fleet.dirty_breaker:
            await self.save_fleet_status()
            if self.fleet.dirty_breaker:
                await asyncio.sleep(self.settings.status_save_delay_s)


def _waiting_condition(waiting: int, why: Counter[str]) -> tuple[Status, str, str]:
    """The ``FaultsWaiting`` condition: whether nodes wait for the rails, and which."""
    if not waiting:
        return "False", "NoneWaiting", "no node waits with a withheld fault"
    rails = ", ".join(f"{rail} {n}" for rail, n in sorted(why.items()))
    return (
        "True",
        "RailsHold",
        f"{waiting} node(s) wait with a fault the safety rails withheld ({rails}); each is"
        " acted on as soon as the rails allow (its ActionWithheld Event says what waits)",
    )


def _breaker_request(text: str) -> tuple[float, str, str, str] | str:
    """``(at, by, reason, id)`` of a breaker-reset annotation, or why it is unreadable."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return f"{well_known.ANNOTATION_BREAKER_RESET} is not JSON"
    if not isinstance(data, dict):
        return f"{well_known.ANNOTATION_BREAKER_RESET} is not a JSON object"
    at, by, reason = data.get("at"), data.get("by"), data.get("reason")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "a breaker reset needs a time (at)"
    if not (isinstance(by, str) and by.strip() and isinstance(reason, str) and reason.strip()):
        return "a breaker reset needs a user (by) and a reason"
    return float(at), by.strip()[:200], reason.strip()[:500], str(data.get("id") or "-")[:64]
