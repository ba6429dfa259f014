"""``SlurmCluster``: a Slurm cluster on Kubernetes, its spec model and CRD.

The pydantic model is the single schema: the CRD's OpenAPI schema is
generated from it (:mod:`gpufleet.api.crds`), and the operator validates
objects with the same model. The CRD keeps the model's defaults, so the
apiserver fills them in and ``kubectl get -o yaml`` shows the effective spec.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gpufleet.api.names import SLURM_CLUSTER
from gpufleet.api.schema import AGE, CONDITIONS, Json, column, crd, structural

NAMES = SLURM_CLUSTER
KIND = NAMES.kind
PLURAL = NAMES.plural

# Every string the operator writes into slurm.conf or gres.conf is held to one
# of these patterns, in the CRD (the apiserver refuses the object) and again by
# the renderer (gpufleet.slurm.render): no control character (a newline would
# start a new directive), no space (a new key=value), no '#' (a comment) and
# no '=' in a value. The patterns are plain RE2 and Python syntax alike.
WORD = r"^[A-Za-z0-9_.-]+$"
"""Names, gres types, features: one Slurm token."""
HOST = r"^[A-Za-z0-9_.:-]+$"
"""Host names and IP addresses (':' for IPv6)."""
VALUE = r"^[A-Za-z0-9_./,:\[\]-]+$"
"""Paths with ranges (``/dev/nvidia[0-7]``), times (``1-00:00:00``), option lists."""
LINE = r"^[^\x00-\x1f\x7f]*$"
"""One line of ``extraConfig``: anything but a control character."""
LABEL_KEY = r"^([A-Za-z0-9][A-Za-z0-9.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""A Kubernetes label key (prefix/name)."""
POOL = r"^[a-z0-9][a-z0-9-]*$"
"""A node pool's name, where it is defined and where a partition names it."""
MAX_POOLS = 32
"""Node pools, partitions, and pools per partition: the apiserver checks that every pool
a partition names is defined (a CEL rule whose cost grows with these lists' bounds)."""

Word = Annotated[str, Field(pattern=WORD, max_length=63)]
PoolName = Annotated[str, Field(pattern=POOL, max_length=40)]
LabelKey = Annotated[str, Field(pattern=LABEL_KEY, max_length=316)]
OptionalLabelKey = Annotated[
    str,
    Field(pattern=r"^(|([A-Za-z0-9][A-Za-z0-9.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*)$", max_length=316),
]
"""A label key, or '' for none."""


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class NodePool(_Model):
    """Kubernetes Nodes that become Slurm nodes with one shape."""

    name: PoolName = Field(
        description="The pool's name, as partitions name it (spec.partitions[].pools)."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels that select the pool's Nodes."
    )
    cpus: int = Field(default=64, ge=1, description="CPUs per node announced to Slurm (CPUs=).")
    real_memory_mib: int = Field(
        default=512 * 1024,
        ge=1,
        description="Memory per node announced to Slurm, in MiB (RealMemory=).",
    )
    gpus: int = Field(default=8, ge=0, description="GPUs per node, announced as gres gpu.")
    gpu_type: str | None = Field(
        default=None,
        pattern=WORD,
        max_length=63,
        description="gres type, e.g. h100 -> gpu:h100:8.",
    )
    gpu_files: str = Field(
        default="/dev/nvidia[0-7]",
        pattern=VALUE,
        max_length=255,
        description="gres.conf File= for the GPUs.",
    )
    features: list[Word] = Field(default_factory=list, description="Static node features.")
    feature_labels: list[LabelKey] = Field(
        default_factory=lambda: ["nvidia.com/gpu.product"],
        description="Node label keys whose values become node features.",
    )


class Partition(_Model):
    """A Slurm partition over one or more node pools."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="The partition's name in Slurm.")
    pools: list[PoolName] = Field(
        min_length=1,
        max_length=MAX_POOLS,
        description="Node pools (spec.nodePools names) whose Nodes the partition holds.",
    )
    default: bool = Field(
        default=False, description="The partition jobs go to when they name none (Default=YES)."
    )
    priority_tier: int = Field(
        default=1,
        ge=0,
        le=65533,
        description="PriorityTier: jobs of a higher tier are scheduled first and may preempt "
        "lower tiers (with preemption.type preempt/partition_prio).",
    )
    preempt_mode: Literal["OFF", "REQUEUE", "CANCEL", "SUSPEND"] = Field(
        default="REQUEUE", description="What happens to this partition's jobs when preempted."
    )
    max_time: str = Field(
        default="INFINITE",
        pattern=VALUE,
        max_length=32,
        description="MaxTime: the longest a job may run (Slurm's time format, e.g. 1-00:00:00).",
    )


class Preemption(_Model):
    """Which jobs may preempt which (Slurm), and when Kubernetes pods may take nodes from Slurm."""

    type: Literal["preempt/partition_prio", "preempt/qos", "preempt/none"] = Field(
        default="preempt/partition_prio", description="Slurm's PreemptType."
    )
    mode: Literal["OFF", "REQUEUE", "CANCEL", "SUSPEND,GANG"] = Field(
        default="REQUEUE",
        description="Slurm's PreemptMode: what happens to a preempted job (REQUEUE: it runs "
        "again from its last checkpoint).",
    )
    kubernetes_priority_threshold: int | None = Field(
        default=1_000_000,
        description="Pods at or above this priority may take nodes from Slurm; null disables.",
    )


class Accounting(_Model):
    """Slurm accounting through slurmdbd (docs/slurm.md)."""

    enabled: bool = Field(default=False, description="Send job records to slurmdbd.")
    host: str = Field(
        default="slurmdbd", pattern=HOST, max_length=253, description="slurmdbd's host name."
    )
    port: int = Field(default=6819, description="slurmdbd's port.")
    enforce_limits: bool = Field(
        default=False,
        description=(
            "Enforce associations, their limits and QOS (AccountingStorageEnforce="
            "associations,limits,qos,safe): tenants' GPU quotas apply in Slurm; every user "
            "who submits needs an association (an account)."
        ),
    )


class SchedulerLabels(_Model):
    """Node labels for Kubernetes topology-aware schedulers (Kueue TAS, KAI): one key per
    level, written by the operator from the same topology as Slurm's (docs/slurm.md)."""

    enabled: bool = Field(
        default=False,
        description="Write the per-level topology labels on the cluster's Nodes.",
    )
    spine: OptionalLabelKey = Field(
        default="gpufleet.io/topology-spine", description="Key for the spine ('' : not written)."
    )
    leaf: OptionalLabelKey = Field(
        default="gpufleet.io/topology-leaf",
        description="Key for the leaf switch ('' : not written).",
    )
    block: OptionalLabelKey = Field(
        default="gpufleet.io/topology-block", description="Key for the block ('' : not written)."
    )
    nvlink_domain: OptionalLabelKey = Field(
        default="gpufleet.io/topology-nvlink-domain",
        description="Key for the NVLink domain ('' : not written).",
    )


class Topology(_Model):
    """Slurm's network topology from Node labels (tree: spine over leaf switches; block:
    NVLink domains or labelled blocks), so jobs get nodes under as few switches as
    possible, and the same topology as Node labels for Kubernetes schedulers."""

    enabled: bool = Field(default=True, description="Write the topology from the labels.")
    plugin: Literal["tree", "block"] = Field(
        default="tree",
        description="topology/tree (switches) or topology/block (blocks: Slurm 23.11+).",
    )
    file: Literal["topology.conf", "topology.yaml"] = Field(
        default="topology.conf",
        description="topology.conf (TopologyPlugin in slurm.conf; every Slurm) or "
        "topology.yaml (read by Slurm 25.05 and later only; 24.11 ignores it).",
    )
    block_sizes: list[Annotated[int, Field(ge=1, le=100000)]] = Field(
        default_factory=list,
        max_length=16,
        description="Slurm's BlockSizes (node counts a job's allocation is planned in); "
        "empty: Slurm's default (the smallest block).",
    )
    leaf_label: LabelKey = Field(
        default="network.topology.kubernetes.io/block",
        description="The Node label whose value names the node's leaf switch.",
    )
    spine_label: LabelKey = Field(
        default="network.topology.kubernetes.io/spine",
        description="The Node label whose value names the spine above that leaf.",
    )
    block_label: OptionalLabelKey = Field(
        default="",
        description="The Node label whose value names the node's Slurm block; '': the "
        "node's NVLink domain is its block.",
    )
    nvlink_domain_label: OptionalLabelKey = Field(
        default="network.topology.nvidia.com/accelerator",
        description="The Node label an operator or Topograph sets to the NVLink domain; "
        "checked against what the node's agent reports (gpufleet.io/nvlink-clique).",
    )
    scheduler_labels: SchedulerLabels = Field(default_factory=SchedulerLabels)


PrivateKind = Literal["accounts", "jobs", "usage", "users"]


def _all_private() -> list[PrivateKind]:
    return ["accounts", "jobs", "usage", "users"]


class Isolation(_Model):
    """What one Slurm user sees of another's work, and each job's private /tmp
    (docs/tenants.md, Isolation; decision 0286)."""

    private_data: list[PrivateKind] = Field(
        default_factory=_all_private,
        description="PrivateData: what each user sees only of their own in squeue, sacct, "
        "sreport and sacctmgr (root and SlurmUser see all). Empty: everyone sees everything.",
    )
    job_tmpfs: bool = Field(
        default=False,
        description="JobContainerType=job_container/tmpfs (with PrologFlags=Contain): each "
        "job its own /tmp and /dev/shm, removed when it ends.",
    )
    job_tmpfs_base_path: str = Field(
        default="/var/spool/slurmd/job-tmp",
        pattern=r"^/[A-Za-z0-9_./-]*$",
        max_length=256,
        description="Where jobs' private /tmp directories live on each node (made by slurmd).",
    )

    @model_validator(mode="after")
    def _base_path_outside_private_dirs(self) -> Self:
        """Under /tmp the base path is hidden by the job's own /tmp as soon as it is
        mounted: slurmstepd then fails every job on the node (seen with Slurm 24.11)."""
        path = self.job_tmpfs_base_path.rstrip("/") + "/"
        for private in ("/tmp/", "/dev/shm/"):
            if path.startswith(private):
                raise ValueError(
                    f"jobTmpfsBasePath {self.job_tmpfs_base_path!r} is under {private}, which "
                    "each job gets its own of: choose a node-local path elsewhere"
                )
        return self


class HealthChecks(_Model):
    """``gpufleet health check`` as Slurm's HealthCheckProgram, Prolog and Epilog
    (docs/slurm.md, "Slurm's own health checks"): the slurmd image needs gpufleet."""

    enabled: bool = Field(
        default=False, description="Render gpufleet's health check hooks into slurm.conf."
    )
    gpufleet: str = Field(
        default="/usr/local/bin/gpufleet",
        pattern=VALUE,
        max_length=256,
        description="The gpufleet executable in the slurmd image.",
    )
    checks: list[Word] = Field(
        default_factory=lambda: ["gpu-count", "gpu-xid", "gpu-memory", "nvlink", "pcie"],
        description="Checks run by each hook (fast passive ones: a prolog runs per job).",
    )
    timeout_seconds: int = Field(
        default=20, ge=1, le=120, description="Seconds each hook may run before it is stopped."
    )
    health_interval_seconds: int = Field(
        default=300, ge=0, le=86400, description="HealthCheckInterval; 0: no HealthCheckProgram."
    )
    prolog: bool = Field(default=True, description="Run the checks as Prolog (before each job).")
    epilog: bool = Field(default=True, description="Run the checks as Epilog (after each job).")
    preflight: bool = Field(
        default=False, description="Gang all-reduce across a multi-node job's nodes (prolog)."
    )
    preflight_timeout_seconds: int = Field(
        default=30, ge=5, le=120, description="Seconds the preflight all-reduce may take."
    )


class SlurmClusterSpec(_Model):
    """The Slurm cluster the operator renders slurm.conf, gres.conf and topology.conf for."""

    cluster_name: str = Field(
        default="gpufleet",
        pattern=r"^[a-z0-9_-]+$",
        max_length=40,
        description="Slurm's ClusterName (also the accounting cluster's name).",
    )
    controller_host: str = Field(
        default="slurm-controller-0",
        pattern=HOST,
        max_length=253,
        description="slurmctld host name (the StatefulSet pod).",
    )
    controller_address: str = Field(
        default="",
        pattern=r"^([A-Za-z0-9_.:-]+)?$",
        max_length=253,
        description="Where slurmd, slurmrestd and the clients reach slurmctld when its host "
        "name does not resolve by itself: a StatefulSet pod resolves as <pod>.<service> "
        "(cluster DNS), not as <pod>. Empty: the host name.",
    )
    backup_controller_host: str = Field(
        default="",
        pattern=r"^([A-Za-z0-9_.:-]+)?$",
        max_length=253,
        description="A backup slurmctld's host name (the StatefulSet's second pod), a second "
        "SlurmctldHost that takes over when the first stops answering for "
        "slurmctldTimeout; both need the one StateSaveLocation (docs/slurm.md, Controller "
        "failover). Empty: no backup.",
    )
    backup_controller_address: str = Field(
        default="",
        pattern=r"^([A-Za-z0-9_.:-]+)?$",
        max_length=253,
        description="As controllerAddress, for the backup. Empty: its host name.",
    )
    slurmctld_timeout: int = Field(
        default=120,
        ge=5,
        le=65533,
        description="SlurmctldTimeout, with a backup: seconds the backup waits for an "
        "unanswered primary before it takes over (Slurm's default 120).",
    )
    controller_port: int = Field(default=6817, description="slurmctld's port (SlurmctldPort).")
    slurmd_port: int = Field(default=6818, description="slurmd's port (SlurmdPort).")
    node_pools: list[NodePool] = Field(
        min_length=1,
        max_length=MAX_POOLS,
        description="Kubernetes Nodes that become Slurm nodes, one shape per pool.",
    )
    partitions: list[Partition] = Field(
        min_length=1, max_length=MAX_POOLS, description="Slurm partitions over the node pools."
    )
    preemption: Preemption = Field(default_factory=Preemption)
    accounting: Accounting = Field(default_factory=Accounting)
    topology: Topology = Field(default_factory=Topology)
    isolation: Isolation = Field(default_factory=Isolation)
    health_checks: HealthChecks = Field(
        default_factory=HealthChecks,
        description="gpufleet health check as Slurm's HealthCheckProgram, Prolog and Epilog "
        "(docs/slurm.md): the slurmd image needs gpufleet.",
    )
    extra_config: list[Annotated[str, Field(pattern=LINE, max_length=1024)]] = Field(
        default_factory=list,
        description="Lines appended to slurm.conf as they are (one directive each, no newline).",
    )

    @model_validator(mode="after")
    def _partitions_name_pools(self) -> Self:
        """Every pool a partition names is one of ``nodePools`` (the CRD's CEL rule too):
        a name that matches none would give the partition no nodes, silently."""
        pools = [p.name for p in self.node_pools]
        problems = [
            f"nodePools[{i}].name: {name!r} is defined twice"
            for i, name in enumerate(pools)
            if name in pools[:i]
        ]
        for i, part in enumerate(self.partitions):
            problems += [
                f"partitions[{i}].pools[{j}]: {pool!r} is not a node pool of this cluster "
                f"(nodePools: {', '.join(pools)})"
                for j, pool in enumerate(part.pools)
                if pool not in pools
            ]
        if problems:
            raise ValueError("; ".join(problems))
        return self


POOLS_DEFINED_RULE: Json = {
    "rule": "self.partitions.all(p, p.pools.all(n, self.nodePools.exists(q, q.name == n)))",
    "message": "every pool a partition names must be one of spec.nodePools",
    "fieldPath": ".partitions",
    "reason": "FieldValueInvalid",
}
"""The apiserver's copy of :meth:`SlurmClusterSpec._partitions_name_pools` (existence)."""

_COUNT: Json = {"type": "integer"}
STATUS_SCHEMA: Json = {
    "type": "object",
    "description": "Written by the operator: the config it applied and the nodes Slurm has.",
    "properties": {
        "observedGeneration": {
            **_COUNT,
            "description": "The metadata.generation of the spec last rendered.",
        },
        "configHash": {
            "type": "string",
            "description": "Hash of the slurm.conf (and gres, topology) last applied.",
        },
        "nodes": {"type": "integer", "description": "Slurm nodes rendered from the pools."},
        "nodesByState": {
            "type": "object",
            "additionalProperties": _COUNT,
            "description": "Slurm nodes per Slurm state (idle, allocated, drained, ...).",
        },
        "lastReconfigure": {
            "type": "string",
            "description": "When slurmctld was last told to read the config "
            "(scontrol reconfigure).",
        },
        "conditions": CONDITIONS,
    },
}
"""Written by the operator (gpufleet.slurm.operator)."""


def spec_schema() -> Json:
    spec = structural(SlurmClusterSpec.model_json_schema(by_alias=True), defaults=True)
    spec["x-kubernetes-validations"] = [POOLS_DEFINED_RULE]
    return spec


def crd_manifest() -> Json:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    return crd(
        NAMES,
        spec=spec_schema(),
        status=STATUS_SCHEMA,
        description="A Slurm cluster on Kubernetes: node pools, partitions, preemption "
        "(docs/slurm.md).",
        spec_required=True,
        columns=[
            column("Nodes", "integer", ".status.nodes"),
            column("Idle", "integer", ".status.nodesByState.idle"),
            column("Drained", "integer", ".status.nodesByState.drained"),
            column("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
            AGE,
        ],
    )
