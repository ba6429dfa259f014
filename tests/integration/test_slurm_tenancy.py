"""Tenants' Slurm accounts and GPU quota against real daemons: slurmctld and slurmdbd
24.11, MariaDB, with ``AccountingStorageEnforce`` as a SlurmCluster with
``accounting.enforceLimits`` renders it and the ``normal`` QOS refusing jobs over a limit.

The tenant controller's Slurm port (:class:`gpufleet.slurm.associations.SacctmgrAssociations`)
applies the pure plan (:func:`gpufleet.domain.tenancy.plan_associations`) and reads it
back; sbatch then meets the quota: a job over it alone is refused at submission with
Slurm's reason, one that fits alone but not beside the account's running jobs waits, and
a limit lowered below what runs stops nothing. Then the tenant controller itself, with
this port and the cluster's apiserver: one quota split between a pod and a Slurm job, and a
deleted Tenant waiting for its job. The tenant's user is root (the one login of the Slurm
root that submits here; which uid runs a job is the isolation tests' concern).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator

import pytest
from controller_harness import Api, install
from waiting import wait_for

from gpufleet.domain import slurm_accounting, tenancy
from gpufleet.domain.pod_groups import GPU_RESOURCE
from gpufleet.domain.tenancy import SlurmAccount, SlurmTenancy
from gpufleet.kubeapi import ApiError, KubeApi, NotFound
from gpufleet.kubeapi.resources import NAMESPACES, NODES, PODS
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.slurm.associations import SacctmgrAssociations
from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig
from gpufleet.tenants.controller import RESOURCES, TENANTS, TenantController, TenantSettings

pytestmark = pytest.mark.integration

ACCOUNT = "vision"
USERS = frozenset({"root", "daemon"})


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    spec = ClusterSpec(
        nodes=2,
        redfish=False,
        slurm_version="24.11",
        slurm_accounting=True,
        slurm_enforce_limits=True,
    )
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        yield info
    assert not processes.processes_using(info.run_dir)


@pytest.fixture(scope="module")
def port(cluster: ClusterInfo) -> SacctmgrAssociations:
    return SacctmgrAssociations(env=cluster.slurm_env(), cluster="gpufleet")


def run(info: ClusterInfo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=info.slurm_env(), capture_output=True, text=True, timeout=30, check=False
    )


def sbatch(info: ClusterInfo, gpus: int, seconds: int = 600) -> subprocess.CompletedProcess[str]:
    return run(
        info, "sbatch", "--parsable", "-A", ACCOUNT, f"--gres=gpu:{gpus}", "-N1",
        "--wrap", f"sleep {seconds}",
    )  # fmt: skip


def job_state(info: ClusterInfo, job: str) -> str:
    return run(info, "squeue", "-h", "-j", job, "-o", "%T|%r").stdout.strip()


def want(gpu_limit: int | None, users: frozenset[str] = USERS) -> SlurmAccount:
    return SlurmAccount(
        name=ACCOUNT,
        description=tenancy.managed_description("vision-team"),
        users=users,
        gpu_limit=gpu_limit,
        qos=frozenset({"normal"}),
        default_qos="normal",
    )


def converge(port: SacctmgrAssociations, desired: SlurmAccount | None) -> SlurmTenancy:
    """Read, plan, apply, read again: what the tenant controller does each poll."""

    async def once() -> SlurmTenancy:
        current = await port.read()
        await port.apply(tenancy.plan_associations({ACCOUNT: desired}, current))
        return await port.read()

    return asyncio.run(once())


def test_the_port_writes_a_tenants_account_and_reads_it_back(
    cluster: ClusterInfo, port: SacctmgrAssociations
) -> None:
    conf = cluster.slurm_conf.read_text() if cluster.slurm_conf else ""
    assert f"AccountingStorageEnforce={slurm_accounting.ENFORCE}" in conf.splitlines()
    before = asyncio.run(port.read())
    assert "root" in before.accounts and ACCOUNT not in before.accounts
    after = converge(port, want(4))
    assert after.accounts[ACCOUNT] == want(4)
    assert after.accounts["root"] == before.accounts["root"]  # not gpufleet's: untouched
    # Converged: a second pass plans nothing.
    assert tenancy.plan_associations({ACCOUNT: want(4)}, after) == []
    # A user leaves the tenant: only that association goes.
    fewer = converge(port, want(4, frozenset({"root"})))
    assert fewer.accounts[ACCOUNT].users == {"root"}


def test_sbatch_meets_the_quota(cluster: ClusterInfo, port: SacctmgrAssociations) -> None:
    """Over the quota alone: refused at submission with Slurm's reason. Within it: runs,
    and its GPUs are what the port reads. Beside it, more than is left: waits. The limit
    lowered to 0 below what runs: the running job goes on, nothing new is taken."""
    converge(port, want(4, frozenset({"root"})))
    refused = sbatch(cluster, 6)
    assert refused.returncode != 0
    assert "AssocGrpGRES" in refused.stderr, refused.stderr
    assert "Job violates accounting/QOS policy" in refused.stderr, refused.stderr

    first = sbatch(cluster, 3).stdout.strip()
    wait_for(f"job {first} running", lambda: job_state(cluster, first) == "RUNNING|None", 30)
    assert asyncio.run(port.read()).gpus_running.get(ACCOUNT) == 3
    second = sbatch(cluster, 3).stdout.strip()
    wait_for(
        f"job {second} waiting on the quota",
        lambda: job_state(cluster, second) == "PENDING|AssocGrpGRES",
        30,
    )
    after = converge(port, want(0, frozenset({"root"})))
    assert after.accounts[ACCOUNT].gpu_limit == 0
    assert job_state(cluster, first) == "RUNNING|None"  # a lower limit stops nothing
    assert sbatch(cluster, 1).returncode != 0
    run(cluster, "scancel", first, second)
    for job in (first, second):  # gone, not completing: the next test counts GPUs
        wait_for(f"job {job} ended", lambda j=job: job_state(cluster, j) == "", 30)


def test_a_deleted_tenants_account_goes_only_once_its_jobs_ended(
    cluster: ClusterInfo, port: SacctmgrAssociations
) -> None:
    converge(port, want(2, frozenset({"root"})))
    job = sbatch(cluster, 1).stdout.strip()
    wait_for(f"job {job} running", lambda: job_state(cluster, job) == "RUNNING|None", 30)
    kept = converge(port, None)
    assert ACCOUNT in kept.accounts and kept.gpus_running[ACCOUNT] == 1
    run(cluster, "scancel", job)
    wait_for(f"job {job} ended", lambda: job_state(cluster, job) == "", 30)
    gone = converge(port, None)
    assert ACCOUNT not in gone.accounts and "root" in gone.accounts


def test_an_account_gpufleet_did_not_add_is_never_changed(
    cluster: ClusterInfo, port: SacctmgrAssociations
) -> None:
    added = run(
        cluster, "sacctmgr", "-i", "add", "account", ACCOUNT, "description=physics lab",
        "organization=physics",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    try:
        current = asyncio.run(port.read())
        assert tenancy.foreign_accounts({ACCOUNT: want(4)}, current) == [ACCOUNT]
        after = converge(port, want(4))
        assert after.accounts[ACCOUNT] == current.accounts[ACCOUNT]
        assert after.accounts[ACCOUNT].gpu_limit is None and not after.accounts[ACCOUNT].users
        assert ACCOUNT in converge(port, None).accounts  # nor removed
    finally:
        run(cluster, "sacctmgr", "-i", "remove", "account", ACCOUNT)


def test_the_tenant_controller_splits_one_quota_across_both_schedulers(
    cluster: ClusterInfo, port: SacctmgrAssociations
) -> None:
    """The loop with this port on the cluster's apiserver: a Tenant of 4 GPUs whose pod
    holds 2 leaves Slurm 2 (a 3-GPU job refused, a 2-GPU job runs), which leaves the
    namespace 2; deleted, it sets Slurm's limit to 0, lists what still runs, and removes
    the account and its finalizer only once the job and the pod are gone."""
    install(Api(cluster))
    asyncio.run(_loop_scenario(cluster, port))


async def _loop_scenario(cluster: ClusterInfo, port: SacctmgrAssociations) -> None:
    kube = await KubeApi.connect(str(cluster.kubeconfig))
    ctl = TenantController(kube, port, TenantSettings(interval_s=60.0))
    ns = "tn-slurm"
    await kube.create(NAMESPACES, {"metadata": {"name": ns}})
    # "root": the Slurm root's one login that can submit here (see the module docstring).
    spec = {"namespaces": [ns], "users": [{"name": "root", "uid": 20001, "gid": 20001}]}
    await kube.create(
        TENANTS,
        {
            "apiVersion": "gpufleet.io/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": ACCOUNT},
            "spec": {**spec, "gpuQuota": 4},
        },
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {
            "nodeSelector": {"tn-test": "nowhere"},  # never scheduled: it only holds GPUs
            "containers": [
                {"name": "c", "image": "train", "resources": {"limits": {GPU_RESOURCE: "2"}}}
            ],
        },
    }
    await kube.create(PODS, pod, namespace=ns)
    job = ""
    try:
        await ctl.reconcile()
        assert (await port.read()).accounts[ACCOUNT].gpu_limit == 2
        refused = sbatch(cluster, 3)
        assert refused.returncode != 0 and "AssocGrpGRES" in refused.stderr, refused.stderr
        job = sbatch(cluster, 2).stdout.strip()
        wait_for(f"job {job} running", lambda: job_state(cluster, job) == "RUNNING|None", 30)
        await ctl.reconcile()
        status = (await kube.get(TENANTS, ACCOUNT))["status"]
        assert status["usage"] == {"kubernetesGpus": 2, "slurmGpus": 2}
        assert status["limits"] == {"kubernetesGpus": 2, "slurmGpus": 2}
        quota = await kube.get(
            RESOURCES["ResourceQuota"], f"gpufleet-tenant-{ACCOUNT}", namespace=ns
        )
        assert quota["spec"]["hard"] == {f"requests.{GPU_RESOURCE}": "2"}

        await kube.delete(TENANTS, ACCOUNT)
        await ctl.reconcile()
        assert (await port.read()).accounts[ACCOUNT].gpu_limit == 0
        assert job_state(cluster, job) == "RUNNING|None"
        left = (await kube.get(TENANTS, ACCOUNT))["status"]["left"]
        assert f"Slurm account {ACCOUNT}: running jobs hold 2 GPUs" in left, left
        assert sbatch(cluster, 1).returncode != 0

        run(cluster, "scancel", job)
        await kube.delete(PODS, "train", namespace=ns)
        wait_for(f"job {job} ended", lambda: job_state(cluster, job) == "", 30)
        for _ in range(50):
            await ctl.reconcile()
            try:
                await kube.get(TENANTS, ACCOUNT)
            except NotFound:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the deleted Tenant kept its finalizer")
        assert ACCOUNT not in (await port.read()).accounts
    finally:
        if job:
            run(cluster, "scancel", job)
        with contextlib.suppress(ApiError):  # the cluster is this module's: only the finalizer
            await kube.patch(TENANTS, ACCOUNT, {"metadata": {"finalizers": []}})


def test_a_tenants_own_nodes_are_its_reservation_in_slurm(
    cluster: ClusterInfo, port: SacctmgrAssociations
) -> None:
    """A Tenant owning one node gets ``gpufleet-tenant-<name>`` on its Slurm node for its
    account: another account's job already running there runs on, the tenant's job runs
    there with ``--reservation``, another account's new job is kept off; deleted, the
    reservation stays while the tenant's job runs in it (Slurm refuses) and goes after."""
    install(Api(cluster))
    asyncio.run(_reservation_scenario(cluster, port))


def _squeue(info: ClusterInfo, job: str) -> str:
    return run(info, "squeue", "-h", "-j", job, "-o", "%T|%N").stdout.strip()


async def _reservation_scenario(cluster: ClusterInfo, port: SacctmgrAssociations) -> None:
    kube = await KubeApi.connect(str(cluster.kubeconfig))
    scontrol = Scontrol(ScontrolConfig(scontrol="scontrol", env=cluster.slurm_env()))
    ctl = TenantController(kube, port, TenantSettings(interval_s=60.0), reservations=scontrol)
    node, ns, name = cluster.node_names[0], "tn-resv", "gpufleet-tenant-resv"
    await kube.patch(NODES, node, {"metadata": {"labels": {"tn-resv": "own"}}})
    await kube.create(NAMESPACES, {"metadata": {"name": ns}})
    theirs = run(cluster, "sbatch", "--parsable", "-w", node, "-n1", "--wrap", "sleep 600")
    jobs = [theirs.stdout.strip()]
    try:
        wait_for("their job running", lambda: _squeue(cluster, jobs[0]) == f"RUNNING|{node}", 30)
        spec = {
            "namespaces": [ns],
            "users": [{"name": "root", "uid": 20001, "gid": 20001}],
            "slurm": {"account": "resv"},
            "nodes": {"selector": {"tn-resv": "own"}},
        }
        body = {"apiVersion": "gpufleet.io/v1alpha1", "kind": "Tenant", "spec": spec}
        await kube.create(TENANTS, {**body, "metadata": {"name": "resv"}})
        await ctl.reconcile()
        (resv,) = [r for r in await scontrol.reservations() if r.name == name]
        assert (resv.nodes, resv.accounts) == (frozenset({node}), frozenset({"resv"}))
        assert _squeue(cluster, jobs[0]) == f"RUNNING|{node}"  # not killed, not requeued
        mine = run(
            cluster, "sbatch", "--parsable", "-A", "resv", f"--reservation={name}", "-n1",
            "--gres=gpu:1", "--wrap", "sleep 600",
        )  # fmt: skip
        assert mine.returncode == 0, mine.stderr
        jobs.append(mine.stdout.strip())
        wait_for(
            "the tenant's job running", lambda: _squeue(cluster, jobs[1]) == f"RUNNING|{node}", 30
        )
        other = run(cluster, "sbatch", "--parsable", "-w", node, "-n1", "--wrap", "sleep 600")
        jobs.append(other.stdout.strip())
        wait_for(
            "another account's job kept off",
            lambda: _squeue(cluster, jobs[2]).startswith("PENDING"),
            30,
        )
        await ctl.reconcile()  # converged: nothing to change
        assert [r for r in await scontrol.reservations() if r.name == name] == [resv]

        # Deleted: Slurm keeps a reservation its jobs run in; it goes once they ended.
        await kube.delete(TENANTS, "resv")
        await ctl.reconcile()
        assert _squeue(cluster, jobs[1]) == f"RUNNING|{node}"
        assert [r for r in await scontrol.reservations() if r.name == name] == [resv]
        run(cluster, "scancel", jobs[1])
        wait_for("the tenant's job ended", lambda: _squeue(cluster, jobs[1]) == "", 30)
        await ctl.reconcile()
        assert not [r for r in await scontrol.reservations() if r.name == name]
    finally:
        run(cluster, "scancel", *jobs)
        for job in jobs:
            wait_for(f"job {job} ended", lambda j=job: _squeue(cluster, j) == "", 30)
        for _ in range(25):  # the account goes once its job ended, then the finalizer
            await ctl.reconcile()
            try:
                await kube.get(TENANTS, "resv")
            except NotFound:
                break
            await asyncio.sleep(0.2)
        with contextlib.suppress(ApiError):
            await kube.patch(TENANTS, "resv", {"metadata": {"finalizers": []}})
        run(cluster, "scontrol", "delete", f"ReservationName={name}")
        await kube.patch(NODES, node, {"metadata": {"labels": {"tn-resv": None}}})
