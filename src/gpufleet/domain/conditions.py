"""The contract between the node agent and the controllers, on the Node object.

Three things travel on a Node, and this module encodes and decodes each of
them, so the agent (writer) and the controllers (readers) cannot disagree:

1. **Problem conditions** (one per subsystem, ``True`` = problem). The agent
   raises a condition only when :func:`gpufleet.domain.decide.respond` says the
   node must be taken out (the same policy, the same repeat counting), so a
   condition never means "log this". The message is for people, followed by a
   JSON list of the occurrences that led there, so the controller can replay
   them into its own record (replaying is harmless: occurrences are counted
   once).
2. **Requests to the agent** (annotation ``gpufleet.io/agent-request``, set by
   the lifecycle controller): run a check profile, or reset a GPU.
3. **Results of requests** (annotation ``gpufleet.io/agent-result``, set by the
   agent: :mod:`gpufleet.domain.node_reports`): which request it answers,
   whether it passed, and why. The former ``GpufleetRequest`` condition is
   still encoded and decoded here, to read a node whose agent is older.
4. **What the controller has recorded** (annotation ``gpufleet.io/faults-seen``,
   set by the lifecycle controller with the record it decided: per condition
   type, the time of the latest occurrence it fed to ``decide``;
   :func:`faults_recorded` decodes it). The agent keeps a raised condition,
   with its evidence, until this watermark covers the condition's latest
   occurrence (:func:`gpufleet.domain.debounce.recorded`): a fault raised and
   gone again while no controller was acting (a takeover, a restart, an
   apiserver outage longer than the clear time) is still there when one acts.

Decoding never raises: anything malformed decodes to "nothing", and the
caller treats that as unknown (fail closed: no action).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from gpufleet.domain import well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem

MAX_OCCURRENCES = 16
"""Occurrences carried in one condition message (the most recent)."""

_JSON_MARK = " | evidence: "

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True, slots=True)
class ConditionReport:
    """A Node condition as the agent writes it."""

    type: str
    status: Status
    reason: str
    message: str


def reason_of(fault: FaultEvent) -> str:
    """A CamelCase condition reason: ``Xid79``, ``IbPortDown``, ``EccUncorrectable``."""
    if fault.xid is not None:
        return f"Xid{fault.xid}"
    return "".join(part.capitalize() for part in fault.kind.value.split("-"))


_EVIDENCE_FIELDS = (
    "gpu_index",
    "pci_bus_id",
    "hca",
    "port",
    "recovery_action",
    "gpu_instance",
    "compute_instance",
    "switch",
)
"""Evidence fields an occurrence carries (besides counters and message)."""


def _occurrence(f: FaultEvent) -> dict[str, Any]:
    e = f.evidence
    data: dict[str, Any] = {"kind": f.kind.value, "at": f.at}
    if f.xid is not None:
        data["xid"] = f.xid
    for name in _EVIDENCE_FIELDS:
        value = getattr(e, name)
        if value is not None:
            data[name] = value
    if e.counters:
        data["counters"] = dict(e.counters)
    if e.message:
        data["message"] = e.message[:300]
    return data


def problem(subsystem: Subsystem, faults: Sequence[FaultEvent]) -> ConditionReport:
    """The condition for a subsystem with these occurrences (latest last)."""
    if not faults:
        return healthy(subsystem)
    recent = list(faults)[-MAX_OCCURRENCES:]
    latest = recent[-1]
    human = f"{latest.describe()}: {latest.evidence.summary()}".rstrip(": ")
    if len(recent) > 1:
        human += f" ({len(recent)} occurrences)"
    payload = json.dumps([_occurrence(f) for f in recent], separators=(",", ":"))
    return ConditionReport(
        type=well_known.CONDITIONS[subsystem],
        status="True",
        reason=reason_of(latest),
        message=f"{human}{_JSON_MARK}{payload}",
    )


def healthy(subsystem: Subsystem) -> ConditionReport:
    """The condition for a subsystem with no problem."""
    return ConditionReport(
        type=well_known.CONDITIONS[subsystem],
        status="False",
        reason="NoProblem",
        message=f"no {subsystem.value} problem",
    )


_SUBSYSTEM_OF = {v: k for k, v in well_known.CONDITIONS.items()}


def subsystem_of(condition_type: str) -> Subsystem | None:
    """The subsystem of a gpufleet problem condition type, or None if it is not one."""
    return _SUBSYSTEM_OF.get(condition_type)


def faults_of(node: str, condition_type: str, status: str, message: str) -> list[FaultEvent]:
    """The occurrences carried by a problem condition (empty if not ``True`` or malformed)."""
    if status != "True" or condition_type not in _SUBSYSTEM_OF:
        return []
    _, sep, payload = message.rpartition(_JSON_MARK)
    if not sep:
        return []
    try:
        items = json.loads(payload)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    out: list[FaultEvent] = []
    for item in items:
        fault = _fault_from(node, item)
        if fault is not None:
            out.append(fault)
    return out


def _fault_from(node: str, item: object) -> FaultEvent | None:
    if not isinstance(item, Mapping):
        return None
    try:
        kind = FaultKind(item["kind"])
        at = float(item["at"])
        xid = int(item["xid"]) if "xid" in item else None
        counters = {str(k): float(v) for k, v in dict(item.get("counters", {})).items()}
        gpu = item.get("gpu_index")
        port = item.get("port")
        evidence = Evidence(
            gpu_index=int(gpu) if gpu is not None else None,
            pci_bus_id=_opt_str(item.get("pci_bus_id")),
            hca=_opt_str(item.get("hca")),
            port=int(port) if port is not None else None,
            counters=counters,
            message=str(item.get("message", "")),
            recovery_action=_opt_str(item.get("recovery_action")),
            gpu_instance=_opt_int(item.get("gpu_instance")),
            compute_instance=_opt_int(item.get("compute_instance")),
            switch=_opt_str(item.get("switch")),
        )
        return FaultEvent(kind, node, at=at, xid=xid, evidence=evidence)
    except (KeyError, TypeError, ValueError):
        return None


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def faults_recorded(text: str | None) -> dict[str, float]:
    """The controller's ``gpufleet.io/faults-seen`` watermarks: condition type -> time of
    the latest occurrence it recorded. Absent or malformed: nothing recorded (so the
    agent keeps every raised condition: never a hidden fault)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[str(key)] = float(value)
    return out


# ------------------------------------------------------------ agent requests

RequestKind = Literal["checks", "gpu-reset", "command"]
REQUEST_KINDS: frozenset[str] = frozenset(get_args(RequestKind))
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,80}$")


@dataclass(frozen=True, slots=True)
class Binding:
    """What ties a request to the controller's decision for one node (decision 0074).

    The agent carries out a request only when its binding equals the one
    :func:`gpufleet.domain.agent_requests.binding_of` derives from the node's
    current lifecycle record: so a hand-written request, one copied from
    another node, or one left over from an earlier incident or attempt is
    refused.
    """

    node: str
    """The Node the request was issued for."""
    state: str
    """The lifecycle state it was issued in (``remediating``, ``verifying``, ``burn-in``)."""
    incident: float | None
    """``opened_at`` of the node's incident (None in burn-in, which has no incident)."""
    started: float
    """When the step attempt (GPU reset) or the checks (verify, burn-in) started."""


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """What the controller asks of a node's agent."""

    id: str
    """Unique per request (the controller uses ``<incident>-<step>-<attempt>``)."""
    kind: RequestKind
    profile: str | None = None
    """For ``checks``: the profile (``verify``, ``burn-in``)."""
    gpu_index: int | None = None
    """For ``gpu-reset``: the GPU, or None for every GPU."""
    command: str | None = None
    """For ``command``: the maintenance command's name (the agent runs the file of that
    name in its commands directory, and only the one the node's record names)."""
    timeout_s: int | None = None
    """For ``command``: the agent kills the command after this many seconds."""
    binding: Binding | None = None
    """None: an unbound request (hand-written or from an older controller): refused."""

    def encode(self) -> str:
        """The annotation value."""
        data: dict[str, Any] = {"id": self.id, "kind": self.kind}
        if self.profile is not None:
            data["profile"] = self.profile
        if self.gpu_index is not None:
            data["gpu_index"] = self.gpu_index
        if self.command is not None:
            data["command"] = self.command
        if self.timeout_s is not None:
            data["timeout_s"] = self.timeout_s
        if self.binding is not None:
            b = self.binding
            data["node"] = b.node
            data["state"] = b.state
            data["incident"] = b.incident
            data["started"] = b.started
        return json.dumps(data, separators=(",", ":"))


def decode_request(value: str | None) -> AgentRequest | None:
    """Parse the request annotation; None if absent or malformed.

    A request whose binding is missing or malformed still decodes (with
    ``binding=None``), so the agent can answer it with a refusal that says why
    instead of ignoring it silently.
    """
    if not value:
        return None
    try:
        data = json.loads(value)
        kind = data["kind"]
        rid = str(data["id"])
        if kind not in REQUEST_KINDS or not _ID.match(rid):
            return None
        gpu = data.get("gpu_index")
        profile = data.get("profile")
        command = data.get("command")
        timeout = data.get("timeout_s")
        return AgentRequest(
            id=rid,
            kind=kind,
            profile=None if profile is None else str(profile),
            gpu_index=None if gpu is None else int(gpu),
            command=None if command is None else str(command),
            timeout_s=None if timeout is None else int(timeout),
            binding=_binding_from(data),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _binding_from(data: Mapping[str, Any]) -> Binding | None:
    node, state = data.get("node"), data.get("state")
    started = _number(data.get("started"))
    incident = data.get("incident")
    if not isinstance(node, str) or not isinstance(state, str) or started is None:
        return None
    if incident is not None and _number(incident) is None:
        return None
    return Binding(node=node, state=state, incident=_number(incident), started=started)


REFUSED = "Refused"
"""Reason of the ``GpufleetRequest`` condition when the agent refused a request."""
EVENT_REQUEST_REFUSED = "RequestRefused"
"""Reason of the Warning Event the agent writes on its Node when it refuses a request."""


def refusal(request_id: str, why: str) -> ConditionReport:
    """The former ``GpufleetRequest`` condition of a refused request (an older agent's
    answer; today's agent writes :func:`gpufleet.domain.node_reports.refusal`).

    Its reason is neither ``Passed`` nor ``Failed``, so :func:`decode_result`
    answers nothing: the controller does not take a refusal for a failed step
    (which would escalate to a reboot); it waits, and its step or verification
    timeout decides.
    """
    return ConditionReport(
        type=well_known.CONDITION_REQUEST,
        status="True",
        reason=REFUSED,
        message=f"{request_id}: refused: {why}"[:1024],
    )


@dataclass(frozen=True, slots=True)
class AgentResult:
    """The agent's answer to a request it carried out (passed or failed)."""

    id: str
    passed: bool
    detail: str = ""

    def condition(self) -> ConditionReport:
        """The former condition of this result, as an older agent wrote it (``True`` = the
        request failed); today's agent writes :func:`gpufleet.domain.node_reports.result`."""
        return ConditionReport(
            type=well_known.CONDITION_REQUEST,
            status="False" if self.passed else "True",
            reason="Passed" if self.passed else "Failed",
            message=f"{self.id}: {self.detail}".rstrip(": "),
        )


def decode_result(status: str, reason: str, message: str) -> AgentResult | None:
    """Parse the former ``GpufleetRequest`` condition; None if it answers nothing."""
    if reason not in ("Passed", "Failed") or status not in ("True", "False"):
        return None
    rid, _, detail = message.partition(": ")
    if not _ID.match(rid):
        return None
    return AgentResult(id=rid, passed=reason == "Passed" and status == "False", detail=detail)
