"""slurm.conf, gres.conf and topology.conf from a SlurmCluster and its Nodes (pure).

Node names are the Kubernetes Node names (one slurmd pod per Node, pinned
to it). Features come from the pool's static list plus the values of the
Node labels it names (``nvidia.com/gpu.product`` -> ``NVIDIA-H100-80GB-HBM3``).
topology.conf is a two-level tree (spine switches over leaf switches) or Slurm's
blocks (NVLink domains), from the topology :mod:`gpufleet.domain.topology` reads
out of the Node labels; nodes without a place are left out of it, and so is what
the labels contradict (reported by the operator, never rendered).

The output is stable (sorted, no timestamps), so its hash says whether
``scontrol reconfigure`` is needed.

Every string written into a file passes :func:`_safe` first: the CRD's
patterns already keep control characters, spaces, ``#`` and ``=`` out of the
spec, but the renderer is the last line before slurmctld runs the file (a
``PrologSlurmctld=`` line injected through a newline would run as root), and
Node names, addresses and label values do not come from the spec at all. A
value that does not fit raises :class:`UnsafeValue` naming the field; nothing
is rendered. Nor is a partition left without nodes (:class:`EmptyPartition`: its
pools are not defined, or select no Node): Slurm would take ``Nodes=""`` as a
partition that never runs a job, and the operator keeps the last config instead
(``empty_partitions=True`` renders them empty: the operator's first config, before
any Node joined, so that slurmctld can start).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpufleet.api.slurmcluster import (
    HOST,
    LINE,
    VALUE,
    WORD,
    NodePool,
    Partition,
    SlurmClusterSpec,
)
from gpufleet.domain import hostlist, slurm_accounting, slurm_hooks, slurm_isolation, topology

HOOK_DIR = "/etc/slurm"
"""Where slurmd sees the ConfigMap (the chart mounts it executable, for the hooks)."""

_ALLOWED = {
    WORD: "letters, digits, '_', '.', '-'",
    HOST: "letters, digits, '_', '.', ':', '-'",
    VALUE: "letters, digits, '_', '.', '/', ',', ':', '[', ']', '-'",
    LINE: "one line without control characters",
}
_COMPILED = {p: re.compile(p) for p in _ALLOWED}


class NotRendered(ValueError):
    """Nothing is rendered from this spec and these Nodes; ``reason`` is the condition's."""

    reason = "NotRendered"


class UnsafeValue(NotRendered):
    """A value cannot be written into slurm.conf/gres.conf/topology.conf as it is."""

    reason = "UnsafeValue"

    def __init__(self, field: str, value: str, pattern: str) -> None:
        super().__init__(
            f"{field}={value!r} cannot be written into the Slurm config: {_why(value, pattern)}"
            f" (allowed: {_ALLOWED[pattern]})"
        )
        self.field = field


class EmptyPartition(NotRendered):
    """A partition would hold no node: its pools are not defined or select no Node."""

    reason = "PartitionWithoutNodes"

    def __init__(self, field: str, partition: str, why: str) -> None:
        super().__init__(f"{field}: partition {partition!r} would have no nodes: {why}")
        self.field = field


class UnknownPool(NotRendered):
    """A partition names a pool the spec does not define (the model and the CRD refuse it)."""

    reason = "UnknownPool"

    def __init__(self, field: str, partition: str, why: str) -> None:
        super().__init__(f"{field}: partition {partition!r} names {why}")
        self.field = field


def _why(value: str, pattern: str) -> str:
    """The first character that breaks the pattern, and what it would do in the file."""
    if not value:
        return "it is empty"
    for ch in value:
        if ch in "\n\r":
            return "it contains a line break, which would start a new directive"
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return f"it contains the control character U+{ord(ch):04X}"
        if not _COMPILED[pattern].fullmatch(ch):
            if ch.isspace():
                return "it contains whitespace, which would start a new key=value"
            if ch == "#":
                return "it contains '#', which starts a comment"
            if ch == "=":
                return "it contains '=', which would set another key"
            return f"it contains {ch!r}"
    return "it does not match " + pattern


def _safe(field: str, value: str, pattern: str = WORD) -> str:
    """``value`` if it fits ``pattern`` (one of the crd patterns), else :class:`UnsafeValue`."""
    if not _COMPILED[pattern].fullmatch(value):
        raise UnsafeValue(field, value, pattern)
    return value


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the renderer needs of one Kubernetes Node."""

    name: str
    labels: Mapping[str, str]
    address: str | None = None


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """A Kubernetes Node (its JSON) as the renderer needs it: name, labels, first InternalIP."""
    addresses = (node.get("status") or {}).get("addresses") or []
    internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
    return NodeInfo(
        name=node["metadata"]["name"],
        labels=node["metadata"].get("labels") or {},
        address=internal[0] if internal else None,
    )


def pool_members(pool: NodePool, nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    return sorted(
        (n for n in nodes if all(n.labels.get(k) == v for k, v in pool.node_selector.items())),
        key=lambda n: n.name,
    )


def assign(spec: SlurmClusterSpec, nodes: Sequence[NodeInfo]) -> dict[str, list[NodeInfo]]:
    """Pool name -> its nodes; a node matching several pools joins only the first."""
    taken: set[str] = set()
    out: dict[str, list[NodeInfo]] = {}
    for pool in spec.node_pools:
        members = [n for n in pool_members(pool, nodes) if n.name not in taken]
        taken.update(n.name for n in members)
        out[pool.name] = members
    return out


def _feature(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", value)


def features_of(pool: NodePool, node: NodeInfo) -> list[str]:
    found = [_safe(f"spec.nodePools[{pool.name!r}].features", f) for f in pool.features]
    for key in pool.feature_labels:
        value = node.labels.get(key)
        if value:
            found.append(_feature(value))
    return sorted(set(found))


def _gpu_type(pool: NodePool) -> str | None:
    if pool.gpu_type is None:
        return None
    return _safe(f"spec.nodePools[{pool.name!r}].gpuType", pool.gpu_type)


def _gres(pool: NodePool) -> str:
    gpu_type = _gpu_type(pool)
    kind = f"gpu:{gpu_type}" if gpu_type else "gpu"
    return f"{kind}:{pool.gpus}"


def _host(field: str, host: str, address: str) -> str:
    """``host`` or ``host(address)``: slurmctld checks its own host name against the first,
    everyone else dials the second."""
    name = _safe(f"spec.{field}Host", host, HOST)
    if not address:
        return name
    return f"{name}({_safe(f'spec.{field}Address', address, HOST)})"


def _controllers(spec: SlurmClusterSpec) -> list[str]:
    """The SlurmctldHost lines: the primary, then the backup when there is one (it takes
    over after SlurmctldTimeout; every daemon and command tries them in this order)."""
    lines = [f"SlurmctldHost={_host('controller', spec.controller_host, spec.controller_address)}"]
    if spec.backup_controller_host:
        backup = _host(
            "backupController", spec.backup_controller_host, spec.backup_controller_address
        )
        lines += [f"SlurmctldHost={backup}", f"SlurmctldTimeout={spec.slurmctld_timeout}"]
    return lines


def _node_name(node: NodeInfo) -> str:
    return _safe(f"Node {node.name!r} name", node.name, HOST)


def _names(nodes: Iterable[NodeInfo]) -> list[str]:
    return [_node_name(n) for n in nodes]


def render_slurm_conf(
    spec: SlurmClusterSpec,
    pools: Mapping[str, list[NodeInfo]],
    *,
    empty_partitions: bool = False,
) -> str:
    lines = [
        "# Rendered by the gpufleet SlurmCluster operator; edit the SlurmCluster, not this.",
        f"ClusterName={_safe('spec.clusterName', spec.cluster_name)}",
        *_controllers(spec),
        f"SlurmctldPort={spec.controller_port}",
        f"SlurmdPort={spec.slurmd_port}",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "AuthAltTypes=auth/jwt",
        "AuthAltParameters=jwt_key=/etc/slurm/jwt/jwt_hs256.key",
        "StateSaveLocation=/var/spool/slurmctld",
        # slurmctld's root filesystem is read-only; /run/slurm is its own emptyDir.
        "SlurmctldPidFile=/run/slurm/slurmctld.pid",
        "SlurmdSpoolDir=/var/spool/slurmd",
        # Jobs confined in cgroups: a job sees only the GPUs (and cores, memory) it was
        # given, and its processes are found and killed by their cgroup (cgroup.conf).
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=500",
        "GresTypes=gpu",
        "ReturnToService=2",
        "JobRequeue=1",
        "SchedulerType=sched/backfill",
        f"PreemptType={_safe('spec.preemption.type', spec.preemption.type, VALUE)}",
        f"PreemptMode={_safe('spec.preemption.mode', spec.preemption.mode, VALUE)}",
        "MailProg=/bin/true",
    ]
    accounting_host = (
        _safe("spec.accounting.host", spec.accounting.host, HOST)
        if spec.accounting.enabled
        else None
    )
    lines += slurm_accounting.slurm_conf_lines(
        accounting_host, spec.accounting.port, enforce_limits=spec.accounting.enforce_limits
    )
    lines += slurm_isolation.slurm_conf_lines(
        private_data=spec.isolation.private_data, job_tmpfs=spec.isolation.job_tmpfs
    )
    if spec.topology.enabled and spec.topology.file == "topology.conf":
        lines.append(f"TopologyPlugin=topology/{spec.topology.plugin}")
    hooks = hook_config(spec)
    if hooks is not None:
        lines.append(f"SchedulerParameters={','.join(slurm_hooks.scheduler_parameters([]))}")
        lines += slurm_hooks.conf_lines(hooks, hook_paths())
    # One PrologFlags line: the hooks' Alloc and the job container's Contain together.
    lines = slurm_isolation.merge_prolog_flags(
        lines, [slurm_isolation.CONTAIN] if spec.isolation.job_tmpfs else []
    )
    by_name = {p.name: p for p in spec.node_pools}
    for pool_name, members in pools.items():
        pool = by_name[pool_name]
        for node in members:
            feats = features_of(pool, node)
            parts = [f"NodeName={_node_name(node)}"]
            if node.address:
                where = f"Node {node.name!r} status.addresses InternalIP"
                parts.append(f"NodeAddr={_safe(where, node.address, HOST)}")
            parts += [
                f"CPUs={pool.cpus}",
                f"RealMemory={pool.real_memory_mib}",
                f"Gres={_gres(pool)}" if pool.gpus else "",
                f"Feature={','.join(feats)}" if feats else "",
                "State=UNKNOWN",
            ]
            lines.append(" ".join(p for p in parts if p))
    for part in spec.partitions:
        where = f"spec.partitions[{part.name!r}]"
        names = _names(n for pool in _partition_pools(spec, part, where) for n in pools[pool])
        if not names and not empty_partitions:
            raise EmptyPartition(
                f"{where}.pools",
                part.name,
                f"no Node matches the nodeSelector of pool(s) {', '.join(part.pools)}",
            )
        node_expr = hostlist.compress(names) if names else '""'
        lines.append(
            f"PartitionName={_safe(f'{where}.name', part.name)} Nodes={node_expr} "
            f"Default={'YES' if part.default else 'NO'} "
            f"MaxTime={_safe(f'{where}.maxTime', part.max_time, VALUE)} State=UP "
            f"PriorityTier={part.priority_tier} "
            f"PreemptMode={_safe(f'{where}.preemptMode', part.preempt_mode, VALUE)}"
        )
    lines += [
        _safe(f"spec.extraConfig[{i}]", line, LINE) for i, line in enumerate(spec.extra_config)
    ]
    return "\n".join(lines) + "\n"


def _partition_pools(spec: SlurmClusterSpec, part: Partition, where: str) -> list[str]:
    """The partition's pool names, each a safe word and a defined pool (the model and the
    CRD check both; the renderer is the last line before slurmctld reads the file)."""
    defined = sorted(p.name for p in spec.node_pools)
    for i, pool in enumerate(part.pools):
        _safe(f"{where}.pools[{i}]", pool)
        if pool not in defined:
            known = ", ".join(defined)
            raise UnknownPool(
                f"{where}.pools[{i}]",
                part.name,
                f"{pool!r}, which is not a node pool of this cluster (nodePools: {known})",
            )
    return list(part.pools)


def render_gres_conf(spec: SlurmClusterSpec, pools: Mapping[str, list[NodeInfo]]) -> str:
    lines = ["AutoDetect=off"]
    for pool in spec.node_pools:
        members = pools.get(pool.name, [])
        if not members or not pool.gpus:
            continue
        gpu_type = _gpu_type(pool)
        type_part = f" Type={gpu_type}" if gpu_type else ""
        files = _safe(f"spec.nodePools[{pool.name!r}].gpuFiles", pool.gpu_files, VALUE)
        lines.append(
            f"NodeName={hostlist.compress(_names(members))} Name=gpu{type_part} File={files}"
        )
    return "\n".join(lines) + "\n"


CGROUP_CONF = """\
# Rendered by the gpufleet SlurmCluster operator. slurmd runs in a privileged pod with
# the node's cgroup v2 tree; no systemd there, so Slurm makes its own cgroups.
CgroupPlugin=cgroup/v2
IgnoreSystemd=yes
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainSwapSpace=yes
ConstrainDevices=yes
"""
"""cgroup.conf: each job confined to its cores, memory and devices (``ConstrainDevices``:
a job opens only the ``/dev/nvidia*`` of the GPUs it was given, whatever
``CUDA_VISIBLE_DEVICES`` says)."""


def source_keys(spec: SlurmClusterSpec) -> topology.SourceKeys:
    """The label keys the spec reads the topology from."""
    t = spec.topology
    return topology.SourceKeys(
        leaf=t.leaf_label,
        spine=t.spine_label,
        block=t.block_label,
        nvlink_domain=t.nvlink_domain_label,
    )


def scheduler_keys(spec: SlurmClusterSpec) -> topology.SchedulerKeys | None:
    """The scheduler label keys the spec writes (None: none are written)."""
    s = spec.topology.scheduler_labels
    if not s.enabled:
        return None
    return topology.SchedulerKeys(
        spine=s.spine, leaf=s.leaf, block=s.block, nvlink_domain=s.nvlink_domain
    )


def fabric_of(spec: SlurmClusterSpec, nodes: Sequence[NodeInfo]) -> topology.FabricTopology:
    """The topology of ``nodes`` as the spec's labels describe it."""
    return topology.build(((n.name, n.labels) for n in nodes), source_keys(spec))


def _switch(field: str, value: str) -> str:
    return _safe(field, value)


def render_topology_conf(spec: SlurmClusterSpec, fabric: topology.FabricTopology) -> str:
    """topology.conf: the tree (``SwitchName=<leaf> Nodes=...``, ``SwitchName=<spine>
    Switches=...``) or the blocks (``BlockName=<block> Nodes=...``, ``BlockSizes=``).
    Nodes without a place (no labels, or a contradiction) are left out."""
    if spec.topology.plugin == "block":
        lines = ["# Rendered from the NVLink domain / block labels of the Nodes."]
        for block, names in fabric.blocks().items():
            lines.append(f"BlockName={_switch('block', block)} Nodes={_hostlist(names)}")
        if spec.topology.block_sizes:
            lines.append(f"BlockSizes={','.join(str(n) for n in spec.topology.block_sizes)}")
        return "\n".join(lines) + "\n"
    lines = ["# Rendered from the InfiniBand topology labels of the Nodes."]
    for leaf, names in fabric.leaves().items():
        lines.append(f"SwitchName={_switch('leaf switch', leaf)} Nodes={_hostlist(names)}")
    for spine, leaves in fabric.spines().items():
        lines.append(f"SwitchName={_switch('spine', spine)} Switches={','.join(leaves)}")
    return "\n".join(lines) + "\n"


def render_topology_yaml(spec: SlurmClusterSpec, fabric: topology.FabricTopology) -> str:
    """topology.yaml (Slurm 25.05+; it takes precedence over topology.conf there): one
    topology, ``default``, the cluster's default, of the spec's plugin."""
    body: dict[str, object]
    if spec.topology.plugin == "block":
        block: dict[str, object] = {
            "blocks": [
                {"block": _switch("block", b), "nodes": _hostlist(ns)}
                for b, ns in fabric.blocks().items()
            ]
        }
        if spec.topology.block_sizes:
            block["block_sizes"] = list(spec.topology.block_sizes)
        body = {"block": block}
    else:
        switches: list[dict[str, str]] = [
            {"switch": _switch("leaf switch", leaf), "nodes": _hostlist(ns)}
            for leaf, ns in fabric.leaves().items()
        ]
        switches += [
            {"switch": _switch("spine", spine), "children": ",".join(leaves)}
            for spine, leaves in fabric.spines().items()
        ]
        body = {"tree": {"switches": switches}}
    doc = [{"topology": "default", "cluster_default": True, **body}]
    header = "# Rendered by the gpufleet SlurmCluster operator (Slurm 25.05+ reads this file).\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


def _hostlist(names: Sequence[str]) -> str:
    return hostlist.compress([_safe(f"Node {n!r} name", n, HOST) for n in names])


def render_all(
    spec: SlurmClusterSpec,
    nodes: Sequence[NodeInfo],
    *,
    empty_partitions: bool = False,
    fabric: topology.FabricTopology | None = None,
) -> dict[str, str]:
    """The ConfigMap data: slurm.conf, gres.conf and (when enabled) topology.conf or
    topology.yaml; ``fabric``: the topology of the selected nodes when the caller has it."""
    pools = assign(spec, nodes)
    selected = [n for members in pools.values() for n in members]
    data = {
        "slurm.conf": render_slurm_conf(spec, pools, empty_partitions=empty_partitions),
        "gres.conf": render_gres_conf(spec, pools),
        "cgroup.conf": CGROUP_CONF,
    }
    if spec.isolation.job_tmpfs:
        data["job_container.conf"] = slurm_isolation.job_container_conf(
            _safe("spec.isolation.jobTmpfsBasePath", spec.isolation.job_tmpfs_base_path, VALUE)
        )
    if spec.topology.enabled:
        fabric = fabric if fabric is not None else fabric_of(spec, selected)
        if spec.topology.file == "topology.yaml":
            data["topology.yaml"] = render_topology_yaml(spec, fabric)
        else:
            data["topology.conf"] = render_topology_conf(spec, fabric)
    hooks = hook_config(spec)
    if hooks is not None:
        for mode in slurm_hooks.MODES:
            data[f"gpufleet-{mode}"] = slurm_hooks.script(hooks, mode)
    return data


def hook_config(spec: SlurmClusterSpec) -> slurm_hooks.HookConfig | None:
    """The health hooks the spec asks for (None when ``healthChecks.enabled`` is false)."""
    h = spec.health_checks
    if not h.enabled:
        return None
    return slurm_hooks.HookConfig(
        gpufleet=_safe("spec.healthChecks.gpufleet", h.gpufleet, VALUE),
        checks=tuple(_safe("spec.healthChecks.checks", c) for c in h.checks),
        timeout_s=h.timeout_seconds,
        health_interval_s=h.health_interval_seconds,
        prolog=h.prolog,
        epilog=h.epilog,
        preflight=h.preflight,
        preflight_timeout_s=h.preflight_timeout_seconds,
    )


def hook_paths() -> dict[str, str]:
    return {mode: f"{HOOK_DIR}/gpufleet-{mode}" for mode in slurm_hooks.MODES}


def config_hash(data: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for key in sorted(data):
        h.update(key.encode() + b"\0" + data[key].encode() + b"\0")
    return h.hexdigest()[:16]
