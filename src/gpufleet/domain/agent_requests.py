"""Which agent requests the node agent may carry out, and when (decision 0074).

The lifecycle controller asks a node's agent for work through a Node
annotation (:data:`~gpufleet.domain.well_known.ANNOTATION_AGENT_REQUEST`).
Anyone who can edit the Node can write that annotation, and an annotation can
outlive the decision it came from. So the agent does not obey the annotation;
it obeys the node's lifecycle record (:data:`~gpufleet.domain.well_known.ANNOTATION_RECORD`):

- **Legitimate** (:func:`refusal`): the request carries a
  :class:`~gpufleet.domain.conditions.Binding` (node, lifecycle state,
  incident, start of the step attempt or checks) equal to the one
  :func:`binding_of` derives from the record *now*, its kind is the one that
  state asks for (a GPU reset only while the ``gpu-reset`` step is in progress
  in ``remediating``; checks only in ``verifying`` and ``burn-in``; a
  maintenance command only in ``maintenance``, and only the command the
  record's incident names), and its id is the id the controller derives for
  it. Anything else is refused.
- **Never on a node with work** (:func:`work_refusal`): every request kind the
  agent knows is disruptive (a GPU reset kills what runs on the GPU; the
  verification and burn-in profiles run GEMM, HBM and NCCL stress; a
  maintenance command flashes firmware or replaces a driver), so the
  agent also refuses while Kubernetes pods, Slurm jobs or GPU processes are on
  the node, whatever the record says, and when any of the three cannot be
  read (fail closed).

The controller fills the binding with :func:`issue`, the agent checks it with
:func:`refusal`: both sides derive it from the same record with the same code.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpufleet.domain import conditions, maintenance
from gpufleet.domain.emptiness import SlurmWork, disruptive_work, pod_holds_node
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState

DISRUPTIVE_KINDS: frozenset[str] = frozenset({"checks", "gpu-reset", "command"})
"""Request kinds that disrupt work on the node: all of them today (see the module doc)."""

KIND_IN_STATE: Mapping[NodeState, conditions.RequestKind] = {
    NodeState.REMEDIATING: "gpu-reset",
    NodeState.VERIFYING: "checks",
    NodeState.BURN_IN: "checks",
    NodeState.MAINTENANCE: "command",
}
"""The one request kind each state may ask for; no request is legitimate in any other state."""


def request_id(record: NodeRecord) -> str | None:
    """The id of the agent request the record is waiting for, derived from the record.

    Deriving it (instead of storing it) keeps the controller stateless: the
    same record always expects the same answer, before and after a restart.
    """
    inc = record.incident
    if record.state is NodeState.VERIFYING and inc is not None and inc.checks_started_at:
        return f"verify-{int(inc.checks_started_at * 1000)}"
    if record.state is NodeState.BURN_IN and record.checks_started_at:
        return f"burn-in-{int(record.checks_started_at * 1000)}"
    if (
        record.state is NodeState.REMEDIATING
        and inc is not None
        and inc.current is Step.GPU_RESET
        and inc.tried
    ):
        last = inc.tried[-1]
        return f"gpu-reset-{last.attempt}-{int(last.started_at * 1000)}"
    if record.state is NodeState.MAINTENANCE and maintenance.command_of(record) is not None:
        return f"command-{int(record.since * 1000)}"
    return None


def binding_of(record: NodeRecord) -> conditions.Binding | None:
    """The binding a request issued for this record carries; None when the record
    asks nothing of the agent (then no request is legitimate)."""
    inc = record.incident
    state = record.state
    if state is NodeState.VERIFYING and inc is not None and inc.checks_started_at is not None:
        return conditions.Binding(record.name, state.value, inc.opened_at, inc.checks_started_at)
    if state is NodeState.BURN_IN and record.checks_started_at is not None:
        return conditions.Binding(record.name, state.value, None, record.checks_started_at)
    if state is NodeState.REMEDIATING and inc is not None and inc.current is Step.GPU_RESET:
        last = inc.tried[-1] if inc.tried else None
        if last is not None and last.step is Step.GPU_RESET and last.ended_at is None:
            return conditions.Binding(record.name, state.value, inc.opened_at, last.started_at)
    if state is NodeState.MAINTENANCE and inc is not None and maintenance.command_of(record):
        return conditions.Binding(record.name, state.value, inc.opened_at, record.since)
    return None


def issue(
    record: NodeRecord,
    kind: conditions.RequestKind,
    *,
    profile: str | None = None,
    gpu_index: int | None = None,
    timeout_s: int | None = None,
) -> conditions.AgentRequest | None:
    """The bound request the controller writes for this record (None: nothing to ask).

    A ``command`` request names the command the record's incident names
    (:func:`gpufleet.domain.maintenance.command_of`), never one given by the caller.
    """
    rid = request_id(record)
    binding = binding_of(record)
    if rid is None or binding is None or KIND_IN_STATE.get(record.state) != kind:
        return None
    command = maintenance.command_of(record) if kind == "command" else None
    return conditions.AgentRequest(
        id=rid,
        kind=kind,
        profile=profile,
        gpu_index=gpu_index,
        command=command,
        timeout_s=timeout_s if kind == "command" else None,
        binding=binding,
    )


def _describe(b: conditions.Binding) -> str:
    inc = "no incident" if b.incident is None else f"incident opened at {b.incident:.3f}"
    return f"{b.state}, {inc}, started at {b.started:.3f}"


def refusal(request: conditions.AgentRequest, node: str, record: NodeRecord | None) -> str | None:
    """Why this node's agent must not carry out ``request`` (None: it is legitimate).

    ``record`` is the node's lifecycle record as read just now (None: missing
    or unreadable, which refuses everything).
    """
    b = request.binding
    if b is None:
        return (
            "the request carries no binding to a controller decision (node, state, incident);"
            " only requests the lifecycle controller issued are carried out"
        )
    if b.node != node:
        return f"the request was issued for node {b.node}, not for {node}"
    if record is None:
        return "this node has no readable lifecycle record (gpufleet.io/record)"
    if record.name != node:
        return f"the lifecycle record on this node is {record.name}'s, not {node}'s"
    state = record.state
    if b.state != state.value:
        return f"the request was issued in state {b.state}; the node is now {state.value}"
    allowed = KIND_IN_STATE.get(state)
    if allowed is None:
        return f"no request is carried out on a node in {state.value}"
    if request.kind != allowed:
        return f"a {request.kind} request is not carried out in {state.value} (only {allowed})"
    expected = binding_of(record)
    if expected is None:
        step = record.incident.current if record.incident is not None else None
        doing = f"the step in progress is {step}" if step is not None else "nothing is in progress"
        return f"the node's record asks nothing of the agent ({doing})"
    if b != expected:
        return (
            f"the request belongs to another decision ({_describe(b)});"
            f" the node's is {_describe(expected)}"
        )
    rid = request_id(record)
    if request.id != rid:
        return f"the request id {request.id} is not the one the controller issued ({rid})"
    if request.kind == "command":
        named = maintenance.command_of(record)
        if request.command != named:
            return (
                f"the request names command {request.command!r}; the node's maintenance"
                f" runs {named!r}"
            )
    return None


def work_refusal(
    request: conditions.AgentRequest,
    *,
    pods: Iterable[Mapping[str, Any]] | None,
    slurm_work: str | None,
    gpu_busy: bool | None,
) -> str | None:
    """Why ``request`` must not run now because of work on the node (None: go ahead).

    ``pods``: the pods bound to the node (None: the API could not be read).
    ``slurm_work``: the Node's :data:`~gpufleet.domain.well_known.ANNOTATION_SLURM_WORK`
    text (absent: no Slurm report; present but unreadable: unknown).
    ``gpu_busy``: whether processes use the GPUs (None: could not be read).
    Unknown refuses: a disruptive request runs only on a node known to be empty.
    """
    if request.kind not in DISRUPTIVE_KINDS:
        return None
    unknown = "cannot tell whether the node has work"
    if pods is None:
        return f"{unknown}: the pods on the node could not be listed (failing closed)"
    work = SlurmWork.from_annotation(slurm_work)
    if slurm_work and work is None:
        return f"{unknown}: the Slurm work report on the node is unreadable (failing closed)"
    names = [_pod_name(p) for p in pods if pod_holds_node(p)]
    why = disruptive_work(len(names), work, gpu_busy=False)
    if why is not None and names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        why = f"{why} ({shown})"
    if why is None and gpu_busy is None:
        return f"{unknown}: GPU processes could not be read (failing closed)"
    if why is None:
        why = disruptive_work(0, None, gpu_busy)
    return None if why is None else f"the node has work: {why}"


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
