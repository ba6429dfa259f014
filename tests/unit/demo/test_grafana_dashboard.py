"""Every metric the Grafana dashboard queries is one the agent, the controller, the
Slurm syncer, provisioning or the goodput ledger exports, and no name is exported by two
components."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpufleet.health.metrics import AgentMetrics
from gpufleet.lifecycle.goodput import Metrics as GoodputMetrics
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.provision.issuer import ProvisionMetrics
from gpufleet.slurm.metrics import SyncerMetrics

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpufleet-dashboard.json"
NAME = re.compile(r"\bgpufleet_[a-z0-9_]+")


def registries() -> dict[str, CollectorRegistry]:
    """Each component's registry, as its process builds it."""
    return {
        "agent": AgentMetrics("n").registry,
        "controller": Metrics().registry,
        "syncer": SyncerMetrics().registry,
        "provisioning": ProvisionMetrics().registry,
        "goodput": GoodputMetrics().registry,
    }


def names_of(registry: CollectorRegistry) -> set[str]:
    """Metric names as Prometheus exposes them (counters get ``_total``, histograms
    ``_bucket``/``_count``/``_sum``); a family without samples yet counts too."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def exported() -> set[str]:
    return set().union(*(names_of(r) for r in registries().values()))


def test_no_two_components_export_one_name() -> None:
    """One meaning per name: a name two components export (with different labels)
    cannot be summed or joined (decision 0099)."""
    seen: dict[str, str] = {}
    for component, registry in registries().items():
        for name in names_of(registry):
            assert name not in seen, f"{name} exported by {seen[name]} and {component}"
            seen[name] = component


def queried() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs
    return {m for e in exprs for m in NAME.findall(e)}


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    missing = queried() - exported()
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"


def test_the_dashboard_covers_agent_and_controller() -> None:
    q = queried()
    assert "gpufleet_nodes" in q and "gpufleet_breaker_open" in q  # controller
    assert "gpufleet_condition" in q and "gpufleet_gpu_temperature_celsius" in q  # agent


def test_the_dashboard_covers_the_slurm_syncer() -> None:
    q = queried()
    assert any(name.startswith("gpufleet_syncer_") for name in q)
    assert "gpufleet_syncer_slurm_up" in q and "gpufleet_syncer_drains_total" in q
    assert "gpufleet_syncer_sync_latency_seconds_bucket" in q


def test_the_dashboard_covers_the_rma_hand_off() -> None:
    doc = json.loads(DASHBOARD.read_text())
    titles = [p.get("title", "") for p in doc["panels"]]
    assert "RMA hand-off (lifecycle controller)" in titles
    assert "gpufleet_rma_ticket_calls_total" in queried()


def test_the_dashboard_covers_the_goodput_ledger() -> None:
    q = queried()
    assert "gpufleet_goodput_lost_gpu_seconds" in q
    assert "gpufleet_goodput_productive_gpu_seconds" in q
