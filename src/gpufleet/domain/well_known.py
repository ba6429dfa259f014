"""Names that are part of gpufleet's API: labels, annotations, taints,
conditions and Slurm reasons. Each says who sets it.

Kept in ``domain`` because the agent, the controllers and the syncer must
agree on them and may not import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpufleet.domain.faults import Subsystem

GROUP = "gpufleet.io"
VERSION = "v1alpha1"

LABEL_STATE = "gpufleet.io/state"
"""Node label, set by the lifecycle controller: the NodeState value."""
LABEL_POOL = "gpufleet.io/pool"
"""Node label, set by provisioning or an admin: the node pool (budget scope)."""

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
ANNOTATION_REMEDIATION = "gpufleet.io/remediation"
"""Node annotation, set by the lifecycle controller: the name of the node's
current NodeRemediation object."""
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
    }
)
"""Node condition types, set by the agent, one per subsystem; status "True"
means a problem (Node-Problem-Detector convention)."""

CONDITION_REQUEST = "GpufleetRequest"
"""Node condition, set by the agent: the result of the last agent request
(see :mod:`gpufleet.domain.conditions`). ``True`` means the request failed."""

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
"""Node condition, set by the agent: the hardware it observes (GPU model and count,
InfiniBand HCA count) in its message (:mod:`gpufleet.domain.inventory`). Status
``False`` (no problem, Node-Problem-Detector convention) once observed."""
PROVISIONER = "gpufleet-provision"
"""The Event source of the provisioning service (audit Events on Machines)."""
