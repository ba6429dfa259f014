"""The two-tenants scenario's own parts: its Tenants, its pods, how it reads Slurm's
associations and what it says a refused sbatch means. The scenario itself runs on real
components in tests/e2e/test_two_tenants.py."""

from __future__ import annotations

from gpufleet.api import tenant as tenant_api
from gpufleet.demo import tenant_scenarios as ts
from gpufleet.demo.scenarios import SCENARIOS
from gpufleet.domain import tenancy


def test_the_tenants_are_valid_and_claim_nothing_of_each_other() -> None:
    objs = [t.manifest() for t in ts.TEAMS]
    assert all(tenant_api.problems(o) == [] for o in objs)
    domain = [
        tenant_api.from_object({**o, "metadata": {"name": o["metadata"]["name"],
                                                  "creationTimestamp": f"2026-01-0{i}"}})
        for i, o in enumerate(objs, 1)
    ]  # fmt: skip
    assert tenancy.conflicts(domain) == {"vision": [], "speech": []}
    assert [(t.name, t.gpu_quota, t.namespaces) for t in domain] == [
        ("vision", 8, ("vision",)),
        ("speech", 16, ("speech",)),
    ]
    assert all(u.uid >= tenancy.MIN_UID for t in domain for u in t.users)


def test_a_pod_holds_what_it_asks_on_the_nodes_slurm_leaves() -> None:
    pod = ts.gpu_pod("vision", "train-0", 4)
    assert tenancy.pod_gpus(pod) == 4
    assert pod["spec"]["nodeSelector"] == {ts.POOL_LABEL: "kubernetes"}
    nodes = [f"gpu-node-000{i}" for i in range(4)]
    assert ts.kubernetes_nodes(nodes) == ["gpu-node-0002", "gpu-node-0003"]


def test_the_association_counts_as_written_only_with_the_user_and_the_limit() -> None:
    written = "|gres/gpu=8\nalice|\n"
    assert ts.assoc_written(written, ts.VISION, 8)
    assert not ts.assoc_written(written, ts.VISION, 4)
    assert not ts.assoc_written("|gres/gpu=8\n", ts.VISION, 8)  # the user not yet
    assert not ts.assoc_written("alice|\n|\n", ts.VISION, 8)  # the limit not yet
    assert ts.assoc_written("|cpu=4,gres/gpu=8\nalice|\n", ts.VISION, 8)


def test_a_refused_sbatch_is_explained_from_the_tenants_status() -> None:
    status = {
        "usage": {"kubernetesGpus": 4, "slurmGpus": 4},
        "limits": {"kubernetesGpus": 4, "slurmGpus": 4},
    }
    stderr = (
        "sbatch: error: AssocGrpGRES\nsbatch: error: Batch job submission failed: Job "
        "violates accounting/QOS policy (job submit limit, user's size and/or time limits)\n"
    )
    assert ts.slurm_refusal(stderr, ts.VISION, status, 8) == (
        "AssocGrpGRES: account vision's GrpTRES is gres/gpu=4, tenant vision's quota of 8 "
        "GPUs less the 4 its pods hold; the job asked for 8 (its jobs hold 4 already)"
    )
    other = ts.slurm_refusal("sbatch: error: Invalid account\n", ts.VISION, status, 8)
    assert other == "Slurm refused the job of 8 GPUs: sbatch: error: Invalid account"


def test_the_apiservers_refusal_is_printed_on_one_line() -> None:
    stderr = 'Error from server (Forbidden): error when creating "STDIN":\n  exceeded quota\n'
    assert ts.quota_refusal(stderr) == (
        'Error from server (Forbidden): error when creating "STDIN": exceeded quota'
    )


def test_the_scenario_asks_for_the_tenants_fleet() -> None:
    scenario = SCENARIOS["two-tenants"]
    assert scenario.tenants and scenario.run is ts.two_tenants
    assert not any(s.tenants for name, s in SCENARIOS.items() if name != "two-tenants")
