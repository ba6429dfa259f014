"""One DeviceTaintRule per quarantined GPU, kept in step with the records (decision 0239).

The decision to quarantine a GPU is the node pass's (``NodeRecord.quarantined_gpus``,
written in the signed record); this collaborator only mirrors it into Kubernetes DRA:
for every quarantined GPU exactly one rule, effect NoExecute, selecting that node's
device of gpufleet's driver (``domain.dra``), and none once the quarantine is released.
kube-controller-manager's device taint eviction controller then evicts the pods whose
claims hold the GPU, and the scheduler allocates it to no new claim; pods on the node's
other GPUs keep running.

Safety, as everywhere in the controller:

- **Own what you touch.** Only rules labelled ``app.kubernetes.io/managed-by=gpufleet``
  are listed, changed or deleted (:func:`gpufleet.api.dra.read_rule`).
- **Pause and dry-run.** A paused policy (or none read yet) changes nothing; dry-run
  says what it would do (log and Event) and changes nothing.
- **Fail closed.** Nothing is done before the rules were listed; a failed write is
  tried again on the next pass and the pass is not counted as done.

It runs on the controller's tick, when a record changed (``Fleet.generation``) or
``resync_s`` passed (a rule someone deleted is put back), and only while this replica
acts (the tick's own check).
"""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.api import dra as dra_codec
from gpufleet.clock import Clock
from gpufleet.domain import dra
from gpufleet.domain.policy import Policy
from gpufleet.kubeapi import ApiError, KubePort
from gpufleet.kubeapi.errors import Conflict, NotFound
from gpufleet.kubeapi.resources import DEVICE_TAINT_RULES
from gpufleet.lifecycle.core import Json, log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.nodebook import NodeBook

RESYNC_S = 30.0
"""A pass with no record changed still lists the rules this often (a deleted rule is
put back within it)."""


class DeviceTaints:
    """Keeps gpufleet's DeviceTaintRules equal to the records' quarantined GPUs."""

    def __init__(
        self,
        client: KubePort,
        *,
        fleet: Fleet,
        book: NodeBook,
        policy: Callable[[], Policy],
        events: EventSink,
        clock: Clock,
        may_act: Callable[[], bool] = lambda: True,
        resync_s: float = RESYNC_S,
    ) -> None:
        """``may_act``: whether this replica still holds the lease, asked before each
        write (a replica that lost it while a pass ran writes nothing more)."""
        self._client = client
        self._fleet = fleet
        self._book = book
        self._policy = policy
        self._events = events
        self._clock = clock
        self._resync_s = resync_s
        self._may_act = may_act
        self._done: tuple[int, float] | None = None
        """(fleet generation, time) of the last pass that left nothing to do."""
        self._said: set[tuple[str, str]] = set()
        """What dry-run already reported ((verb, rule name)): said once, not every pass."""
        self._list_error: str | None = None
        """The last error listing the rules (a cluster that does not serve them: logged once)."""
        self._held: str | None = None
        """Why the last pass changed nothing (paused), logged once per change."""

    async def sync(self) -> None:
        """One pass: list gpufleet's rules, create, replace and delete what differs."""
        policy = self._policy()
        if policy.paused:
            self._hold("the policy is paused (or not read yet): no DeviceTaintRule is changed")
            return
        self._hold(None)
        generation, now = self._fleet.generation, self._clock.monotonic()
        done = self._done
        if done is not None and done[0] == generation and now - done[1] < self._resync_s:
            return
        want = dra.wanted(self._fleet.records.values())
        try:
            listed = await self._client.list(
                DEVICE_TAINT_RULES, label_selector=dra_codec.RULE_SELECTOR
            )
        except ApiError as exc:  # fail closed: nothing without the rules there are
            if str(exc) != self._list_error:  # once per error, not on every tick
                log.warning("DeviceTaintRules not listed, none changed: %s", exc)
            self._list_error = str(exc)
            return
        self._list_error = None
        have: dict[str, dra.TaintRule] = {}
        for body in listed.items:
            rule = dra_codec.read_rule(body)
            if rule is not None:
                have[str(body["metadata"]["name"])] = rule
        todo = dra.plan(want, have)
        if policy.dry_run:
            self._dry_run(todo, have)
            self._done = (generation, now)
            return
        self._said.clear()
        if await self._apply(todo, have):
            self._done = (generation, now)

    def _hold(self, why: str | None) -> None:
        if why is not None and why != self._held:
            log.info("%s", why)
        self._held = why

    async def _apply(self, todo: dra.RulePlan, have: dict[str, dra.TaintRule]) -> bool:
        """Carry out the plan; False when a write failed (the next tick tries again)."""
        ok = True
        for rule in todo.create:
            ok = self._may_act() and await self._write(rule, create=True) and ok
        for rule in todo.replace:
            ok = self._may_act() and await self._write(rule, create=False) and ok
        for name in todo.delete:
            ok = self._may_act() and await self._delete(name, have[name]) and ok
        return ok

    async def _write(self, rule: dra.TaintRule, *, create: bool) -> bool:
        body = dra_codec.taint_rule(rule, node_uid=self._node_uid(rule.node))
        try:
            if create:
                await self._client.create(DEVICE_TAINT_RULES, body)
            else:  # someone changed gpufleet's rule: put back what the record says
                await self._client.patch(
                    DEVICE_TAINT_RULES,
                    rule.name,
                    {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]},
                )
        except Conflict:  # created meanwhile (another pass): the next pass reads it
            return False
        except ApiError as exc:
            log.warning("node=%s DeviceTaintRule %s not written: %s", rule.node, rule.name, exc)
            return False
        verb = "tainted" if create else "tainted again (its rule had been changed)"
        log.info("node=%s %s %s: DeviceTaintRule %s", rule.node, rule.describe(), verb, rule.name)
        self._events.node(
            self._node_body(rule.node),
            "Warning",
            "GpuTainted",
            f"{rule.describe()} {verb} for {rule.fault or 'its fault'}: DeviceTaintRule "
            f"{rule.name} ({dra.TAINT_KEY}, NoExecute); pods whose claims hold it are "
            "evicted, the node's other GPUs keep theirs",
        )
        return True

    async def _delete(self, name: str, rule: dra.TaintRule) -> bool:
        try:
            await self._client.delete(DEVICE_TAINT_RULES, name)
        except NotFound:
            pass
        except ApiError as exc:
            log.warning("node=%s DeviceTaintRule %s not deleted: %s", rule.node, name, exc)
            return False
        log.info(
            "node=%s %s released: DeviceTaintRule %s deleted", rule.node, rule.describe(), name
        )
        self._events.node(
            self._node_body(rule.node),
            "Normal",
            "GpuUntainted",
            f"{rule.describe()} released: DeviceTaintRule {name} deleted; new claims may be "
            "allocated it again",
        )
        return True

    def _dry_run(self, todo: dra.RulePlan, have: dict[str, dra.TaintRule]) -> None:
        """Say once per rule what a pass would do; change nothing."""
        said: set[tuple[str, str]] = set()
        lines = [("taint", r.name, r) for r in (*todo.create, *todo.replace)]
        lines += [("release", name, have[name]) for name in todo.delete]
        for verb, name, rule in lines:
            said.add((verb, name))
            if (verb, name) in self._said:
                continue
            message = (
                f"dry-run: would {verb} {rule.describe()} (DeviceTaintRule {name}); "
                "nothing was changed"
            )
            log.info("node=%s %s", rule.node, message)
            self._events.node(self._node_body(rule.node), "Normal", "DryRun", message)
        self._said = said

    def _node_body(self, node: str) -> Json:
        return self._book.get(node) or {"metadata": {"name": node}}

    def _node_uid(self, node: str) -> str | None:
        body = self._book.get(node)
        uid = (body or {}).get("metadata", {}).get("uid")
        return uid if isinstance(uid, str) else None
