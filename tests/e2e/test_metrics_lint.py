"""Every component's real /metrics passes ``promtool check metrics`` (the Prometheus
project's own lint: names, types, units, HELP), scraped from the processes of the demo
fleet: the agents, the controller, the Slurm syncer and the provisioning service.

promtool is built from the Go module proxy into the gpufleet cache by
scripts/build-promtool.sh (scripts/bootstrap-system.sh runs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from gpufleet.demo.runner import Demo

pytestmark = pytest.mark.e2e


def promtool_binary() -> str | None:
    cache = Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet")) / "bin"
    for found in sorted(cache.glob("promtool-*/promtool"), reverse=True):
        if os.access(found, os.X_OK):
            return str(found)
    return shutil.which("promtool")


@pytest.fixture(scope="module")
def promtool() -> str:
    path = promtool_binary()
    assert path is not None, "promtool is not built: run scripts/build-promtool.sh"
    return path


def lint(promtool: str, url: str) -> str:
    """The exposition at ``url``, after promtool found nothing to say about it."""
    text = httpx.get(url, timeout=10).text
    r = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and not r.stdout.strip(), f"{url}:\n{r.stdout}{r.stderr}"
    return text


def test_every_component_exposes_metrics_promtool_accepts(demo: Demo, promtool: str) -> None:
    fleet = demo.fleet
    texts = {}
    for node, port in sorted(fleet.ports.agent_metrics.items()):
        if node in fleet.agents:
            texts[f"agent {node}"] = lint(promtool, f"http://127.0.0.1:{port}/metrics")
    texts["controller"] = lint(
        promtool, f"http://127.0.0.1:{fleet.ports.controller_metrics}/metrics"
    )
    texts["syncer"] = lint(promtool, f"http://127.0.0.1:{fleet.ports.syncer_metrics}/metrics")
    texts["provisioning"] = lint(promtool, f"{fleet.start_provisioning()}/metrics")
    agents = [t for k, t in texts.items() if k.startswith("agent ")]
    assert agents, "no agent was running"
    # The scrapes are the components' own, not empty pages: one series each that only
    # that component exports.
    assert all('UUID="GPU-' in t and "gpufleet_ib_port_symbol_errors_total{" in t for t in agents)
    assert "gpufleet_policy_valid 1.0" in texts["controller"]
    assert "gpufleet_syncer_passes_total" in texts["syncer"]
    assert "# HELP gpufleet_provision_requests_total " in texts["provisioning"]


def test_the_syncer_does_not_log_every_http_request(demo: Demo) -> None:
    """httpx logs each request at INFO; the syncer polls every half second here, so its
    log would be nearly all "HTTP Request:" lines."""
    syncer = demo.fleet.syncer
    assert syncer is not None and syncer.poll() is None
    text = Path(syncer.log).read_text(errors="replace")
    assert "metrics on http://" in text  # the log is the syncer's, and it logs at INFO
    assert "HTTP Request:" not in text
