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

How a new module fits (docs/testing.md):

- A module whose tests drive the lifecycle controller on the shared nodes asks
  for ``fleet`` (module scope): the CRDs installed, every node reset with its
  own BMC Secret, a log directory for its controllers; after the module every
  node is reset again and its BMC made well behaved (``restore_fleet``). Its
  own objects (policies, namespaces, extra KWOK nodes) it removes itself.
- Each test starts the controller it needs with ``controller_harness.running``
  (a process; about 2 s): the tests kill, restart, pause and reconfigure it,
  so it is not shared between modules (decision 0151).
- Under ``scripts/test`` modules run on two pytest-xdist workers, whole modules
  at a time (tests/suite_schedule.py): each worker has its own ``local_cluster``,
  so nothing may assume another module ran before it. A module that must not
  run at once with another one (it uses a host-wide resource: the fabric, the
  host node, a fixed port) joins their group with
  ``pytest.mark.xdist_group("host-ground")``; a new long module (minutes) gets
  its measured seconds in ``suite_schedule.EXPECTED_S`` so that it starts early.
- ``GPUFLEET_TEST_CLUSTER=RUN_DIR`` runs a module against a cluster already
  running there (``gpufleet local up --nodes 4``) instead of starting one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_harness import Api, prepare_fleet
from fleet import Fleet, restore_fleet

from gpufleet.local import processes
from gpufleet.local.cluster import (
    ClusterInfo,
    ClusterSpec,
    LocalCluster,
    component_status,
    load_info,
)

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
    """A running 4-node local cluster (see the module docstring for the API).

    ``GPUFLEET_TEST_CLUSTER=RUN_DIR`` uses the cluster already running there (``gpufleet
    local up --nodes 4`` prints its run directory) instead of starting one, and leaves it
    running: the loop for working on one module (docs/testing.md)."""
    attach = os.environ.get("GPUFLEET_TEST_CLUSTER")
    if attach:
        info = load_info(Path(attach))
        down = [p.name for p, alive in component_status(info) if not alive]
        assert not down, f"the cluster in {attach} is not running: {down} stopped"
        yield info
        return
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


@pytest.fixture(scope="module")
def fleet(
    local_cluster: ClusterInfo,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Fleet]:
    """CRDs installed, every node of the shared cluster reset with its own BMC Secret; after
    the module, every node reset and its BMC well behaved again."""
    api = Api(local_cluster)
    prepare_fleet(api, local_cluster)
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    try:
        yield Fleet(local_cluster, api, tmp_path_factory.mktemp(name))
    finally:
        restore_fleet(api, local_cluster)
