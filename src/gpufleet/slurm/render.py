"""slurm.conf, gres.conf and topology.conf from a SlurmCluster and its Nodes (pure).

Node names are the Kubernetes Node names (one slurmd pod per Node, pinned
to it). Features come from the pool's static list plus the values of the
Node labels it names (``nvidia.com/gpu.product`` -> ``NVIDIA-H100-80GB-HBM3``).
topology.conf is a two-level tree (spine switches over leaf switches) from the
InfiniBand topology labels; nodes without the labels are left out of it.

The output is stable (sorted, no timestamps), so its hash says whether
``scontrol reconfigure`` is needed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufleet.slurm import hostlist
from gpufleet.slurm.crd import NodePool, SlurmClusterSpec


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the renderer needs of one Kubernetes Node."""

    name: str
    labels: Mapping[str, str]
    address: str | None = None


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
    found = list(pool.features)
    for key in pool.feature_labels:
        value = node.labels.get(key)
        if value:
            found.append(_feature(value))
    return sorted(set(found))


def _gres(pool: NodePool) -> str:
    kind = f"gpu:{pool.gpu_type}" if pool.gpu_type else "gpu"
    return f"{kind}:{pool.gpus}"


def render_slurm_conf(spec: SlurmClusterSpec, pools: Mapping[str, list[NodeInfo]]) -> str:
    lines = [
        "# Rendered by the gpufleet SlurmCluster operator; edit the SlurmCluster, not this.",
        f"ClusterName={spec.cluster_name}",
        f"SlurmctldHost={spec.controller_host}",
        f"SlurmctldPort={spec.controller_port}",
        f"SlurmdPort={spec.slurmd_port}",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "AuthAltTypes=auth/jwt",
        "AuthAltParameters=jwt_key=/etc/slurm/jwt/jwt_hs256.key",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=500",
        "GresTypes=gpu",
        "ReturnToService=2",
        "JobRequeue=1",
        "SchedulerType=sched/backfill",
        f"PreemptType={spec.preemption.type}",
        f"PreemptMode={spec.preemption.mode}",
        "MailProg=/bin/true",
    ]
    if spec.accounting.enabled:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={spec.accounting.host}",
            f"AccountingStoragePort={spec.accounting.port}",
            "AccountingStorageTRES=gres/gpu",
            "JobAcctGatherType=jobacct_gather/linux",
        ]
    else:
        lines += [
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
        ]
    if spec.topology.enabled:
        lines.append("TopologyPlugin=topology/tree")
    by_name = {p.name: p for p in spec.node_pools}
    for pool_name, members in pools.items():
        pool = by_name[pool_name]
        for node in members:
            feats = features_of(pool, node)
            parts = [f"NodeName={node.name}"]
            if node.address:
                parts.append(f"NodeAddr={node.address}")
            parts += [
                f"CPUs={pool.cpus}",
                f"RealMemory={pool.real_memory_mib}",
                f"Gres={_gres(pool)}" if pool.gpus else "",
                f"Feature={','.join(feats)}" if feats else "",
                "State=UNKNOWN",
            ]
            lines.append(" ".join(p for p in parts if p))
    for part in spec.partitions:
        names = [n.name for pool in part.pools for n in pools.get(pool, [])]
        node_expr = hostlist.compress(names) if names else '""'
        lines.append(
            f"PartitionName={part.name} Nodes={node_expr} "
            f"Default={'YES' if part.default else 'NO'} "
            f"MaxTime={part.max_time} State=UP PriorityTier={part.priority_tier} "
            f"PreemptMode={part.preempt_mode}"
        )
    lines += list(spec.extra_config)
    return "\n".join(lines) + "\n"


def render_gres_conf(spec: SlurmClusterSpec, pools: Mapping[str, list[NodeInfo]]) -> str:
    lines = ["AutoDetect=off"]
    for pool in spec.node_pools:
        members = pools.get(pool.name, [])
        if not members or not pool.gpus:
            continue
        type_part = f" Type={pool.gpu_type}" if pool.gpu_type else ""
        lines.append(
            f"NodeName={hostlist.compress(n.name for n in members)} Name=gpu{type_part} "
            f"File={pool.gpu_files}"
        )
    return "\n".join(lines) + "\n"


def render_topology_conf(spec: SlurmClusterSpec, nodes: Sequence[NodeInfo]) -> str:
    """Two-level tree: ``SwitchName=<leaf> Nodes=...`` and ``SwitchName=<spine> Switches=...``."""
    leaves: dict[str, list[str]] = {}
    spines: dict[str, set[str]] = {}
    for node in nodes:
        leaf = node.labels.get(spec.topology.leaf_label)
        if not leaf:
            continue
        leaves.setdefault(leaf, []).append(node.name)
        spine = node.labels.get(spec.topology.spine_label)
        if spine:
            spines.setdefault(spine, set()).add(leaf)
    lines = ["# Rendered from the InfiniBand topology labels of the Nodes."]
    for leaf in sorted(leaves):
        lines.append(f"SwitchName={leaf} Nodes={hostlist.compress(sorted(leaves[leaf]))}")
    for spine in sorted(spines):
        lines.append(f"SwitchName={spine} Switches={','.join(sorted(spines[spine]))}")
    return "\n".join(lines) + "\n"


def render_all(spec: SlurmClusterSpec, nodes: Sequence[NodeInfo]) -> dict[str, str]:
    """The ConfigMap data: slurm.conf, gres.conf and (when enabled) topology.conf."""
    pools = assign(spec, nodes)
    selected = [n for members in pools.values() for n in members]
    data = {
        "slurm.conf": render_slurm_conf(spec, pools),
        "gres.conf": render_gres_conf(spec, pools),
    }
    if spec.topology.enabled:
        data["topology.conf"] = render_topology_conf(spec, selected)
    return data


def config_hash(data: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for key in sorted(data):
        h.update(key.encode() + b"\0" + data[key].encode() + b"\0")
    return h.hexdigest()[:16]
