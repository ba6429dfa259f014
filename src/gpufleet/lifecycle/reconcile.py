"""The node pass: read the Node, ``decide`` each new event, write it all in one guarded patch.

Steps 1 to 3 of the controller's contract (see :mod:`gpufleet.lifecycle.controller`):
the record, state label, cordon, taints and next agent request go to the Node in
*one* merge patch guarded by ``resourceVersion``; a 409 undoes the fleet
reservation, re-reads the Node and decides again. Only after that write does
:meth:`~gpufleet.lifecycle.acting.Acting._after` act.

A healthy node gpufleet has never seen is adopted at once (its record is in the
fleet view, its faults are decided as they come) but written at a bounded pace
(decision 0124): adopting 12,500 nodes must not be 12,500 writes in one burst.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from gpufleet.api import nodedata
from gpufleet.clock import Clock
from gpufleet.domain import events as ev
from gpufleet.domain import policy_groups, well_known
from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.decide import Decision, decide
from gpufleet.domain.operator import Received, answer
from gpufleet.domain.policy import Policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import OUT_OF_SERVICE
from gpufleet.kubeapi import NODES, ApiError, Conflict, KubePort, NotFound
from gpufleet.kubeapi.slots import urgent
from gpufleet.lifecycle import machines, nodes, remediations
from gpufleet.lifecycle.core import ControllerSettings, Json, S, log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.lifecycle.tasks import TaskGroup


class AfterWrite(Protocol):
    """What acts once a decision is stored (:class:`gpufleet.lifecycle.acting.Acting`)."""

    def after(
        self,
        original: Json,
        body: Json,
        before: NodeRecord,
        record: NodeRecord,
        decisions: Sequence[Decision],
        now: float,
    ) -> None: ...


class NodePass:
    """Node events in, decisions recorded on the Node (read, decide, one guarded patch).

    The only writer of a node's lifecycle record: nothing else decides, and
    nothing else writes the record, its state label, gpufleet's cordon and
    taints. What follows a stored decision is the acting side's (``acting``,
    bound once the controller is assembled).
    """

    def __init__(
        self,
        client: KubePort,
        settings: ControllerSettings,
        *,
        book: NodeBook,
        fleet: Fleet,
        policies: PolicyKeeper,
        events: EventSink,
        metrics: Metrics,
        tasks: TaskGroup,
        clock: Clock,
    ) -> None:
        self.client = client
        self.settings = settings
        self.book = book
        self.fleet = fleet
        self.policies = policies
        self.events = events
        self.metrics = metrics
        self.tasks = tasks
        self.clock = clock
        self.acting: AfterWrite | None = None
        self.keys: list[nodedata.SigningKey] = []
        """The key records are signed with (first) and verified by; none loaded: no decision."""
        self._vouched: set[str] = set()
        """Nodes whose record in the fleet view this controller wrote or read signed."""
        self.may_act: Callable[[], bool] = lambda: True
        """Whether this replica decides now (it holds the lease; the controller binds it)."""
        self.deleted: Callable[[str], None] | None = None
        """Told of a deleted Node (the controller forgets its drain and steps)."""
        self._rejoin_checked: dict[str, str] = {}
        """Per Node with a Machine: the Ready transition whose join token was looked at."""
        self.adoption_pending: dict[str, None] = {}
        """Adopted healthy nodes whose first write waits its turn, oldest first."""
        self._adoption_writer: asyncio.Task[None] | None = None
        """The task writing them (None: none pending, it ended)."""
        self._adopting_now: set[str] = set()
        """The node the writer is writing: its first write is not deferred again."""
        self._echoes: dict[str, tuple[str, Policy]] = {}
        """Per Node: the resourceVersion this process's own last record write returned,
        and the policy it was decided under, while the Node as written holds nothing
        ``decide`` has not heard (decision 0252). Its watch event (the echo) is not
        decided again under that same policy; forgotten on any other event of the Node,
        any pass over it and a takeover (:meth:`prime`). A standby decides nothing, so
        what it remembers from before its stand-down changes nothing until it takes over."""

    def _after(
        self,
        original: Json,
        body: Json,
        before: NodeRecord,
        record: NodeRecord,
        decisions: Sequence[Decision],
        now: float,
    ) -> None:
        assert self.acting is not None, "the controller binds the acting side at assembly"
        self.acting.after(original, body, before, record, decisions, now)

    def _lock(self, name: str) -> asyncio.Lock:
        return self.book.lock(name)

    async def prime(self) -> None:
        """Load every Node's record before the first decision (budget needs the whole fleet).

        Also on a takeover (``Controller.activate``), which then decides every held Node:
        no echo of an earlier write is skipped from here on (decision 0252)."""
        self._echoes.clear()
        selector = ",".join(f"{k}={v}" for k, v in sorted(self.settings.node_selector.items()))
        listing = await self.client.list(NODES, label_selector=selector)
        now = self.clock.now()
        policy = self.policies.effective()
        for body in listing.items:
            found = nodes.reading(body, now, self.keys)
            name = nodes.name_of(body)
            group = policy_groups.group_of(policy, nodes.labels_of(body))
            self.fleet.put(replace(found.record, group=group))
            if not found.untrusted:
                self._vouched.add(name)
            self.book.put(name, body)
        self.policies.update_gauges()
        log.info("fleet loaded: %d nodes", len(self.fleet.records))

    async def on_node(self, body: Mapping[str, Any]) -> None:
        """A Node changed (watch event): feed what is new to ``decide``."""
        name = nodes.name_of(body)
        async with self._lock(name):
            if _older(body, self.book.get(name)):
                return  # a watch event from before our own last write
            if self._echo(name, body):
                return  # our own write coming back: decided before it was written
            await self._reconcile(dict(body), extra=())

    def _echo(self, name: str, body: Mapping[str, Any]) -> bool:
        """Whether ``body`` is the Node exactly as this process's own last write left it
        (the resourceVersion that write returned, and the version held since); the echo
        remembered is used up either way."""
        echo = self._echoes.pop(name, None)
        known = self.book.get(name)
        if echo is None or known is None:
            return False
        version, policy = echo
        return (
            _version(body) == version
            and _version(known) == version
            and self.policies.policy is policy  # a new policy (or a pause) decides again
        )

    def on_node_deleted(self, name: str) -> None:
        """A Node is gone: nothing of it is kept here (the controller tells the others)."""
        self.fleet.forget(name)
        self.book.forget(name)
        self._echoes.pop(name, None)
        self._vouched.discard(name)
        self.adoption_pending.pop(name, None)
        if self.deleted is not None:
            self.deleted(name)

    async def feed(self, name: str, event: ev.Event) -> None:
        """Decide an event that did not come from the Node (drain done, step done, tick)."""
        async with self._lock(name):
            body = self.book.get(name)
            if body is None or not isinstance(event, ev.Tick):
                # A result must be decided on the Node as it is now: decided on a stale
                # copy it could be judged "not the step in progress" and lost.
                try:
                    body = await self.client.get(NODES, name)
                except NotFound:
                    return
                except ApiError as exc:
                    log.warning("node=%s %s not decided yet: %s", name, type(event).__name__, exc)
                    if body is None:
                        return
            await self._reconcile(body, extra=(event,))

    async def decide_bound(
        self, name: str, event: ev.Event, bound: Callable[[NodeRecord], bool]
    ) -> NodeRecord | None:
        """Decide ``event`` on the Node as stored now, if its record satisfies ``bound``.

        A step's result is bound to its attempt: read under the node's lock, a record
        that has moved on (a timeout started the next rung) drops it (None). Returns
        the record stored after the decision. Raises the port's errors.
        """
        async with self._lock(name):
            body = await self.client.get(NODES, name)
            record, _ = nodes.record_of(body, self.clock.now())
            if not bound(record):
                return None
            await self._reconcile(body, extra=(event,))
            stored, _ = nodes.record_of(self.book.get(name) or body, self.clock.now())
            return stored

    async def _reconcile(self, body: Json, *, extra: Sequence[ev.Event]) -> None:
        name = nodes.name_of(body)
        for _ in range(self.settings.conflict_retries):
            try:
                await self._process(body, extra)
                return
            except Conflict:
                try:
                    body = await self.client.get(NODES, name)
                except NotFound:
                    self.on_node_deleted(name)
                    return
        log.warning(
            "node=%s gave up after %d conflicting writes", name, self.settings.conflict_retries
        )

    async def _revoke_after_rejoin(self, name: str, body: Json) -> None:
        """A reimaged machine's token, once its Node is Ready again: looked at once per
        Ready transition (one Machine read per rejoin, not one per reconcile)."""
        since = machines.ready_since(body)
        if since is None or self._rejoin_checked.get(name) == since:
            return
        await machines.revoke_rejoined_token(self.client, body)
        self._rejoin_checked[name] = since

    async def _process(self, body: Json, extra: Sequence[ev.Event]) -> None:
        name = nodes.name_of(body)
        self._echoes.pop(name, None)  # set again only by this pass's own successful write
        self.book.put(name, body)
        if not self.keys or not self.may_act():
            return  # a standby, or no key to trust a record with: nothing is decided
        now = self.clock.now()
        found = nodes.reading(body, now, self.keys)
        record, new = found.record, found.new
        forced: tuple[Action, ...] = ()
        if found.untrusted:
            record, forced = self._in_place_of_untrusted(body, found, now)
        obs = nodes.observe(body, record)
        events: list[ev.Event] = [*obs.events, *extra]
        joined: machines.Registration | None = None
        if record.state is S.PROVISIONING and nodes.is_ready(body):
            joined = await machines.registration(self.client, body, now)  # waits for the agent
            if joined is not None:
                events.append(joined.event)
        elif machines.machine_of(body) is not None:
            await self._revoke_after_rejoin(name, body)
        fleet_policy = self.policies.effective()
        decided_under = self.policies.policy
        labels = nodes.labels_of(body)
        resolved = policy_groups.policy_for(fleet_policy, labels)
        domain = policy_groups.domain_of(fleet_policy, name, labels)
        if record.group != resolved.group or record.nvlink_domain != domain:
            record = replace(record, group=resolved.group, nvlink_domain=domain)
        before = record
        decisions: list[Decision] = []
        policy = resolved.policy
        async with self.fleet.lock:
            self.fleet.regroup(fleet_policy, self._group_of)
            previous = self.fleet.records.get(name)
            for event in events:
                d = decide(record, self.fleet.view(), event, policy, now)
                self.fleet.apply(d, now, policy)
                decisions.append(d)
                record = d.record
            if not decisions:
                self.fleet.put(record)
            frees = _frees_a_slot(previous, record)
            if frees:
                assert previous is not None
                # Taking a slot is counted before its write (a reservation); freeing one
                # only once its write has landed: counted free earlier, another node took
                # it while this write could still fail or wait, and the budget was exceeded.
                self.fleet.put(previous)
        if (
            new
            and not forced
            and not decisions
            and joined is None
            and self._defer_adoption(name, record)
        ):
            await self._freed(record, frees)
            self._after(body, body, before, record, decisions, now)
            return
        actions = (*forced, *(a for d in decisions for a in d.actions))
        try:
            await self._notices_first(body, actions)
        except ApiError:
            async with self.fleet.lock:  # not decided yet: the next event or tick decides again
                if previous is not None:
                    self.fleet.put(previous)
            raise
        patch = nodes.node_patch(body, record, actions, key=self.keys[0], seen=obs.seen)
        if joined is not None:
            patch["metadata"]["annotations"].update(joined.annotations)
        if record.incident is not None:
            patch["metadata"]["annotations"][well_known.ANNOTATION_REMEDIATION] = (
                remediations.name_for(name, record.incident)
            )
        if obs.request is not None:  # removed in the write that stores its decision: once only
            patch["metadata"]["annotations"][well_known.ANNOTATION_OPERATOR_REQUEST] = None
        if not new and not forced and nodes.apply_merge_patch(body, patch) == body:
            await self._freed(record, frees)
            self._after(body, body, before, record, decisions, now)
            return
        log.debug(
            "node=%s write rv=%s state=%s pending=%s new=%s events=%s",
            name,
            patch["metadata"].get("resourceVersion"),
            record.state,
            record.pending is not None,
            new,
            [type(e).__name__ for e in events],
        )
        try:
            with urgent() if _isolates(patch) else contextlib.nullcontext():
                written = await self.client.patch(NODES, name, patch)
        except Conflict:
            async with self.fleet.lock:  # undo the reservation; decide again on fresh data
                if previous is not None:
                    self.fleet.put(previous)
            raise
        except NotFound:
            self.on_node_deleted(name)
            return
        # Any other failure keeps the reservation: a write that timed out may have landed,
        # so the slot stays counted taken until the retry (the handler's, on this
        # exception) reads the Node and decides again. Counting a node out that is not is
        # the safe error; the reverse could exceed the budget.
        await self._freed(record, frees)
        self.book.put(name, written)
        self._remember_echo(name, written, record, decided_under)
        self._vouched.add(name)
        if obs.request is not None:
            self._answer_operator(written, obs.request, before, events, decisions)
        self._after(body, written, before, record, decisions, now)

    def _remember_echo(self, name: str, written: Json, record: NodeRecord, policy: Policy) -> None:
        """Remember the version ``written`` has, if deciding it again could change
        nothing: it holds no event ``decide`` has not heard (its faults are under the
        watermark just written, no answer or request waits) and no registration waits
        for a Ready provisioning Node (decision 0252)."""
        version = _version(written)
        if not version or nodes.observe(written, record).events:
            return
        if record.state is S.PROVISIONING and nodes.is_ready(written):
            return
        self._echoes[name] = (version, policy)

    async def regroup(self) -> None:
        """Every record's node group and NVLink domain under the policy in use (after a
        FleetPolicy change): the group and domain budgets and ``status.groupBudget`` count
        every node at once, not each node only when it is next read."""
        async with self.fleet.lock:
            self.fleet.regroup(self.policies.effective(), self._group_of)
        self.policies.update_gauges()

    def _group_of(self, name: str, policy: Policy) -> tuple[str, str] | None:
        """A node's group and NVLink domain under ``policy``, from its Node as last seen
        (None: not seen)."""
        body = self.book.get(name)
        if body is None:
            return None
        labels = nodes.labels_of(body)
        return policy_groups.group_of(policy, labels), policy_groups.domain_of(policy, name, labels)

    async def _notices_first(self, body: Json, actions: Sequence[Action]) -> None:
        """Post the decision's Notices before the write that drops what they tell of:
        killed between the two, the fault would be gone with nothing said."""
        for a in actions:
            if a.kind is ActionKind.NOTIFY:
                await self.events.node_first(body, "Warning", "Notice", a.detail)

    async def _freed(self, record: NodeRecord, frees: bool) -> None:
        """The decision that frees a budget slot is on the Node now: count it free."""
        if frees:
            async with self.fleet.lock:
                self.fleet.put(record)

    def _in_place_of_untrusted(
        self, body: Json, found: nodes.Reading, now: float
    ) -> tuple[NodeRecord, tuple[Action, ...]]:
        """The record to decide on and write when the Node's cannot be trusted
        (docs/decisions/0144): the controller's own, if it holds one it wrote or read
        signed, written back; else a new one in ``triage`` with a cordon, held for a
        person. Nothing disruptive either way, and an Event says which and why."""
        name = nodes.name_of(body)
        known = self.fleet.records.get(name) if name in self._vouched else None
        if known is not None:
            log.warning(
                "node=%s record not trusted (%s): the controller's own restored",
                name,
                found.problem,
            )
            self.events.node(
                body,
                "Warning",
                "RecordRestored",
                f"the record on the Node was not written by the controller ({found.problem});"
                f" its own ({known.state}) is written back",
            )
            return known, ()
        reason = (
            f"record on the Node not trusted ({found.problem}): held for a person;"
            " `gpufleet node return` verifies and returns it"
        )
        log.error("node=%s %s", name, reason)
        self.events.node(body, "Warning", "RecordUntrusted", reason)
        held = NodeRecord.new(name, at=now, pool=nodes.pool_of(body), state=S.TRIAGE, reason=reason)
        return held, (Action(ActionKind.CORDON, detail=reason),)

    def _defer_adoption(self, name: str, record: NodeRecord) -> bool:
        """Whether this first write waits its turn: a healthy node with nothing to decide.

        Its record is already in the fleet view (budget, spares, breaker count it) and a
        fault on it is decided and written at once; only the label and record that say
        "adopted" wait. A node the provisioning service labelled, one with a fault and
        one the writer is writing now are written as before.
        """
        if (
            self.settings.adoption_writes_per_s <= 0
            or record.state is not S.PRODUCTION
            or name in self._adopting_now
        ):
            return False
        self.adoption_pending[name] = None
        self.metrics.adoption_pending.set(len(self.adoption_pending))
        if self._adoption_writer is None:
            self._adoption_writer = self.tasks.spawn(self._write_adoptions(), "adoption writes")
        return True

    async def _write_adoptions(self) -> None:
        """Write the adopted nodes, oldest first, at ``adoption_writes_per_s``; ends when
        none is left (the next adoption starts it again). A node written meanwhile (a
        fault came) or deleted is skipped; a failed write is logged, and the node's next
        event adopts it again."""
        pause = 1.0 / self.settings.adoption_writes_per_s
        loop = asyncio.get_running_loop()
        due = loop.time()
        while self.adoption_pending:
            name = next(iter(self.adoption_pending))
            del self.adoption_pending[name]
            body = self.book.get(name)
            if body is not None and nodes.record_of(body, self.clock.now())[1]:
                self._adopting_now.add(name)
                try:
                    async with self._lock(name):
                        await self._reconcile(self.book.get(name) or body, extra=())
                except ApiError as exc:
                    log.warning("node=%s adoption not written: %s", name, exc)
                finally:
                    self._adopting_now.discard(name)
            self.metrics.adoption_pending.set(len(self.adoption_pending))
            # Paced by a schedule, so the time a write takes is not added to the pause
            # (a slow apiserver lowers the pace; a fast one never raises it above the rate).
            due = max(due + pause, loop.time() - pause)
            await asyncio.sleep(max(0.0, due - loop.time()))
        self._adoption_writer = None

    def _answer_operator(
        self,
        body: Json,
        received: Received,
        first: NodeRecord,
        events: Sequence[ev.Event],
        decisions: Sequence[Decision],
    ) -> None:
        """The audit trail of a person's request: one Node Event, accepted or refused and why."""
        before, decision = first, None
        for event, d in zip(events, decisions, strict=False):
            if event is received.event:
                decision = d
                break
            before = d.record
        accepted, message = answer(
            received,
            before,
            held=str(decision.hold) if decision is not None and decision.hold else None,
            transition=decision.transition if decision is not None else None,
            reasons=decision.reasons if decision is not None else (),
        )
        log.info("node=%s operator request %s", nodes.name_of(body), message)
        self.metrics.actions.labels(
            action="operator-request", result="ok" if accepted else "refused"
        ).inc()
        self.events.node(body, "Normal" if accepted else "Warning", "OperatorRequest", message)


def _version(body: Mapping[str, Any]) -> str:
    return str(body.get("metadata", {}).get("resourceVersion", ""))


def _older(body: Mapping[str, Any], known: Mapping[str, Any] | None) -> bool:
    """Whether ``body`` is an older version of the Node than ``known``.

    resourceVersions are opaque by contract, but every apiserver backed by etcd
    uses the etcd revision; if either is not a number, nothing is skipped.
    """
    if known is None:
        return False
    a, b = _version(body), _version(known)
    return a.isdigit() and b.isdigit() and int(a) < int(b)


def _isolates(patch: Mapping[str, Any]) -> bool:
    """Whether the write cordons the node: it goes before the work that follows earlier
    decisions (drains, steps, Events), which waits while one does (decision 0292)."""
    return bool((patch.get("spec") or {}).get("unschedulable"))


def _frees_a_slot(previous: NodeRecord | None, record: NodeRecord) -> bool:
    """Whether the decision takes the node out of the disruption budget's count."""
    return (
        previous is not None
        and previous.state in OUT_OF_SERVICE
        and record.state not in OUT_OF_SERVICE
    )
