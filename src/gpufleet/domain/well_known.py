"""Names that are part of gpufleet's API: labels, annotations, taints,
conditions and Slurm reasons. Each says who sets it.

Kept in ``domain`` because the agent, the controllers and the syncer must
agree on them and may not import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpufleet.domain.subsystems import Subsystem

GROUP = "gpufleet.io"
VERSION = "v1alpha1"

LABEL_STATE = "gpufleet.io/state"
"""Node label, set by the lifecycle controller: the NodeState value."""
LABEL_POOL = "gpufleet.io/pool"
"""Node label, set by provisioning or an admin: the node pool (budget scope)."""
LABEL_HOSTNAME = "kubernetes.io/hostname"
"""Node label, set by the kubelet: the node's hostname (a simulated node carries it, with
its pool, for FleetPolicy overrides to select on)."""
LABEL_SPARE = "gpufleet.io/spare"
"""Node label, set by the lifecycle controller: ``"true"`` on a hot spare (a verified
node in production kept out of training work until it is promoted; domain.spares)."""
TAINT_SPARE = "gpufleet.io/spare"
"""Taint (NoSchedule), set by the lifecycle controller on a hot spare: no new
Kubernetes work lands on it until it is promoted (it is removed then)."""

LABEL_NVLINK_CLUSTER = "gpufleet.io/nvlink-cluster"
"""Node label, set by the node agent on multi-node NVLink nodes (GB200 NVL72): the
NVLink cluster UUID the node's GPUs registered with (removed elsewhere)."""
LABEL_NVLINK_CLIQUE = "gpufleet.io/nvlink-clique"
"""Node label, set by the node agent on multi-node NVLink nodes:
``<cluster UUID>.<clique id>``, the NVLink partition the node's GPUs share; nodes
with the same value reach each other over NVLink (topology-aware placement)."""
LABEL_IB_SEEN_LEAF = "gpufleet.io/ib-seen-leaf"
"""Node label, set by the node agent: the node GUID (``0x`` and 16 hex digits) of the
InfiniBand switch its rail-0 HCA port is cabled to, as the switch answers a directed-route
query (the node's own view of its leaf, decision 0249; :data:`LABEL_IB_LEAF` is what the
Machine inventory says)."""
LABEL_IB_SEEN_LEAF_NAME = "gpufleet.io/ib-seen-leaf-name"
"""Node label, set by the node agent beside :data:`LABEL_IB_SEEN_LEAF`: that switch's name
from its NodeDescription (absent when the description holds no usable name)."""

ANNOTATION_TOPOLOGY_LABELS = "gpufleet.io/topology-labels"
"""Node annotation, set by the Slurm operator: the topology label keys it wrote for
Kubernetes schedulers (comma-separated), so that it changes or removes only those
(domain.topology, decision 0229)."""

ANNOTATION_RECORD = "gpufleet.io/record"
"""Node annotation, set by the lifecycle controller: the NodeRecord as JSON."""
ANNOTATION_REASON = "gpufleet.io/reason"
"""Node annotation, set by the lifecycle controller: why the node is in its state."""
ANNOTATION_CORDONED = "gpufleet.io/cordoned-by"
"""Node annotation, set by the lifecycle controller when *it* cordoned the node.
Without it, a cordon belongs to someone else and is never cleared by gpufleet."""
ANNOTATION_BMC_SECRET = "gpufleet.io/bmc-secret"
"""Node annotation, set by provisioning or an admin: ``<namespace>/<name>`` of the
Secret with the node's BMC (keys ``endpoint``, ``username``, ``password``)."""
ANNOTATION_BMC_ACTION = "gpufleet.io/bmc-action"
"""Node annotation, set by the lifecycle controller *before* each BMC reset POST:
the write-ahead mark (JSON: step, attempt, the attempt's startedAt, resetType,
the BMC's baseline -- LastResetTime, log, power state -- and postedAt;
:class:`gpufleet.remediate.evidence.ActionMark`). A restarted controller reads
it to tell a reset that was never posted from one whose answer was lost, so a
ladder attempt ends in at most one reset (docs/decisions/0072)."""
ANNOTATION_RECORD_SIGNATURE = "gpufleet.io/record-signature"
"""Node annotation, set by the lifecycle controller with every record it writes:
``v1:<key id>:<HMAC-SHA256>`` over the node's name and the record, keyed by a
Secret only the controller reads. A record without a valid one was not written
by the controller and is not acted on (:mod:`gpufleet.api.nodedata`,
docs/decisions/0144)."""
ANNOTATION_BMC_ACTION_SIGNATURE = "gpufleet.io/bmc-action-signature"
"""Node annotation, written with :data:`ANNOTATION_BMC_ACTION` by the gate: its
signature, as for the record."""
ANNOTATION_SLURM_PROBE = "gpufleet.io/slurm-probe"
"""Node annotation, set by the gate right before a disruptive act: a challenge
(JSON: id, at, incident) the Slurm syncer answers with a report read from Slurm
after it saw it (:data:`ANNOTATION_SLURM_WORK` with the same ``probe``), so the
act is judged on what Slurm says now, not on a report taken before the drain
(docs/decisions/0145)."""
CONDITION_BMC_MISMATCH = "GpufleetBmcMismatch"
"""Node condition, set by the lifecycle controller: ``True`` when the BMC the
Node's ``gpufleet.io/bmc-secret`` points at could not be verified as this
node's machine (serial, UUID or host name; docs/decisions/0073) and no power
action was taken; ``False`` once a later check verified it."""
ANNOTATION_REMEDIATION = "gpufleet.io/remediation"
"""Node annotation, set by the lifecycle controller: the name of the node's
current NodeRemediation object."""
ANNOTATION_LEMON_SCORE = "gpufleet.io/lemon-score"
"""Node annotation, set by the lifecycle controller: the node's lemon score
(``2.41``) as of the last write of its record (the score decays; ``gpufleet nodes``
shows today's value); absent while no fault was counted."""
ANNOTATION_LEMON_GPUS = "gpufleet.io/lemon-gpus"
"""Node annotation, set by the lifecycle controller: the GPUs with a lemon score,
highest first (``gpu3=1.90,gpu0=0.51``), as of the same write."""
ANNOTATION_FAULTS_SEEN = "gpufleet.io/faults-seen"
"""Node annotation, set by the lifecycle controller: per problem condition type,
the time of the latest occurrence already fed to ``decide`` (JSON), so a
condition that stays ``True`` is not replayed as a new fault."""
CONTROLLER = "gpufleet-controller"
"""The value of :data:`ANNOTATION_CORDONED` and the Event source of the lifecycle controller."""
AGENT = "gpufleet-agent"
"""The Event source (``reportingComponent``) and field manager of the node agent."""
ANNOTATION_INTERRUPTIBLE = "gpufleet.io/interruptible"
"""Pod annotation, set by users: "true" means the pod may be evicted at once."""
ANNOTATION_SLURM_STATE = "gpufleet.io/slurm-state"
"""Node annotation, set by the Slurm syncer: the Slurm state and reason of
drains and DOWN states that gpufleet does not own."""

ANNOTATION_SLURM_WORK = "gpufleet.io/slurm-work"
"""Node annotation, set by the Slurm syncer on nodes Kubernetes wants out of
service: what Slurm reports about the node (state, running jobs, the incident
it was read for) as JSON (:class:`gpufleet.domain.emptiness.SlurmWork`). The
lifecycle controller disrupts a Slurm node only once this says drained and idle."""

TAINT_UNHEALTHY = "gpufleet.io/unhealthy"
"""Taint, set by the lifecycle controller on a faulted node (NoSchedule or NoExecute)."""
TAINT_UNVERIFIED = "gpufleet.io/unverified"
"""Taint, set by the lifecycle controller during burn-in and verification (NoSchedule)."""
OWNED_TAINTS = (TAINT_UNHEALTHY, TAINT_UNVERIFIED)

CONDITIONS: Mapping[Subsystem, str] = MappingProxyType(
    {
        Subsystem.GPU: "GpuProblem",
        Subsystem.NVLINK: "NvlinkProblem",
        Subsystem.INFINIBAND: "InfinibandProblem",
        Subsystem.PCIE: "PcieProblem",
        Subsystem.KERNEL: "KernelProblem",
        Subsystem.THERMAL: "ThermalProblem",
        Subsystem.PERFORMANCE: "PerformanceProblem",
        Subsystem.NVSWITCH: "NvswitchProblem",
        Subsystem.FABRIC: "FabricProblem",
        Subsystem.SLURM: "SlurmHealthProblem",
    }
)
"""Node condition types, one per subsystem; status "True" means a problem
(Node-Problem-Detector convention). The agent sets all but ``SlurmHealthProblem``,
which the Slurm syncer sets for a foreign drain the policy calls hardware."""

CONDITION_REQUEST = "GpufleetRequest"
"""Former Node condition of the agent's answer to a request, now the annotation
:data:`ANNOTATION_AGENT_RESULT`; still read from a node whose agent is older
(:mod:`gpufleet.domain.node_reports`). ``True`` meant the request failed."""

ANNOTATION_AGENT_RESULT = "gpufleet.io/agent-result"
"""Node annotation, set by the agent (through the status subresource): its answer to
the last request, JSON ``{"id", "outcome", "detail"}`` (domain.node_reports)."""

ANNOTATION_DOMAIN_BURN_IN = "gpufleet.io/domain-burn-in"
"""Node annotation on every tray of an NVLink domain, set by ``gpufleet burn-in domain``:
the domain burn-in's last verdict, JSON ``{"domain", "passed", "at", "reason", "bad"}``
(domain.domain_burnin, decision 0246)."""

ANNOTATION_AGENT_REQUEST = "gpufleet.io/agent-request"
"""Node annotation, set by the lifecycle controller: what the node's agent must
do next (run a check profile, reset a GPU), as JSON (domain.conditions)."""

CONDITION_SLURM = "SlurmUnavailable"
"""Node condition, set by the Slurm syncer when Slurm holds the node out
(drain or DOWN) for a reason gpufleet does not own."""

SLURM_REASON_PREFIX = "gpufleet:"
"""Prefix of every Slurm drain reason gpufleet sets; other drains are not ours."""


def slurm_reason(text: str) -> str:
    """A Slurm drain reason owned by gpufleet."""
    return f"{SLURM_REASON_PREFIX} {text}"


def is_owned_slurm_reason(reason: str | None) -> bool:
    """Whether a Slurm drain reason was set by gpufleet."""
    return bool(reason) and str(reason).startswith(SLURM_REASON_PREFIX)


TAINT_SLURM = "gpufleet.io/slurm"
"""Taint (NoSchedule), set by the Slurm syncer on nodes of a SlurmCluster:
value ``held`` while Slurm owns the node's GPUs, ``lent`` while the node is
locked for a Kubernetes Pod (the syncer binds that Pod itself)."""
ANNOTATION_LENT_TO = "gpufleet.io/lent-to"
"""Node annotation, set by the Slurm syncer: ``<namespace>/<pod>`` the node is
lent to (preemption); removed, and the node returned to Slurm, when the Pod is gone."""
ANNOTATION_SLURM_STUCK_JOBS = "gpufleet.io/slurm-unrequeueable"
"""Node annotation, set by the Slurm syncer: ids of jobs that had to leave the
node but cannot be requeued (``--no-requeue``); they are reported, never killed."""
ANNOTATION_SLURM_NOTICES = "gpufleet.io/slurm-notices"
"""Node annotation, set by the Slurm syncer before it sends a departure notice:
``<job>=<epoch seconds>,...``, the jobs noticed and when (domain.departure); an
entry goes once its job is requeued, or forgotten once the node need not be emptied."""
LABEL_SLURM_CLUSTER = "gpufleet.io/slurm-cluster"
"""Node label, set by the SlurmCluster operator: ``<namespace>.<name>`` of the
SlurmCluster whose slurmd runs on the node."""

# --- Day 0: provisioning (gpufleet.provision, docs/provisioning.md) -----------------

MACHINE_PLURAL = "machines"
"""Plural of the ``Machine`` custom resource (cluster-scoped): one physical server's
inventory record (MACs, serial, BMC, pool, expected hardware) and its boot status."""
LABEL_MACHINE = "gpufleet.io/machine"
"""Node label, set by the node itself from the cloud-init provisioning serves (and
on the bootstrap-token Secret issued for that machine): the name of its Machine."""
LABEL_MAC_PREFIX = "mac.gpufleet.io/"
"""Machine label key prefix, set by ``gpufleet machines import``: one label
``mac.gpufleet.io/<12 lower-case hex digits>`` per MAC, so a booting MAC is found
with one label-selector query."""
LABEL_IB_LEAF = "gpufleet.io/ib-leaf"
"""Node label, set from the Machine's inventory at boot: its InfiniBand leaf switch."""
LABEL_IB_BLOCK = "gpufleet.io/ib-block"
"""Node label, set from the Machine's inventory at boot: its InfiniBand block."""
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
"""Node label (NVIDIA GPU feature discovery's key): the GPU model, set at boot from
the Machine's inventory."""
CONDITION_HARDWARE = "GpufleetHardware"
"""Former Node condition of the hardware the agent observes, now the annotation
:data:`ANNOTATION_HARDWARE`; still read from a node whose agent is older."""
ANNOTATION_HARDWARE = "gpufleet.io/hardware"
"""Node annotation, set by the agent (through the status subresource): the hardware it
observes, GPU model and count and InfiniBand HCA count (domain.inventory's encoding)."""
PROVISIONER = "gpufleet-provision"
"""The Event source of the provisioning service (audit Events on Machines)."""

# --- Operator requests (gpufleet node VERB, gpufleet breaker reset; docs/operations.md) ---

ANNOTATION_OPERATOR_REQUEST = "gpufleet.io/operator-request"
"""Node annotation, set by ``gpufleet node return|triage|rma|maintenance|dismiss``:
a person's request as JSON ``{verb, reason, by, at, id}``
(:class:`gpufleet.domain.operator.OperatorRequest`). The CLI never changes the
node itself: the lifecycle controller decides the request like any other event
(the state table, pause, dry-run and the budget apply), answers with a Node Event
``OperatorRequest`` (accepted or refused, and why) and removes the annotation in
the same guarded write that stores the record."""
ANNOTATION_BREAKER_RESET = "gpufleet.io/breaker-reset"
"""FleetPolicy annotation, set by ``gpufleet breaker reset``: ``{at, by, reason, id}``
as JSON. The lifecycle controller closes the circuit breaker, saves the FleetPolicy
status, posts an Event on the FleetPolicy and removes the annotation."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
"""Label on objects the lifecycle controller creates (NodeRemediations), value
:data:`CONTROLLER`: ``gpufleet status`` counts only those (with the Node pointing
back through :data:`ANNOTATION_REMEDIATION`) as gpufleet's remediations."""

# --- The RMA hand-off (docs/operations.md "RMA tickets", decisions 0108, 0109) ---

ANNOTATION_RMA_TICKET = "gpufleet.io/rma-ticket"
"""Node annotation, set by the lifecycle controller only: the ticket opened for the node's
hand-off to people (triage, rma) as JSON (:class:`gpufleet.domain.rma.Ticket`): its key,
state (opening, open, updating, closing, closed), attempts, next attempt time, the receiver's ticket
id and the evidence ConfigMap. Written before every webhook call."""
ANNOTATION_RMA_CLOSE = "gpufleet.io/rma-close"
"""Node annotation, set by ``gpufleet machines rearm``: ``{by, reason, at}`` as JSON, the
hardware was replaced; the lifecycle controller closes the node's ticket and removes it."""
LABEL_EVIDENCE = "gpufleet.io/evidence"
"""Label on the evidence ConfigMaps the lifecycle controller stores (value ``rma``)."""
LABEL_EVIDENCE_NODE = "gpufleet.io/node"
"""Label on an evidence ConfigMap: the Node it is about."""
ANNOTATION_IMAGE_VERSION = "gpufleet.io/image-version"
"""Node annotation, set by the lifecycle controller when a MaintenancePlan's reimage of
the node was verified: the image version the plan asked for (domain.maintenance)."""

# --- Slurm schedules Kubernetes pods (gpufleet pod-scheduler, decision 0257) ---

POD_SCHEDULER_NAME = "gpufleet-slurm"
"""The ``spec.schedulerName`` of pods that Slurm schedules: kube-scheduler leaves them
alone, ``gpufleet pod-scheduler`` submits one Slurm job per pod group and binds them."""
LABEL_POD_GROUP = "gpufleet.io/pod-group"
"""Pod label, set by the user: the name of an explicit pod group (one Slurm job); it
needs :data:`ANNOTATION_POD_GROUP_SIZE` and wins over the owners' labels."""
ANNOTATION_POD_GROUP_SIZE = "gpufleet.io/pod-group-size"
"""Pod annotation, set by the user beside :data:`LABEL_POD_GROUP`: how many pods the
group has (a positive integer; the group is submitted when that many are pending)."""
ANNOTATION_SLURM_JOB = "gpufleet.io/slurm-job"
"""Pod annotation, set by the pod scheduler before it binds the pod: the id of the
Slurm job whose allocation the pod runs in (the plan; a restarted scheduler reads it)."""
ANNOTATION_SLURM_NODE = "gpufleet.io/slurm-node"
"""Pod annotation, set by the pod scheduler with :data:`ANNOTATION_SLURM_JOB`: the node
of that allocation the pod is bound to."""
SLURM_POD_ANNOTATION_PREFIX = "slurm.gpufleet.io/"
"""Prefix of the pod (else namespace) annotations, set by the user, that say how the
pod group's Slurm job is submitted: ``partition``, ``account``, ``qos``, ``priority``,
``time-limit`` (minutes) and ``gpu-type`` (the GRES type)."""
POD_JOB_COMMENT_PREFIX = "gpufleet-pods:"
"""The start of the comment of every Slurm job the pod scheduler submits, followed by
the pod group's key (domain.pod_groups.GroupKey.tag): the only jobs it cancels or
requeues."""
