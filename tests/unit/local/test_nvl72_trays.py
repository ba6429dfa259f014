"""Simulated GB200 NVL72 domains in the local cluster: the first KWOK nodes are labelled as
trays the way the agent and Topograph label them, so every reader (the per-domain budget, the
domain-scale judgement of fabric faults, the Slurm topology) places each in one domain."""

from __future__ import annotations

from gpufleet.domain import well_known
from gpufleet.domain.topology import nvlink_domain_of
from gpufleet.local.kube import TOPOGRAPH_ACCELERATOR, NodeShape, node_manifest


def test_trays_of_two_domains_are_read_as_two_domains_and_the_rest_as_none() -> None:
    shape = NodeShape(nvl72_domains=2, trays_per_domain=3)
    domains = []
    for i in range(7):
        labels = node_manifest(f"n{i}", i, shape)["metadata"]["labels"]
        domains.append(nvlink_domain_of(f"n{i}", labels, TOPOGRAPH_ACCELERATOR))
    assert len(set(domains[:3])) == 1 and len(set(domains[3:6])) == 1
    assert domains[0] != domains[3] and "" not in domains[:6]
    assert domains[6] == ""
    first = node_manifest("n0", 0, shape)["metadata"]["labels"]
    uuid = first[well_known.LABEL_NVLINK_CLUSTER]
    assert first[well_known.LABEL_NVLINK_CLIQUE] == f"{uuid}.1" == domains[0]
    assert first[TOPOGRAPH_ACCELERATOR] == uuid


def test_no_domains_no_labels() -> None:
    labels = node_manifest("n0", 0, NodeShape())["metadata"]["labels"]
    assert well_known.LABEL_NVLINK_CLIQUE not in labels and TOPOGRAPH_ACCELERATOR not in labels
