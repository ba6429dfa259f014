"""Every metric the Grafana dashboard queries is one the agent, the controller or the
Slurm syncer exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpufleet-dashboard.json"
SOURCES = [
    ROOT / "src" / "gpufleet" / "lifecycle" / "metrics.py",
    ROOT / "src" / "gpufleet" / "health" / "metrics.py",
    ROOT / "src" / "gpufleet" / "slurm" / "metrics.py",
]
NAME = re.compile(r"\bgpufleet_[a-z0-9_]+")


def exported() -> set[str]:
    """Metric names as Prometheus exposes them (counters get ``_total``, histograms
    ``_bucket``/``_count``/``_sum``)."""
    names: set[str] = set()
    for path in SOURCES:
        text = path.read_text()
        for m in re.finditer(r"(Counter|Gauge|Histogram)\(\s*\"(gpufleet_[a-z0-9_]+)\"", text):
            kind, name = m.groups()
            base = name.removesuffix("_total")
            if kind == "Counter":
                names.add(base + "_total")
            elif kind == "Histogram":
                names.update(name + s for s in ("_bucket", "_count", "_sum"))
            else:
                names.add(name)
    return names


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
