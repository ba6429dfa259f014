"""Slurm schedules Kubernetes pods: pod groups, their Slurm jobs, and each pass's decision.

Pods with ``spec.schedulerName: gpufleet-slurm`` are scheduled by ``gpufleet
pod-scheduler`` (decision 0257): each *pod group* becomes one Slurm job that asks for
what the pods ask (one node per pod), and when Slurm runs the job every pod of the
group is bound to the job's nodes at once. This module is the pure part: it reads a pod
once (:func:`member`), says which group it belongs to (:func:`group_key`), how big the
group is (:func:`expected_size`) and what to ask Slurm for (:func:`request`), and
decides one pass of the scheduler (:func:`plan`) from the pods, what Slurm listed and
the nodes. The caller does the I/O: it lists pods, Jobs, namespaces, nodes and Slurm's
jobs, calls :func:`plan`, and carries out the actions in the order given.

A group is read from the labels the owners already put on their pods, first match wins:

* ``gpufleet.io/pod-group`` (explicit; size from ``gpufleet.io/pod-group-size``);
* a LeaderWorkerSet group (``leaderworkerset.sigs.k8s.io/name`` and ``group-index``;
  size from the ``leaderworkerset.sigs.k8s.io/size`` annotation);
* a JobSet's child Job (``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``,
  ``job-index``; size from the child Job's parallelism);
* a Kubernetes Job (``batch.kubernetes.io/job-name`` and ``controller-uid``; size from
  its parallelism, :func:`effective_parallelism`);
* else the pod alone (size 1).

The key never names a pod, so a Slurm job outlives the pods it was submitted for: the
owner's replacement pods find the job (requeued or still running) by its comment.

The request asks, on every node, for the largest member's GPUs, CPUs and memory
(decision 0258). Rules of :func:`plan`, per group (all pod names in actions are
``namespace/name``; decision 0259 says why a running gang is refilled or requeued):

* **Duplicates**: two Slurm jobs that are not ended for one key: the one most pods are
  planned for is kept (else the oldest), the others are cancelled.
* **Nothing live**: no pod of the group pending or running (and none terminating, whose
  owner may be replacing it): its job is cancelled.
* **Ended**: a live pod bound under a job that ended (a terminal state, or absent from
  two successful listings at least :data:`ABSENT_GRACE_S` apart), was requeued (pending
  again), is COMPLETING (a job being requeued shows so too: no second job is submitted
  until Slurm says which), is SUSPENDED (a pod cannot be) or no longer holds the pod's
  node, is evicted. A job absent from one listing only changes nothing.
* **Running**: the pods not yet bound are given the job's free nodes (no pod of any group
  stands there, running or terminating: Slurm frees a requeued job's nodes before its pods
  have left them), a pod keeping the node its plan annotation names, the others in index
  order onto the nodes in sorted order, only when they make the group whole with its pods
  already running; every node they need must be fit (:func:`node_fit`), else the job is
  requeued and nobody is bound.
  A node that turns unfit under a running pod changes nothing here (the fault path drains
  it; the pod's replacement then needs the node and the job is requeued). The plan is
  written (:class:`Plan`) before the pods are bound (:class:`Bind`); the caller must not
  bind a group whose plan it could not write.
* **No job**: a group with exactly its size of pending unbound pods is submitted
  (highest pod priority first, at most ``submit_limit`` a pass); a group with a bad size
  or annotation, or more pending pods than its size, is rejected (``InvalidPodGroup``).
  Never a second job for a key whose job is not ended or may still exist.

:func:`plan` must be called only with a successful listing of Slurm's jobs; a failed
listing means "no pass" (bound pods keep running, pending ones wait).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from gpufleet.domain import well_known
from gpufleet.domain.quantities import pod_requests

Kind = Literal["group", "lws", "jobset", "job", "pod"]
KINDS: tuple[Kind, ...] = ("group", "lws", "jobset", "job", "pod")

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource a pod asks GPUs with (a GRES ``gpu`` in Slurm)."""

# Labels and annotations the owners put on their pods (their APIs' constants).
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"

# The slurm.gpufleet.io/ annotations (pod, else namespace).
PARTITION = well_known.SLURM_POD_ANNOTATION_PREFIX + "partition"
ACCOUNT = well_known.SLURM_POD_ANNOTATION_PREFIX + "account"
QOS = well_known.SLURM_POD_ANNOTATION_PREFIX + "qos"
PRIORITY = well_known.SLURM_POD_ANNOTATION_PREFIX + "priority"
TIME_LIMIT = well_known.SLURM_POD_ANNOTATION_PREFIX + "time-limit"
GPU_TYPE = well_known.SLURM_POD_ANNOTATION_PREFIX + "gpu-type"
SLURM_ANNOTATIONS = (PARTITION, ACCOUNT, QOS, PRIORITY, TIME_LIMIT, GPU_TYPE)

SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""What a partition, account, QOS or GRES type may be called (Slurm names)."""
MIN_PRIORITY = 1
"""Priority 0 is how Slurm holds a job (``scontrol hold``): a group never runs at 0."""
MAX_PRIORITY = 2**32 - 3
"""Slurm's largest job priority (what ``--priority=TOP`` sets): ``NO_VAL`` (2**32 - 2)
would read as no priority given."""
MAX_TIME_MINUTES = 365 * 24 * 60
"""A time limit above a year is a typo, not a request."""
JOB_NAME_MAX = 120

ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)
"""Slurm job states after which the job never runs again: its live pods are evicted and
its group's pending pods may be submitted anew. Every other state (PENDING, REQUEUED,
CONFIGURING, SUSPENDED, held, COMPLETING...) is a job that may still run."""
LEAVING_STATES = frozenset({"COMPLETING"})
"""The allocation is ending, but the job may be on its way back to the queue (Slurm shows
a job being requeued as COMPLETING while its epilog runs): its pods are evicted, and no
second job is submitted until Slurm says which."""
SUSPENDED = "SUSPENDED"
"""A suspended job keeps its allocation but runs nothing (preemption by suspension gives
its nodes to another job): its pods, which cannot be suspended, are evicted."""
RUNNING = "RUNNING"
ABSENT_GRACE_S = 30.0
"""A known job missing from Slurm's listings counts as ended only when two successful
listings at least this far apart both lack it (a slurmctld restart changes nothing)."""
DEFAULT_SUBMIT_LIMIT = 100
"""How many groups one pass submits at most (highest priority first): a pass stays short
and the rest are submitted by the next one."""

INVALID = "InvalidPodGroup"
SLURM_REJECTED = "SlurmRejected"


# -- group keys ----------------------------------------------------------------


@dataclass(frozen=True, order=True)
class GroupKey:
    """Which pods make one Slurm job: stable across the pods' re-creation by their owner."""

    namespace: str
    kind: Kind
    name: str
    uid: str = "-"

    @property
    def tag(self) -> str:
        """One line, no spaces: what follows :data:`POD_JOB_COMMENT_PREFIX` in the comment."""
        return f"{self.namespace}/{self.kind}/{self.name}/{self.uid or '-'}"

    @property
    def comment(self) -> str:
        """The Slurm job's comment: how the scheduler finds the job again."""
        return well_known.POD_JOB_COMMENT_PREFIX + self.tag

    @property
    def job_name(self) -> str:
        """The Slurm job's name, what ``squeue`` and ``sacct`` show: the work's own name."""
        return f"{self.namespace}/{self.name}"[:JOB_NAME_MAX]

    @classmethod
    def from_tag(cls, text: str) -> GroupKey | None:
        """The key a tag (or a whole comment) names; None when it is not one of ours."""
        text = text.strip()
        if text.startswith(well_known.POD_JOB_COMMENT_PREFIX):
            text = text[len(well_known.POD_JOB_COMMENT_PREFIX) :]
        parts = text.split("/")
        if len(parts) != 4 or not all(parts) or any(c.isspace() for c in text):
            return None
        namespace, kind, name, uid = parts
        for k in KINDS:
            if kind == k:
                return cls(namespace, k, name, uid)
        return None


def key_from_comment(comment: str) -> GroupKey | None:
    """The group a Slurm job's comment names; None for any job the scheduler did not submit."""
    if not comment.strip().startswith(well_known.POD_JOB_COMMENT_PREFIX):
        return None
    return GroupKey.from_tag(comment)


# -- one pod ---------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One pod of a group, as the scheduler needs it (parsed once by :func:`member`)."""

    name: str
    uid: str = ""
    phase: str = "Pending"
    node: str | None = None
    deleting: bool = False
    index: int | None = None
    priority: int = 0
    cpu_milli: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    planned_job: int | None = None
    planned_node: str | None = None
    active_deadline_s: int | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = well_known.POD_SCHEDULER_NAME
    owner: tuple[str, str, str] | None = None
    namespace: str = "default"

    @property
    def live(self) -> bool:
        """Pending or running and not being deleted: a pod that still wants its node."""
        return self.phase in ("Pending", "Running") and not self.deleting

    @property
    def qualified(self) -> str:
        """``namespace/name``, how actions name the pod."""
        return f"{self.namespace}/{self.name}"

    @property
    def bound(self) -> bool:
        return self.node is not None


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        return int(value)
    return None


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def _index(labels: Mapping[str, str], annotations: Mapping[str, str]) -> int | None:
    for raw in (
        labels.get(JOB_INDEX_LABEL),
        annotations.get(JOB_INDEX_ANNOTATION),
        labels.get(LWS_WORKER_INDEX_LABEL),
    ):
        value = _int(raw)
        if value is not None:
            return value
    return None


def member(pod: Mapping[str, Any]) -> Member:
    """One pod object (as the apiserver returns it) read once into a :class:`Member`."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = _strings(meta.get("labels"))
    annotations = _strings(meta.get("annotations"))
    owner = None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            owner = (str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", "")))
            break
    asked = pod_requests(spec)
    planned_node = annotations.get(well_known.ANNOTATION_SLURM_NODE) or None
    deadline = _int(spec.get("activeDeadlineSeconds"))
    return Member(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        phase=str(status.get("phase") or "Pending"),
        node=spec.get("nodeName") or None,
        deleting=bool(meta.get("deletionTimestamp")),
        index=_index(labels, annotations),
        priority=_int(spec.get("priority")) or 0,
        cpu_milli=math.ceil(asked.get("cpu", Fraction(0)) * 1000),
        memory_bytes=math.ceil(asked.get("memory", Fraction(0))),
        gpus=math.ceil(asked.get(GPU_RESOURCE, Fraction(0))),
        planned_job=_int(annotations.get(well_known.ANNOTATION_SLURM_JOB)),
        planned_node=planned_node,
        active_deadline_s=deadline if deadline is not None and deadline > 0 else None,
        annotations=annotations,
        labels=labels,
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        owner=owner,
        namespace=str(meta.get("namespace") or "default"),
    )


def group_key(m: Member, namespace: str) -> GroupKey | str:
    """The group a pod belongs to, or why its group labels cannot be read."""
    labels = m.labels
    explicit = labels.get(well_known.LABEL_POD_GROUP)
    if explicit is not None:
        if not explicit:
            return f"label {well_known.LABEL_POD_GROUP} is empty"
        return GroupKey(namespace, "group", explicit)
    lws = labels.get(LWS_NAME_LABEL)
    if lws:
        group = _int(labels.get(LWS_GROUP_INDEX_LABEL))
        if group is None or group < 0:
            return f"label {LWS_GROUP_INDEX_LABEL} is missing or not a number"
        return GroupKey(namespace, "lws", f"{lws}-{group}")
    jobset = labels.get(JOBSET_NAME_LABEL)
    if jobset:
        job = _first(labels, JOB_NAME_LABELS)
        if not job:
            replicated = labels.get(JOBSET_REPLICATED_JOB_LABEL)
            index = _int(labels.get(JOBSET_JOB_INDEX_LABEL))
            if not replicated or index is None:
                return (
                    f"labels {JOBSET_REPLICATED_JOB_LABEL} and {JOBSET_JOB_INDEX_LABEL} "
                    "are missing or not valid"
                )
            job = f"{jobset}-{replicated}-{index}"
        return GroupKey(namespace, "jobset", job, labels.get(JOBSET_UID_LABEL) or "-")
    job = _first(labels, JOB_NAME_LABELS)
    if job:
        uid = _first(labels, JOB_UID_LABELS)
        if not uid and m.owner is not None and m.owner[0] == "Job":
            uid = m.owner[2]
        return GroupKey(namespace, "job", job, uid or "-")
    return GroupKey(namespace, "pod", m.name, m.uid or "-")


def _first(labels: Mapping[str, str], keys: Iterable[str]) -> str | None:
    for k in keys:
        if labels.get(k):
            return labels[k]
    return None


def effective_parallelism(job: Mapping[str, Any]) -> int:
    """How many pods of a Kubernetes Job run at once: ``spec.parallelism`` (default 1),
    at most the completions still missing; 0 while the Job is suspended. What
    :func:`expected_size` expects for a Job's (or a JobSet child Job's) group."""
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    if spec.get("suspend"):
        return 0
    parallelism = _int(spec.get("parallelism"))
    size = 1 if parallelism is None else max(parallelism, 0)
    completions = _int(spec.get("completions"))
    if completions is not None:
        succeeded = _int(status.get("succeeded")) or 0
        size = min(size, max(completions - succeeded, 0))
    return size


def expected_size(
    key: GroupKey, members: Sequence[Member], job_parallelism: Mapping[tuple[str, str], int]
) -> int | str:
    """How many pods the group has when complete, or why that cannot be told."""
    if key.kind == "pod":
        return 1
    if key.kind in ("job", "jobset"):
        size = job_parallelism.get((key.namespace, key.name))
        if size is None:
            return f"Job {key.namespace}/{key.name} was not found"
        if size < 1:
            return f"Job {key.namespace}/{key.name} runs no pod now (parallelism {size})"
        return size
    annotation = (
        well_known.ANNOTATION_POD_GROUP_SIZE if key.kind == "group" else LWS_SIZE_ANNOTATION
    )
    values = {m.annotations[annotation] for m in members if annotation in m.annotations}
    if not values:
        return f"annotation {annotation} is missing"
    if len(values) > 1:
        return f"the pods disagree on annotation {annotation}: {', '.join(sorted(values))}"
    (raw,) = values
    size = _int(raw)
    if size is None or size < 1:
        return f"annotation {annotation}: {raw!r} is not a positive integer"
    return size


# -- what to ask Slurm for ------------------------------------------------------


@dataclass(frozen=True)
class JobRequest:
    """The Slurm job one pod group asks for: ``nodes`` nodes, one task each, and on
    each node the largest member's GPUs, CPUs and memory."""

    key: GroupKey
    job_name: str
    comment: str
    nodes: int
    gpus_per_node: int = 0
    gpu_type: str | None = None
    cpus_per_node: int = 1
    mem_mib: int | None = None
    """None: the pods ask no memory; ``--mem`` must then be left out (``--mem=0`` is
    the whole node's memory to Slurm)."""
    time_minutes: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    priority: int | None = None


def ordered(members: Iterable[Member]) -> list[Member]:
    """Members in their index order (pods without one after, by name)."""
    return sorted(members, key=lambda m: (m.index is None, m.index or 0, m.name))


def _setting(
    key: str, members: Sequence[Member], namespace_annotations: Mapping[str, str]
) -> tuple[str | None, str] | str:
    """The value of one slurm.gpufleet.io/ annotation and where it came from, or why it
    cannot be read (the pods disagree)."""
    values = {m.annotations[key] for m in members if key in m.annotations}
    if len(values) > 1:
        return f"the pods disagree on annotation {key}: {', '.join(sorted(values))}"
    if values:
        return values.pop(), "pod"
    if key in namespace_annotations:
        return namespace_annotations[key], "namespace"
    return None, ""


def request(
    key: GroupKey,
    members: Sequence[Member],
    size: int,
    namespace_annotations: Mapping[str, str],
) -> JobRequest | str:
    """What to ask Slurm for this group, or why the group's settings are invalid (which
    annotation, where, and what is wrong with its value)."""
    if not members:
        return "the group has no pods"
    if size < 1:
        return f"the group's size is {size}"
    found: dict[str, str | None] = {}
    for name in SLURM_ANNOTATIONS:
        got = _setting(name, members, namespace_annotations)
        if isinstance(got, str):
            return got
        value, where = got
        if value is not None:
            why = _invalid(name, value.strip())
            if why:
                return f"annotation {name} on the {where}: {value!r} {why}"
            value = value.strip()
        found[name] = value
    deadlines = [m.active_deadline_s for m in members]
    time_minutes: int | None = None
    if found[TIME_LIMIT] is not None:
        time_minutes = int(found[TIME_LIMIT] or 0)
    elif deadlines and all(d is not None for d in deadlines):
        time_minutes = math.ceil(max(d or 0 for d in deadlines) / 60)
    mem = max(m.memory_bytes for m in members)
    priority = found[PRIORITY]
    return JobRequest(
        key=key,
        job_name=key.job_name,
        comment=key.comment,
        nodes=size,
        gpus_per_node=max(m.gpus for m in members),
        gpu_type=found[GPU_TYPE],
        cpus_per_node=max(1, math.ceil(max(m.cpu_milli for m in members) / 1000)),
        mem_mib=math.ceil(mem / 2**20) if mem > 0 else None,
        time_minutes=time_minutes,
        partition=found[PARTITION],
        account=found[ACCOUNT],
        qos=found[QOS],
        priority=int(priority) if priority is not None else None,
    )


def _invalid(name: str, value: str) -> str:
    """Why one slurm.gpufleet.io/ annotation's value is invalid ('' when it is valid)."""
    if name == PRIORITY:
        n = _int(value)
        if n is None or not MIN_PRIORITY <= n <= MAX_PRIORITY:
            return f"is not an integer in {MIN_PRIORITY}..{MAX_PRIORITY} (0 holds a Slurm job)"
        return ""
    if name == TIME_LIMIT:
        n = _int(value)
        if n is None or not 1 <= n <= MAX_TIME_MINUTES:
            return f"is not a whole number of minutes in 1..{MAX_TIME_MINUTES}"
        return ""
    if not SLURM_NAME.match(value):
        return "is not a Slurm name (1 to 64 of A-Z a-z 0-9 _ . -)"
    return ""


# -- what Slurm said, and the nodes --------------------------------------------


@dataclass(frozen=True)
class SlurmJob:
    """One of the scheduler's jobs as a successful Slurm listing showed it."""

    job_id: int
    key: GroupKey
    state: str
    nodes: tuple[str, ...] = ()
    """The allocation, expanded (empty while pending)."""
    reason: str = ""

    @property
    def word(self) -> str:
        """The state's first word, upper case (``CANCELLED by 0`` -> ``CANCELLED``)."""
        parts = self.state.split()
        return parts[0].rstrip("+").upper() if parts else ""

    @property
    def ended(self) -> bool:
        return self.word in ENDED_STATES


@dataclass(frozen=True)
class NodeFit:
    """Whether a node may take a pod of a group now, and why not."""

    name: str
    fit: bool
    why: str = ""


def node_fit(node: Mapping[str, Any] | None, name: str = "") -> NodeFit:
    """A node is fit for a pod when it exists, is not cordoned, is in gpufleet's
    ``production`` state when gpufleet manages it, and has no NoExecute taint."""
    if node is None:
        return NodeFit(name, False, "the node does not exist")
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    name = str(meta.get("name") or name)
    if spec.get("unschedulable"):
        return NodeFit(name, False, "the node is cordoned")
    state = (meta.get("labels") or {}).get(well_known.LABEL_STATE)
    if state is not None and state != "production":
        return NodeFit(name, False, f"gpufleet has the node in state {state}")
    for taint in spec.get("taints") or []:
        if taint.get("effect") == "NoExecute":
            return NodeFit(name, False, f"the node has the NoExecute taint {taint.get('key')}")
    return NodeFit(name, True)


# -- actions ---------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    request: JobRequest


@dataclass(frozen=True)
class Plan:
    """Write the plan annotations (job id, node) on each pod before any is bound."""

    job_id: int
    assignments: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Bind:
    pod: str
    node: str


@dataclass(frozen=True)
class Requeue:
    """Requeue the whole job (``scontrol requeue``): nobody of its group is bound now."""

    job_id: int
    why: str
    unfit: tuple[str, ...] = ()
    """The nodes of the allocation found unfit: Slurm may not know (a Kubernetes cordon
    or taint is not a Slurm drain), so the caller may keep the requeued job off them."""


@dataclass(frozen=True)
class Cancel:
    job_id: int
    why: str


@dataclass(frozen=True)
class Evict:
    pod: str
    why: str


@dataclass(frozen=True)
class Reject:
    """``PodScheduled=False`` with this reason, and an Event, on each of these pods."""

    pods: tuple[str, ...]
    reason: str
    message: str


Action = Submit | Plan | Bind | Requeue | Cancel | Evict | Reject


# -- one pass ----------------------------------------------------------------------


def absent_jobs(
    groups: Mapping[GroupKey, Sequence[Member]],
    jobs: Sequence[SlurmJob],
    previous: Mapping[int, float],
    now: float,
) -> dict[int, float]:
    """The ``absent_since`` to pass to :func:`plan`, after a successful listing: each job
    id a pod's plan names that the listing lacks, with the first time it was missed."""
    listed = {j.job_id for j in jobs}
    named = {m.planned_job for ms in groups.values() for m in ms if m.planned_job is not None}
    return {jid: previous.get(jid, now) for jid in sorted(named - listed)}


@dataclass
class _Pass:
    """What one pass reads, and the actions it collects in the order they are carried out."""

    jobs: Mapping[int, SlurmJob]
    nodes: Mapping[str, NodeFit]
    sizes: Mapping[GroupKey, int | str]
    requests: Mapping[GroupKey, JobRequest | str]
    absent_since: Mapping[int, float]
    now: float
    held: frozenset[str]
    """Nodes a pod of any group still stands on (running, or terminating after an
    eviction): nobody else is bound there until it is gone, whatever Slurm says."""
    stops: list[Action] = field(default_factory=list)
    evicts: list[Action] = field(default_factory=list)
    binds: list[Action] = field(default_factory=list)
    rejects: list[Action] = field(default_factory=list)
    submits: list[tuple[int, str, Submit]] = field(default_factory=list)


def plan(
    groups: Mapping[GroupKey, Sequence[Member]],
    sizes: Mapping[GroupKey, int | str],
    requests: Mapping[GroupKey, JobRequest | str],
    jobs: Sequence[SlurmJob],
    nodes: Mapping[str, NodeFit],
    absent_since: Mapping[int, float],
    now: float,
    *,
    submit_limit: int = DEFAULT_SUBMIT_LIMIT,
) -> list[Action]:
    """The whole decision of one pass (the rules are in the module's docstring).

    Actions come in the order to carry them out: cancels and requeues, evictions, plans
    each followed by its group's binds, rejections, then submissions (highest pod
    priority first). A node missing from ``nodes`` is unfit.
    """
    by_key: dict[GroupKey, list[SlurmJob]] = {}
    for j in jobs:
        by_key.setdefault(j.key, []).append(j)
    held = frozenset(
        m.node for ms in groups.values() for m in ms if m.node and (m.live or m.deleting)
    )
    p = _Pass({j.job_id: j for j in jobs}, nodes, sizes, requests, absent_since, now, held)
    for key in sorted(set(groups) | set(by_key)):
        _group(p, key, list(groups.get(key, ())), by_key.get(key, []))
    p.submits.sort(key=lambda s: (-s[0], s[1]))
    submits = [s for _, _, s in p.submits[: max(submit_limit, 0)]]
    return [*p.stops, *p.evicts, *p.binds, *p.rejects, *submits]


def _group(p: _Pass, key: GroupKey, members: list[Member], jobs: list[SlurmJob]) -> None:
    live = [m for m in members if m.live]
    active = [j for j in jobs if not j.ended]
    kept = _keep(active, members)
    for j in active:
        if j is not kept:
            other = kept.job_id if kept is not None else "?"
            p.stops.append(Cancel(j.job_id, f"a duplicate of job {other} for {key.tag}"))
    if not live:
        leaving = kept is not None and kept.word in LEAVING_STATES
        if kept is not None and not leaving and not any(m.deleting for m in members):
            p.stops.append(Cancel(kept.job_id, f"no pod of {key.tag} is pending or running"))
        return
    maybe_alive = False
    for m in live:
        if m.bound and m.planned_job is not None:
            why = _gone(m, p.jobs.get(m.planned_job), kept, p.absent_since, p.now)
            if why:
                p.evicts.append(Evict(_pod(key, m), why))
        if m.planned_job is not None and m.planned_job not in p.jobs:
            t = p.absent_since.get(m.planned_job)
            maybe_alive = maybe_alive or t is None or p.now - t < ABSENT_GRACE_S
    if kept is not None:
        if kept.word == RUNNING:
            _place(p, key, kept, members)
        return
    if maybe_alive:
        return
    _submit(p, key, live)


def _keep(active: list[SlurmJob], members: Sequence[Member]) -> SlurmJob | None:
    """Of a key's jobs that are not ended, the one to keep: the one most pods are planned
    for, else the oldest."""
    if not active:
        return None
    planned = [m.planned_job for m in members if m.live]
    return min(active, key=lambda j: (-planned.count(j.job_id), j.job_id))


def _gone(
    m: Member,
    job: SlurmJob | None,
    kept: SlurmJob | None,
    absent_since: Mapping[int, float],
    now: float,
) -> str:
    """Why a pod bound under its planned job must be evicted ('' when it stays)."""
    jid = m.planned_job
    if job is None:
        t = absent_since.get(jid) if jid is not None else None
        if t is not None and now - t >= ABSENT_GRACE_S:
            return f"Slurm job {jid} is gone: two listings {ABSENT_GRACE_S:.0f} s apart lack it"
        return ""
    if job.ended:
        reason = f" ({job.reason})" if job.reason and job.reason != "None" else ""
        return f"Slurm job {jid} ended: {job.word}{reason}"
    if kept is not None and job.job_id != kept.job_id:
        return ""  # a duplicate being cancelled: its pods are evicted once it has ended
    if job.word in LEAVING_STATES:
        return f"Slurm job {jid} is {job.word}: its allocation is ending"
    if job.word == SUSPENDED:
        return f"Slurm job {jid} is SUSPENDED (preempted or held by an administrator)"
    if m.node not in job.nodes:
        if not job.nodes:
            return f"Slurm job {jid} is {job.word} again (requeued): its allocation is gone"
        return f"Slurm job {jid} no longer holds node {m.node}"
    return ""


def _pod(key: GroupKey, m: Member) -> str:
    """How actions name a pod: ``namespace/name`` (the group's namespace is the pod's)."""
    return f"{key.namespace}/{m.name}"


def _place(p: _Pass, key: GroupKey, job: SlurmJob, members: Sequence[Member]) -> None:
    """Give the group's unbound pods the running job's free nodes, all or none: only
    when they make the group whole (with its pods already running under the job)."""
    allocation = sorted(set(job.nodes))
    if not allocation:
        return
    free = [n for n in allocation if n not in p.held]
    waiting = ordered(m for m in members if m.live and not m.bound)
    if not waiting or len(waiting) > len(free):
        return  # nothing to bind, or a pod still leaving its node: wait
    running = sum(
        1 for m in members if m.live and m.planned_job == job.job_id and m.node in allocation
    )
    size = p.sizes.get(key)
    if not isinstance(size, int) or running + len(waiting) < size:
        return  # a gang never starts short: wait for the owner's missing pods
    fit = [n for n in free if p.nodes.get(n, NodeFit(n, False)).fit]
    if len(fit) < len(waiting):
        unfit = [n for n in free if n not in fit]
        whys = "; ".join(f"{n}: {p.nodes[n].why if n in p.nodes else 'not found'}" for n in unfit)
        why = f"nodes of the allocation are not fit ({whys})"
        p.stops.append(Requeue(job.job_id, why, tuple(unfit)))
        return
    assigned: dict[str, str] = {}
    taken: set[str] = set()
    for m in waiting:
        if m.planned_job == job.job_id and m.planned_node in fit and m.planned_node not in taken:
            assigned[m.name] = m.planned_node
            taken.add(m.planned_node)
    rest = iter(n for n in fit if n not in taken)
    for m in waiting:
        if m.name not in assigned:
            assigned[m.name] = next(rest)
    pairs = tuple((_pod(key, m), assigned[m.name]) for m in waiting)
    if any(m.planned_job != job.job_id or m.planned_node != assigned[m.name] for m in waiting):
        p.binds.append(Plan(job.job_id, pairs))
    p.binds.extend(Bind(pod, node) for pod, node in pairs)


def _submit(p: _Pass, key: GroupKey, live: Sequence[Member]) -> None:
    waiting = ordered(m for m in live if not m.bound)
    size, req = p.sizes.get(key), p.requests.get(key)
    if not waiting or size is None or req is None:
        return
    pods = tuple(_pod(key, m) for m in waiting)
    if isinstance(size, str):
        p.rejects.append(Reject(pods, INVALID, size))
        return
    if isinstance(req, str):
        p.rejects.append(Reject(pods, INVALID, req))
        return
    if len(waiting) > size:
        p.rejects.append(
            Reject(pods, INVALID, f"{len(waiting)} pods are pending in a group of {size}")
        )
        return
    if len(waiting) < size:
        return  # the owner has not made every pod yet
    p.submits.append((max(m.priority for m in waiting), key.tag, Submit(req)))
