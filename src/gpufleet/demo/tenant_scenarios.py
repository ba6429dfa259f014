"""The ``two-tenants`` scenario: two teams share the fleet under one GPU quota each.

Two Tenants are applied (``vision``: 8 GPUs, ``speech``: 16), each with a namespace and
one person, whom the Slurm root lists as the chart's ``slurm-users`` ConfigMap would
(:mod:`gpufleet.local.slurm_people`). The tenant controller ``gpufleet local up`` starts
makes them Ready: a ResourceQuota in each namespace and a Slurm account with its user
and ``GrpTRES``, written through sacctmgr. vision then holds 4 GPUs in a pod and 4 in
an sbatch job and tries for more from each scheduler: the apiserver refuses the pod
(the ResourceQuota), Slurm refuses the job at submission (``AssocGrpGRES``, the ``normal``
QOS's DenyOnLimit). speech submits within its quota from both and is not held back.

It needs Slurm 24.11 with accounting enforcing limits and the tenant controller, which
the shared demo fleet lacks: the scenario runs on a fleet of its own
(:attr:`gpufleet.demo.scenarios.Scenario.tenants`, decision 0289).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufleet.api import tenant as tenant_api
from gpufleet.demo import kube
from gpufleet.demo.timeline import StepMissed
from gpufleet.domain.pod_groups import GPU_RESOURCE
from gpufleet.local import slurm_people
from gpufleet.local.cluster import ClusterInfo
from gpufleet.local.slurm_people import Person

if TYPE_CHECKING:  # scenarios imports this module
    from gpufleet.demo.scenarios import Ctx

TENANTS_PATH = f"{kube.GV}/tenants"
POOL_LABEL = "demo.gpufleet.io/scheduler"
"""The label that puts the scenario's pods on the nodes Slurm does not run (no syncer
lends nodes on the tenants' fleet: Slurm has slurmds on the first half only)."""
POD_IMAGE = "example.invalid/trainer:1"
JOB_SECONDS = 600
"""How long the scenario's jobs would sleep: they are cancelled at the end."""


@dataclass(frozen=True)
class DemoTenant:
    """One team of the scenario: its name (also its namespace and Slurm account), its
    quota and its one person."""

    name: str
    display: str
    quota: int
    person: Person

    def manifest(self) -> dict[str, Any]:
        """The Tenant object to apply."""
        spec = tenant_api.TenantSpec.model_validate(
            {
                "displayName": self.display,
                "namespaces": [self.name],
                "users": [
                    {"name": self.person.name, "uid": self.person.uid, "gid": self.person.gid}
                ],
                "gpuQuota": self.quota,
            }
        )
        return tenant_api.manifest(self.name, spec)


VISION = DemoTenant("vision", "Vision team", 8, Person("alice", 20001, 20001))
SPEECH = DemoTenant("speech", "Speech team", 16, Person("bob", 20002, 20002))
TEAMS = (VISION, SPEECH)


def gpu_pod(namespace: str, name: str, gpus: int) -> dict[str, Any]:
    """A training pod asking for ``gpus`` GPUs (a KWOK node runs it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {POOL_LABEL: "kubernetes"},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "train",
                    "image": POD_IMAGE,
                    "resources": {
                        "requests": {GPU_RESOURCE: str(gpus)},
                        "limits": {GPU_RESOURCE: str(gpus)},
                    },
                }
            ],
        },
    }


def kubernetes_nodes(nodes: list[str]) -> list[str]:
    """The nodes the scenario's pods run on: those after the first half, which have no
    slurmd (``Fleet.start(tenants=True)``)."""
    return nodes[len(nodes) // 2 :]


def assoc_written(lines: str, team: DemoTenant, limit: int) -> bool:
    """Whether ``sacctmgr -nP show assoc account=<team> format=user,grptres`` shows the
    team's person and the account's GPU limit."""
    rows = [line.split("|") for line in lines.splitlines() if "|" in line]
    return any(r[0] == team.person.name for r in rows) and any(
        f"gres/gpu={limit}" in r[1].split(",") for r in rows if len(r) > 1
    )


def gpus(status: Mapping[str, Any], key: str, side: str) -> int | None:
    """``status.<key>.<side>`` of a Tenant (``usage``/``limits``, ``kubernetesGpus``/
    ``slurmGpus``); None when absent."""
    value = (status.get(key) or {}).get(side)
    return None if value is None else int(value)


def condition(status: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or []
    )


def slurm_refusal(stderr: str, team: DemoTenant, status: Mapping[str, Any], asked: int) -> str:
    """What a refused sbatch means for ``team``, from its Tenant's status: Slurm says
    only ``AssocGrpGRES`` and 'Job violates accounting/QOS policy'."""
    if "AssocGrpGRES" not in stderr:
        return f"Slurm refused the job of {asked} GPUs: {stderr.strip() or 'no reason given'}"
    limit = gpus(status, "limits", "slurmGpus")
    in_pods = gpus(status, "usage", "kubernetesGpus") or 0
    in_jobs = gpus(status, "usage", "slurmGpus") or 0
    return (
        f"AssocGrpGRES: account {team.name}'s GrpTRES is gres/gpu={limit}, tenant "
        f"{team.name}'s quota of {team.quota} GPUs less the {in_pods} its pods hold; the job "
        f"asked for {asked} (its jobs hold {in_jobs} already)"
    )


def quota_refusal(stderr: str) -> str:
    """The apiserver's refusal as kubectl prints it, on one line."""
    return " ".join(line.strip() for line in stderr.splitlines() if line.strip())


# ------------------------------------------------------------------ the scenario


def _kubectl(
    info: ClusterInfo, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(info.kubectl), f"--kubeconfig={info.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _as(info: ClusterInfo, team: DemoTenant, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` in the Slurm root as ``team``'s person (munge vouches for their uid)."""
    return subprocess.run(
        slurm_people.as_person(info, team.person, argv),
        env=info.slurm_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _root(info: ClusterInfo, *argv: str) -> str:
    r = subprocess.run(
        argv, env=info.slurm_env(), capture_output=True, text=True, timeout=30, check=False
    )
    return r.stdout.strip()


class _Run:
    """The scenario's steps on one fleet; :meth:`clean` undoes what they did."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.info = ctx.fleet.info
        self.api = ctx.fleet.api
        self.jobs: list[str] = []
        self.labelled: list[str] = []
        self.pods: list[tuple[str, str]] = []

    def note(self, text: str) -> float:
        return self.ctx.tl.note("demo", text).t

    def until(self, what: str, ok: Callable[[], bool], timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                raise StepMissed(
                    what, timeout, "tenant-controller", self.ctx.log("tenant-controller")
                )
            self.ctx.tl.poll()
            time.sleep(0.2)
        return time.time()

    def status(self, team: DemoTenant) -> dict[str, Any]:
        return self.api.get(f"{TENANTS_PATH}/{team.name}").get("status") or {}

    def apply(self) -> None:
        pods = kubernetes_nodes(self.info.node_names)
        for node in pods:
            self.labelled.append(node)
            self.api.patch(
                f"/api/v1/nodes/{node}", {"metadata": {"labels": {POOL_LABEL: "kubernetes"}}}
            )
        slurm = [n for n in self.info.node_names if n not in pods]
        self.note(
            f"Slurm runs on {', '.join(slurm)}; pods on {', '.join(pods)} "
            f"(label {POOL_LABEL}=kubernetes)"
        )
        slurm_people.add_people(self.info, [t.person for t in TEAMS])
        for t in TEAMS:
            self.api.create("/api/v1/namespaces", {"metadata": {"name": t.name}})
            self.api.create(TENANTS_PATH, t.manifest(), exist_ok=False)
            self.note(
                f"Tenant {t.name} applied: namespace {t.name}, user {t.person.name} "
                f"(uid {t.person.uid}, in the Slurm root's passwd), gpuQuota {t.quota}"
            )
        start = time.time()
        for t in TEAMS:

            def assoc(t: DemoTenant = t) -> str:
                return _root(
                    self.info, "sacctmgr", "-nP", "show", "assoc", f"account={t.name}",
                    "format=user,grptres",
                )  # fmt: skip

            def ready(t: DemoTenant = t) -> bool:
                return condition(self.status(t), "Ready") and assoc_written(assoc(t), t, t.quota)

            self.until(f"Tenant {t.name} Ready, its Slurm account and limit written", ready)
            rows = "; ".join(
                f"user={r.split('|')[0] or '-'} GrpTRES={r.split('|')[1] or '-'}"
                for r in assoc().splitlines()
            )
            self.note(f"{t.name} Ready; sacctmgr show assoc account={t.name}: {rows}")
        self.ctx.figures["ready_s"] = time.time() - start

    def pod(self, team: DemoTenant, name: str, n: int) -> subprocess.CompletedProcess[str]:
        import json

        r = _kubectl(self.info, "create", "-f", "-", stdin=json.dumps(gpu_pod(team.name, name, n)))
        if r.returncode == 0:
            self.pods.append((team.name, name))
        return r

    def pod_running(self, team: DemoTenant, name: str, n: int) -> None:
        r = self.pod(team, name, n)
        if r.returncode != 0:
            raise StepMissed(
                f"pod {team.name}/{name} created: {r.stderr.strip()}", 0, "kube-apiserver", None
            )
        path = f"/api/v1/namespaces/{team.name}/pods/{name}"
        self.until(
            f"pod {team.name}/{name} Running",
            lambda: (self.api.get(path).get("status") or {}).get("phase") == "Running",
            timeout=30,
        )
        node = self.api.get(path)["spec"].get("nodeName")
        self.note(f"{team.name}: pod {name} ({n} GPUs) Running on {node}")

    def sbatch(self, team: DemoTenant, n: int) -> subprocess.CompletedProcess[str]:
        return _as(
            self.info, team, "sbatch", "--parsable", f"--account={team.name}",
            f"--gres=gpu:{n}", "-N1", "--output=/dev/null", "--wrap", f"sleep {JOB_SECONDS}",
        )  # fmt: skip

    def job_running(self, team: DemoTenant, n: int) -> None:
        r = self.sbatch(team, n)
        if r.returncode != 0:
            raise StepMissed(
                f"{team.person.name}'s sbatch: {r.stderr.strip()}",
                0,
                "slurmctld",
                self.ctx.log("slurmctld"),
            )
        job = r.stdout.strip().split(";")[0]
        self.jobs.append(job)
        self.until(
            f"job {job} running",
            lambda: _root(self.info, "squeue", "-h", "-j", job, "-o", "%T") == "RUNNING",
            timeout=30,
        )
        self.note(
            f"{team.name}: sbatch --gres=gpu:{n} as {team.person.name} -> job {job} RUNNING "
            f"on {_root(self.info, 'squeue', '-h', '-j', job, '-o', '%N')}"
        )

    def split(self, team: DemoTenant, kubernetes: int, slurm: int) -> None:
        """Wait for the tenant controller to see ``team``'s usage and split its quota."""

        def seen() -> bool:
            s = self.status(team)
            return (
                gpus(s, "usage", "kubernetesGpus") == kubernetes
                and gpus(s, "usage", "slurmGpus") == slurm
                and gpus(s, "limits", "kubernetesGpus") == team.quota - slurm
                and gpus(s, "limits", "slurmGpus") == team.quota - kubernetes
            )

        self.until(f"{team.name}'s usage {kubernetes}+{slurm} GPUs and its split", seen, 30)
        self.note(
            f"{team.name} holds {kubernetes} GPUs in pods and {slurm} in Slurm jobs of its "
            f"{team.quota}: ResourceQuota {team.quota - slurm}, "
            f"GrpTRES gres/gpu={team.quota - kubernetes}"
        )

    def over_quota(self, team: DemoTenant) -> None:
        r = self.pod(team, "train-big", team.quota)
        if r.returncode == 0:
            raise StepMissed(
                f"the apiserver refusing a {team.quota}-GPU pod in {team.name}",
                0,
                "kube-apiserver",
                None,
            )
        refused = quota_refusal(r.stderr)
        self.ctx.figures["pod_refused"] = refused
        self.note(f"{team.name}: kubectl create pod train-big ({team.quota} GPUs) -> refused")
        self.ctx.tl.console.print(f"    [red]{_escape(refused)}[/red]", soft_wrap=True)
        job = self.sbatch(team, team.quota)
        if job.returncode == 0:
            self.jobs.append(job.stdout.strip().split(";")[0])
            raise StepMissed(
                f"Slurm refusing a {team.quota}-GPU job of {team.name}",
                0,
                "slurmctld",
                self.ctx.log("slurmctld"),
            )
        said = " / ".join(line.strip() for line in job.stderr.splitlines() if line.strip())
        meaning = slurm_refusal(job.stderr, team, self.status(team), team.quota)
        self.ctx.figures["sbatch_refused"] = said
        self.ctx.figures["sbatch_meaning"] = meaning
        self.note(
            f"{team.name}: sbatch --gres=gpu:{team.quota} as {team.person.name} "
            "-> refused at submission"
        )
        self.ctx.tl.console.print(f"    [red]{_escape(said)}[/red]", soft_wrap=True)
        self.ctx.tl.console.print(f"    gpufleet: {_escape(meaning)}", soft_wrap=True)

    def show_status(self) -> None:
        for t in TEAMS:
            argv = [sys.executable, "-m", "gpufleet.cli.main", "status", "--tenant", t.name,
                    "--run-dir", str(self.info.run_dir)]  # fmt: skip
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            self.note(f"gpufleet status --tenant {t.name}")
            self.ctx.tl.console.print(_escape((r.stdout or r.stderr).rstrip()), soft_wrap=True)

    def clean(self) -> None:
        """Jobs cancelled, pods deleted, Tenants deleted (their finalizer releases them
        once nothing of theirs runs: quota, RoleBindings and Slurm accounts go), the
        namespaces deleted."""
        if self.jobs:
            _root(self.info, "scancel", *self.jobs)
        for ns, name in self.pods:
            self.api.delete(f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
        for t in TEAMS:
            self.api.delete(f"{TENANTS_PATH}/{t.name}")
        self.until(
            "the Tenants released (their jobs and pods ended, accounts removed)",
            lambda: not any(kube.answered(self.api, f"{TENANTS_PATH}/{t.name}") for t in TEAMS),
            timeout=60,
        )
        for t in TEAMS:
            self.api.delete(f"/api/v1/namespaces/{t.name}")
        for node in self.labelled:
            self.api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {POOL_LABEL: None}}})
        left = " ".join(
            _root(self.info, "sacctmgr", "-nP", "show", "account", "format=account").split()
        )
        self.note(f"cleaned up: Tenants, pods, jobs, namespaces; Slurm accounts left: {left}")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def two_tenants(ctx: Ctx) -> None:
    run = _Run(ctx)
    try:
        run.apply()
        run.pod_running(VISION, "train-0", 4)
        run.split(VISION, 4, 0)
        run.job_running(VISION, 4)
        run.split(VISION, 4, 4)
        run.over_quota(VISION)
        run.pod_running(SPEECH, "train-0", 8)
        run.job_running(SPEECH, 8)
        run.split(SPEECH, 8, 8)
        run.show_status()
    finally:
        run.clean()
