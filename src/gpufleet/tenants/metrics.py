"""Prometheus series per tenant (``gpufleet_tenant_*``, label ``tenant``): its quota, the GPUs
it holds and may hold on each scheduler, its conditions and the node Events it was sent.

The tenant controller calls :meth:`TenantMetrics.observe` for every tenant on every reconcile
and :meth:`TenantMetrics.forget` once a Tenant is gone, so a deleted tenant leaves no series.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpufleet.domain.tenancy import Split, Usage

SCHEDULERS = ("kubernetes", "slurm")


class TenantMetrics:
    """The per-tenant series, in the controller's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.quota = Gauge(
            "gpufleet_tenant_gpu_quota",
            "The tenant's gpuQuota: GPUs it may hold at once on both schedulers together "
            "(-1: no limit).",
            ["tenant"],
            registry=r,
        )
        self.in_use = Gauge(
            "gpufleet_tenant_gpus_in_use",
            "GPUs the tenant holds now, by scheduler: kubernetes (its pods' requests) or slurm "
            "(its account's running jobs).",
            ["tenant", "scheduler"],
            registry=r,
        )
        self.limit = Gauge(
            "gpufleet_tenant_gpu_limit",
            "The split of the quota applied now, by scheduler: the ResourceQuotas' sum or the "
            "account's GrpTRES gres/gpu (-1: no limit).",
            ["tenant", "scheduler"],
            registry=r,
        )
        self.condition = Gauge(
            "gpufleet_tenant_condition",
            "1 while the tenant's condition is True (Ready, Conflict, QuotaBelowUse, Deleting).",
            ["tenant", "condition"],
            registry=r,
        )
        self.node_events = Counter(
            "gpufleet_tenant_node_events_total",
            "Events written into the tenant's namespaces about a node of its work taken out "
            "for repair.",
            ["tenant"],
            registry=r,
        )
        self._conditions: dict[str, set[str]] = {}

    def observe(
        self,
        name: str,
        quota: int | None,
        usage: Usage | None,
        limits: Split | None,
        conditions: Mapping[str, bool],
    ) -> None:
        """Set the tenant's series from this reconcile (usage or limits None: not known this
        time, e.g. an invalid or contested tenant: those series are left as they were)."""
        self.quota.labels(name).set(-1 if quota is None else quota)
        if usage is not None:
            self.in_use.labels(name, "kubernetes").set(usage.kubernetes_gpus)
            self.in_use.labels(name, "slurm").set(usage.slurm_gpus)
        if limits is not None:
            for s, cap in (("kubernetes", limits.kubernetes_gpus), ("slurm", limits.slurm_gpus)):
                self.limit.labels(name, s).set(-1 if cap is None else cap)
        for cond, on in conditions.items():
            self.condition.labels(name, cond).set(1 if on else 0)
        self._conditions.setdefault(name, set()).update(conditions)

    def count_events(self, tenant: str, written: int) -> None:
        """Count Events written for the tenant."""
        if written:
            self.node_events.labels(tenant).inc(written)

    def forget(self, name: str) -> None:
        """Drop a deleted tenant's series."""
        _remove(self.quota, name)
        for s in SCHEDULERS:
            _remove(self.in_use, name, s)
            _remove(self.limit, name, s)
        for cond in self._conditions.pop(name, set()):
            _remove(self.condition, name, cond)
        _remove(self.node_events, name)


def _remove(metric: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never observed
        metric.remove(*labels)
