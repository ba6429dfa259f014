"""The per-tenant series: set from a reconcile, gone with the tenant."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpufleet.domain.tenancy import Split, Usage, split
from gpufleet.tenants.metrics import TenantMetrics


def _value(r: CollectorRegistry, name: str, **labels: str) -> float | None:
    return r.get_sample_value(name, labels)


def test_quota_use_split_and_conditions_per_tenant() -> None:
    r = CollectorRegistry()
    m = TenantMetrics(r)
    usage = Usage(namespaces={"vision": 4}, slurm_gpus=8)
    m.observe("vision", 16, usage, split(16, usage), {"Ready": True, "QuotaBelowUse": False})
    assert _value(r, "gpufleet_tenant_gpu_quota", tenant="vision") == 16
    assert _value(r, "gpufleet_tenant_gpus_in_use", tenant="vision", scheduler="slurm") == 8
    assert _value(r, "gpufleet_tenant_gpus_in_use", tenant="vision", scheduler="kubernetes") == 4
    # Kubernetes may hold Q - Slurm's, Slurm Q - Kubernetes'.
    assert _value(r, "gpufleet_tenant_gpu_limit", tenant="vision", scheduler="kubernetes") == 8
    assert _value(r, "gpufleet_tenant_gpu_limit", tenant="vision", scheduler="slurm") == 12
    assert _value(r, "gpufleet_tenant_condition", tenant="vision", condition="Ready") == 1
    assert _value(r, "gpufleet_tenant_condition", tenant="vision", condition="QuotaBelowUse") == 0
    m.observe("free", None, Usage({}, 0), Split(None, None, {}), {})
    assert _value(r, "gpufleet_tenant_gpu_quota", tenant="free") == -1
    assert _value(r, "gpufleet_tenant_gpu_limit", tenant="free", scheduler="slurm") == -1
    # A contested tenant's pass knows no split: its last one stays.
    m.observe("vision", 16, None, None, {"Conflict": True})
    assert _value(r, "gpufleet_tenant_gpu_limit", tenant="vision", scheduler="slurm") == 12
    assert _value(r, "gpufleet_tenant_condition", tenant="vision", condition="Conflict") == 1


def test_a_deleted_tenant_leaves_no_series() -> None:
    r = CollectorRegistry()
    m = TenantMetrics(r)
    m.observe("gone", 2, Usage({}, 1), split(2, Usage({}, 1)), {"Deleting": True})
    m.count_events("gone", 2)
    assert _value(r, "gpufleet_tenant_node_events_total", tenant="gone") == 2
    m.forget("gone")
    m.forget("never-seen")
    left = [s for fam in r.collect() for s in fam.samples if s.labels.get("tenant") == "gone"]
    assert left == []
