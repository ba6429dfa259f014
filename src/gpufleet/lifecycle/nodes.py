"""Reading and writing gpufleet's part of a Node: pure functions over Node JSON.

What the controller learns from a Node (its record, the faults its agent
reports, the agent's answer to the last request) and what it writes back (the
record, the state label, the cordon and taints gpufleet owns, the next agent
request) are computed here without I/O, so every rule about ownership is unit
tested: a cordon without :data:`~gpufleet.domain.well_known.ANNOTATION_CORDONED`
belongs to someone else and is never cleared; only the taints in
``OWNED_TAINTS`` are ever removed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpufleet.api import nodedata
from gpufleet.domain import (
    agent_requests,
    conditions,
    domain_burnin,
    domain_faults,
    events,
    lemon,
    maintenance,
    node_reports,
    well_known,
)
from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.operator import Received, receive
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState

log = logging.getLogger(__name__)

Json = dict[str, Any]

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
MARKED_STATES = frozenset({NodeState.DRAINING, NodeState.REMEDIATING, NodeState.VERIFYING})
"""States in which gpufleet's cordon and fault taint must be on the node."""


def name_of(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["name"])


def _meta(body: Mapping[str, Any], key: str) -> Mapping[str, str]:
    return body.get("metadata", {}).get(key) or {}


def labels_of(body: Mapping[str, Any]) -> Mapping[str, str]:
    """The Node's labels (what a FleetPolicy override's nodeSelector reads)."""
    return _meta(body, "labels")


def pool_of(body: Mapping[str, Any]) -> str:
    return _meta(body, "labels").get(well_known.LABEL_POOL, "default")


@dataclass(frozen=True, slots=True)
class Reading:
    """A Node's record as the controller reads it: the record to decide on, whether it
    is new (nothing stored), and whether what was stored can be trusted."""

    record: NodeRecord
    new: bool
    trust: nodedata.Trust
    problem: str = ""

    @property
    def untrusted(self) -> bool:
        """A record is stored but the controller cannot stand behind it (docs/decisions/0144):
        not signed by its key (unsigned in a state other than production, or forged),
        copied from another node, or unreadable."""
        return self.trust in (
            nodedata.Trust.UNSIGNED,
            nodedata.Trust.INVALID,
            nodedata.Trust.UNREADABLE,
        )


def reading(
    body: Mapping[str, Any], now: float, keys: Sequence[nodedata.SigningKey] = ()
) -> Reading:
    """The node's stored record, or a new one, and how far the stored one is trusted.

    A node gpufleet has never seen starts in ``provisioning`` if something
    labelled it so (the provisioning service does), else in ``production``:
    adopting a running fleet must not take nodes out. An unsigned record in
    production with nothing open (an earlier version's) is taken as such an
    adoption and signed on the next write; any other record that does not
    verify is returned with its trust, for the node pass to fail closed on.
    """
    stored = nodedata.read_record(body, keys)
    name = name_of(body)
    pool = pool_of(body)
    record = stored.record
    if record is not None:
        if record.pool != pool:
            record = replace(record, pool=pool)
        trust = stored.trust
        if trust is nodedata.Trust.UNSIGNED and _plain_production(record):
            trust = nodedata.Trust.UNVERIFIED
        return Reading(record, False, trust, stored.problem)
    label = _meta(body, "labels").get(well_known.LABEL_STATE)
    try:
        state = NodeState(label) if label else NodeState.PRODUCTION
    except ValueError:
        state = NodeState.PRODUCTION
    reason = "new node" if state is NodeState.PROVISIONING else "adopted by gpufleet"
    fresh = NodeRecord.new(name, at=now, pool=pool, state=state, reason=reason)
    if stored.trust is nodedata.Trust.UNREADABLE:
        log.error("node=%s %s", name, stored.problem)
        return Reading(fresh, False, stored.trust, stored.problem)
    return Reading(fresh, True, nodedata.Trust.ABSENT)


def _plain_production(record: NodeRecord) -> bool:
    return (
        record.state is NodeState.PRODUCTION and record.incident is None and record.pending is None
    )


def record_of(body: Mapping[str, Any], now: float) -> tuple[NodeRecord, bool]:
    """The node's stored record (or a new one) and whether it is new, unverified:
    for readers that only show or compare it (the node pass and the gate use
    :func:`reading` with the controller's key)."""
    found = reading(body, now)
    return found.record, found.new


def node_conditions(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(body.get("status", {}).get("conditions") or [])


def is_ready(body: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node_conditions(body)
    )


def faults_seen(body: Mapping[str, Any]) -> dict[str, float]:
    text = _meta(body, "annotations").get(well_known.ANNOTATION_FAULTS_SEEN)
    if not text:
        return {}
    try:
        data = json.loads(text)
        return {str(k): float(v) for k, v in data.items()}
    except (ValueError, AttributeError, TypeError):
        return {}


@dataclass(frozen=True, slots=True)
class Observation:
    """What a Node says that ``decide`` has not heard yet."""

    events: tuple[events.Event, ...]
    seen: dict[str, float]
    """The new faults-seen watermarks (store with the record)."""
    request: Received | None = None
    """A person's request found on the Node (its event, if readable, is the last of
    :attr:`events`). The controller removes the annotation in the write that stores
    the record and answers with an ``OperatorRequest`` Event."""


def request_id(record: NodeRecord) -> str | None:
    """The id of the agent request the record is waiting for (derived from the record,
    so a restarted controller expects the same answer; :mod:`gpufleet.domain.agent_requests`)."""
    return agent_requests.request_id(record)


def agent_request(
    record: NodeRecord, actions: tuple[Action, ...]
) -> conditions.AgentRequest | None:
    """The checks request to put on the Node with the record, if these actions ask for one.

    It carries its binding to this record (node, state, incident, checks start): the
    agent carries out only a request that matches the record it reads (decision 0074).
    A GPU reset or a maintenance command is not written here: the gate writes it
    once the node is proven empty (:meth:`gpufleet.gate.Gate.agent_request`).
    """
    for a in actions:
        if a.kind is ActionKind.RUN_CHECKS:
            return agent_requests.issue(record, "checks", profile=a.profile)
    return None


def observe(body: Mapping[str, Any], record: NodeRecord) -> Observation:
    """Events for ``decide``: new fault occurrences, cleared pending faults, agent answers."""
    name = name_of(body)
    seen = faults_seen(body)
    new_seen = dict(seen)
    out: list[events.Event] = []
    result = node_reports.result_of(body)  # the agent's answer (annotation; old condition)
    for cond in node_conditions(body):
        ctype = str(cond.get("type", ""))
        status = str(cond.get("status", ""))
        if conditions.subsystem_of(ctype) is None:
            continue
        faults = conditions.faults_of(name, ctype, status, str(cond.get("message", "")))
        mark = seen.get(ctype, float("-inf"))
        for fault in faults:
            if fault.at > mark:
                out.append(events.FaultObserved(fault))
                new_seen[ctype] = max(new_seen.get(ctype, float("-inf")), fault.at)
    # A held fault stays pending after its condition clears (it is acted on when the
    # rails allow, or dismissed by an operator): no FaultCleared is fed for it.
    expected = request_id(record)
    if result is not None and expected is not None and result.id == expected:
        if record.state is NodeState.REMEDIATING:
            out.append(events.StepCompleted(Step.GPU_RESET, result.passed, result.detail))
        elif record.state is NodeState.MAINTENANCE:
            answered = maintenance.command_answered(record, result.passed, result.detail)
            if answered is not None:  # None: a domain-scope plan returns its trays together
                out.append(answered)
        else:
            out.append(events.ChecksCompleted(result.passed, result.detail))
    answer = node_reports.answer_of(body)
    if (
        answer is not None
        and answer.outcome == "refused"
        and expected is not None
        and answer.id == expected
    ):
        # The agent found work on the node (decision 0074): drain again, never escalate.
        if record.state is NodeState.REMEDIATING:
            out.append(events.WorkFound(Step.GPU_RESET, answer.detail))
        elif record.state is NodeState.MAINTENANCE:
            out.append(events.WorkFound(None, answer.detail))
    judged = domain_verdict(body, record)
    if judged is not None:
        out.append(judged)
    received = operator_request(body)
    if received is not None and received.event is not None:
        out.append(received.event)  # last: decided on the record the other events leave
    return Observation(events=tuple(out), seen=new_seen, request=received)


def domain_verdict(body: Mapping[str, Any], record: NodeRecord) -> events.DomainBurnInJudged | None:
    """The domain burn-in's verdict on the Node (``gpufleet burn-in domain``), when the
    record waits for it: its own domain's, kept after the wait began (decision 0247)."""
    if record.domain_wait is None:
        return None
    kept = domain_burnin.read_recorded(
        _meta(body, "annotations").get(well_known.ANNOTATION_DOMAIN_BURN_IN)
    )
    if kept is None or kept.domain != record.nvlink_domain or kept.at <= record.domain_wait:
        return None
    return events.DomainBurnInJudged(kept.domain, kept.passed, kept.at, kept.reason, kept.bad)


def operator_request(body: Mapping[str, Any]) -> Received | None:
    """The operator request on the Node (``gpufleet node VERB``), if there is one."""
    text = _meta(body, "annotations").get(well_known.ANNOTATION_OPERATOR_REQUEST)
    if text is None:
        return None
    return receive(str(text))


# ------------------------------------------------------------------- writing


def _taint_value(record: NodeRecord) -> str:
    key = record.incident.key if record.incident else record.state.value
    return key if _LABEL_VALUE.match(key) else record.state.value


def node_patch(
    body: Mapping[str, Any],
    record: NodeRecord,
    actions: tuple[Action, ...],
    *,
    key: nodedata.SigningKey,
    seen: Mapping[str, float] | None = None,
) -> Json:
    """A JSON merge patch: the record and label, plus the node-object actions.

    The record is written in the same request as cordon/taint (atomic, so
    "record before act" holds for them); requests to the agent ride along too,
    because the agent acts only after this write lands. Machine-level steps
    (BMC) are carried out only after this patch succeeded.

    Carries ``metadata.resourceVersion`` so a concurrent change to the Node
    (someone else's taint) makes the write fail with 409 instead of being lost.

    While the node is out, gpufleet's cordon and unhealthy taint are put back if someone
    clears them. A tray held with its NVLink domain gets its taint back too: its incident
    has no plan, like an operator's maintenance (which sets no taint), but a fault took it
    out (decision 0240).
    """
    meta = body.get("metadata", {})
    annotations = dict(_meta(body, "annotations"))
    spec = body.get("spec", {}) or {}
    taints: list[Json] = [dict(t) for t in spec.get("taints") or []]
    ann: dict[str, str | None] = {
        **nodedata.record_annotations(record, key),
        well_known.ANNOTATION_REASON: record.reason[:500],
    }
    ann.update(lemon_annotations(record))
    if seen is not None:
        ann[well_known.ANNOTATION_FAULTS_SEEN] = json.dumps(dict(seen), separators=(",", ":"))
    patch_spec: Json = {}
    kinds = {a.kind for a in actions}
    ours = annotations.get(well_known.ANNOTATION_CORDONED) == well_known.CONTROLLER
    unschedulable = bool(spec.get("unschedulable"))
    want_cordon = ActionKind.CORDON in kinds or (
        record.state in MARKED_STATES and ActionKind.UNCORDON not in kinds
    )
    if want_cordon and not unschedulable:
        patch_spec["unschedulable"] = True
        ann[well_known.ANNOTATION_CORDONED] = well_known.CONTROLLER
    if ActionKind.UNCORDON in kinds and ours:
        patch_spec["unschedulable"] = None
        ann[well_known.ANNOTATION_CORDONED] = None
    new_taints = list(taints)
    for a in actions:
        if a.kind is ActionKind.TAINT and a.detail in well_known.OWNED_TAINTS and a.taint:
            new_taints = [t for t in new_taints if t.get("key") != a.detail]
            new_taints.append(
                {"key": a.detail, "value": _taint_value(record), "effect": str(a.taint)}
            )
        elif a.kind is ActionKind.UNTAINT:
            new_taints = [t for t in new_taints if t.get("key") not in well_known.OWNED_TAINTS]
    # Reapply our fault taint if someone removed it while the node is out.
    inc = record.incident
    if (
        ActionKind.UNTAINT not in kinds
        and record.state in MARKED_STATES
        and inc is not None
        and (not inc.maintenance or domain_faults.held(inc))
        and not any(t.get("key") == well_known.TAINT_UNHEALTHY for t in new_taints)
    ):
        new_taints.append(
            {
                "key": well_known.TAINT_UNHEALTHY,
                "value": _taint_value(record),
                "effect": str(inc.taint),
            }
        )
    # A hot spare's taint follows its record (domain.spares); gone once it is promoted.
    spare = record.is_spare
    has_spare_taint = any(t.get("key") == well_known.TAINT_SPARE for t in new_taints)
    if spare and not has_spare_taint:
        new_taints.append({"key": well_known.TAINT_SPARE, "value": "true", "effect": "NoSchedule"})
    elif not spare and has_spare_taint:
        new_taints = [t for t in new_taints if t.get("key") != well_known.TAINT_SPARE]
    if new_taints != taints:
        patch_spec["taints"] = new_taints or None
    request = agent_request(record, actions)
    if request is not None:
        ann[well_known.ANNOTATION_AGENT_REQUEST] = request.encode()
    elif (
        record.state is NodeState.PRODUCTION and well_known.ANNOTATION_AGENT_REQUEST in annotations
    ):
        ann[well_known.ANNOTATION_AGENT_REQUEST] = None
    patch: Json = {
        "metadata": {
            "labels": {
                well_known.LABEL_STATE: record.state.value,
                well_known.LABEL_SPARE: "true" if spare else None,
            },
            "annotations": ann,
        }
    }
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    if patch_spec:
        patch["spec"] = patch_spec
    return patch


def lemon_annotations(record: NodeRecord) -> dict[str, str | None]:
    """The lemon score annotations for a record (None removes one: new hardware)."""
    score = record.lemon
    if score is None:
        return {well_known.ANNOTATION_LEMON_SCORE: None, well_known.ANNOTATION_LEMON_GPUS: None}
    return {
        well_known.ANNOTATION_LEMON_SCORE: f"{score.node:.2f}",
        well_known.ANNOTATION_LEMON_GPUS: lemon.gpu_text(score) or None,
    }


def apply_merge_patch(body: Mapping[str, Any], patch: Mapping[str, Any]) -> Json:
    """RFC 7386 merge patch applied locally (the controller's view after a write)."""

    def merge(target: Any, p: Any) -> Any:
        if not isinstance(p, Mapping):
            return p
        out = dict(target) if isinstance(target, Mapping) else {}
        for k, v in p.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(out.get(k), v)
        return out

    result: Json = merge(body, patch)
    return result


def bmc_secret_ref(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(namespace, name)`` of the node's BMC Secret, or None if not annotated."""
    ref = _meta(body, "annotations").get(well_known.ANNOTATION_BMC_SECRET, "")
    ns, sep, name = ref.partition("/")
    if not sep or not ns or not name:
        return None
    return ns, name
