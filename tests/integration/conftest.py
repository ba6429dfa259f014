"""Shared fixtures for integration tests: one real local cluster per test session.

``local_cluster`` (session scope) starts a 4-node cluster with
:mod:`gpufleet.local` -- etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, KWOK GPU nodes, munged, slurmctld, one slurmd per
node, slurmrestd and one Redfish BMC per node -- and yields a
:class:`gpufleet.local.cluster.ClusterInfo`:

Kubernetes
    ``info.kubeconfig`` (Path; token auth + CA file; hand it to kopf, kr8s or
    kubernetes_asyncio), ``info.apiserver_url``, ``info.token`` (bearer token,
    ``system:masters``), ``info.ca_file`` (verify TLS with it),
    ``info.kubectl`` (matching kubectl), ``info.kube_env()`` (os.environ plus
    KUBECONFIG, for subprocesses).
Nodes
    ``info.node_names`` (``gpu-node-0000`` ...), identical in Kubernetes and
    Slurm; each Node has ``nvidia.com/gpu: 8`` and the labels of
    :func:`gpufleet.local.kube.node_manifest`.
Slurm
    ``info.slurm_conf`` (Path), ``info.slurm_env()`` (os.environ plus
    SLURM_CONF: ``subprocess.run(["sinfo"], env=info.slurm_env())``),
    ``info.slurmrestd_url`` with headers ``X-SLURM-USER-NAME: root`` and
    ``X-SLURM-USER-TOKEN: info.slurm_jwt``, API ``info.slurm_api_version``.
Redfish
    ``info.bmcs[node]`` -> ``BmcEndpoint(url, user, password)``;
    ``.system_url`` is the node's ComputerSystem.
Files
    ``info.run_dir`` (private to this cluster), ``info.logs_dir`` (one log per
    component; failures name theirs).

The cluster is shared by every test in the session: create your own
namespaces, jobs and objects, and leave nodes as you found them (undrain,
uncordon, power on). Tests that need a cluster of their own start one with
``gpufleet.local.cluster.LocalCluster`` (a context manager) -- it runs beside
this one. On teardown every process is stopped, and the fixture fails if any
process tied to the run directory survived.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster

_FAILED_STEP: dict[str, str] = {}
"""Module of a ``steps`` module -> the first of its tests that failed."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember the first failure in a module marked ``steps``."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and item.get_closest_marker("steps") is not None:
        _FAILED_STEP.setdefault(item.module.__name__, item.name)  # type: ignore[attr-defined]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of a ``steps`` module after a failed one fails at once: it would wait out its
    timeouts (on the machines, a quarter of an hour each) on a cluster the failure left in
    an unknown state, and its own result would say nothing more."""
    if item.get_closest_marker("steps") is None:
        return
    failed = _FAILED_STEP.get(item.module.__name__)  # type: ignore[attr-defined]
    if failed is not None:
        pytest.fail(f"not run: it builds on {failed}, which failed", pytrace=False)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[ClusterInfo]:
    """A running 4-node local cluster (see the module docstring for the API)."""
    nodes = int(os.environ.get("GPUFLEET_TEST_NODES", "4"))
    cluster = LocalCluster(ClusterSpec(nodes=nodes))
    with processes.terminate_on_signals():
        info = cluster.start()
        try:
            yield info
        finally:
            cluster.stop()
    leftovers = processes.processes_using(info.run_dir)
    assert not leftovers, f"processes left behind by the local cluster: {leftovers}"
