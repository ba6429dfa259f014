"""The ``SlurmCluster`` model: :mod:`gpufleet.api.slurmcluster` (this name is kept for imports)."""

from __future__ import annotations

from gpufleet.api.slurmcluster import (
    HOST,
    KIND,
    LABEL_KEY,
    LINE,
    PLURAL,
    VALUE,
    WORD,
    Accounting,
    NodePool,
    Partition,
    Preemption,
    SlurmClusterSpec,
    Topology,
    crd_manifest,
)

__all__ = [
    "HOST",
    "KIND",
    "LABEL_KEY",
    "LINE",
    "PLURAL",
    "VALUE",
    "WORD",
    "Accounting",
    "NodePool",
    "Partition",
    "Preemption",
    "SlurmClusterSpec",
    "Topology",
    "crd_manifest",
]
