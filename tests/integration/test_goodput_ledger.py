"""The goodput ledger against a real apiserver: ``gpufleet goodput --write-status`` charges
a replaced replica group to the controller's NodeRemediation and writes ``status.goodput``
beside the controller's own status (once: a second pass writes nothing), leaves an open
incident and a forged one alone, serves the ``gpufleet_goodput_*`` metrics, and
``gpufleet status`` shows the ledger's line.

The commands run as a user runs them (``python -m gpufleet.cli.main``). The CRD is the
repository's (``status.goodput`` in its schema: an older one would prune it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from controller_harness import CRDS, GV, Api, install
from controller_harness import gpufleet_cli as gpufleet
from waiting import wait_for

from gpufleet.domain import well_known

PREFIX = "goodput-it"
CLOSED = f"{PREFIX}-n1"
OPEN = f"{PREFIX}-n5"
FORGED = f"{PREFIX}-forged"


def _current_crd(api: Api) -> None:
    """The repository's NodeRemediation CRD in place (a reused cluster may hold an older one)."""
    crd = yaml.safe_load((CRDS / "noderemediations.yaml").read_text())
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    live = api.get(path)
    if live["spec"] != crd["spec"]:
        crd["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        r = api.http.put(path, json=crd)
        assert r.status_code == 200, r.text[:500]


def _remediation(api: Api, name: str, node: str, status: dict[str, Any], ours: bool) -> None:
    labels = {well_known.LABEL_MANAGED_BY: well_known.CONTROLLER} if ours else {}
    body = {
        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
        "kind": "NodeRemediation",
        "metadata": {"name": name, "labels": labels},
        "spec": {"node": node, "fault": "xid-79", "plan": "gpu-reset", "ladder": ["gpu-reset"]},
    }
    api.post(f"{GV}/noderemediations", body, ok=(201,))
    api.patch(f"{GV}/noderemediations/{name}/status", {"status": status})


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def _telemetry(root: Path, t0: float) -> None:
    """Training ``llm``: group g0 on n0 steps 1..100; group g1 on n1 stops after step 40
    and its replacement on n9 runs steps 71..100; one step a second."""

    def rank(rank: int, node: str, steps: range, start: float, group: str) -> None:
        d = root / "llm.0"
        d.mkdir(parents=True, exist_ok=True)
        with (d / f"rank-{rank}.{PREFIX}-{node}.jsonl").open("a") as f:
            for i, step in enumerate(steps):
                line = {"v": 1, "job": "llm", "run": 0, "rank": rank,
                        "node": f"{PREFIX}-{node}", "step": step, "compute_s": 0.5,
                        "t": start + i, "group": group}  # fmt: skip
                f.write(json.dumps(line) + "\n")

    rank(0, "n0", range(1, 101), t0 + 1, "g0")
    rank(1, "n1", range(1, 41), t0 + 1, "g1")
    rank(1, "n9", range(71, 101), t0 + 71, "g1")


@pytest.fixture(scope="module")
def env(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    api = Api(local_cluster)
    install(api)
    _current_crd(api)
    wait_for("noderemediations served", lambda: api.http.get(f"{GV}/noderemediations").is_success)
    t0 = 1_700_000_000.0
    tel = tmp_path_factory.mktemp("telemetry")
    _telemetry(tel, t0)
    closed = {
        "phase": "Succeeded",
        "startedAt": _iso(t0 + 50),
        "steps": [{"step": "gpu-reset", "attempt": 1, "startedAt": _iso(t0 + 55),
                   "endedAt": _iso(t0 + 90), "outcome": "succeeded", "detail": ""}],
        "completedAt": _iso(t0 + 600),
        "outcome": "repaired",
    }  # fmt: skip
    _remediation(api, CLOSED, f"{PREFIX}-n1", closed, ours=True)
    _remediation(api, OPEN, f"{PREFIX}-n5", {"phase": "Draining", "startedAt": _iso(t0 + 20)}, True)
    forged = {**closed, "startedAt": _iso(t0 + 41)}
    _remediation(api, FORGED, f"{PREFIX}-n1", forged, ours=False)
    yield local_cluster, api, tel
    for name in (CLOSED, OPEN, FORGED):
        api.delete(f"{GV}/noderemediations/{name}")


def test_write_status_charges_the_closed_incident_once(env: Any) -> None:
    info, api, tel = env
    kube = ["--kubeconfig", str(info.kubeconfig), "--telemetry", str(tel)]
    r = gpufleet("goodput", *kube, "--write-status", "-o", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    (llm,) = [t for t in data["trainings"] if t["training"] == "llm"]
    assert llm["lostGpuSeconds"] == {
        "detection": 10.0, "isolation": 5.0, "recovery": 15.0, "redone": 0.0, "degraded": 0.0
    }  # fmt: skip
    assert llm["goodput"] == 0.85
    closed = api.get(f"{GV}/noderemediations/{CLOSED}")
    assert closed["status"]["goodput"] == {
        "lostGpuSeconds": llm["lostGpuSeconds"],
        "trainings": ["llm"],
    }
    assert closed["status"]["phase"] == "Succeeded"  # the controller's fields kept
    assert "goodput" not in api.get(f"{GV}/noderemediations/{OPEN}")["status"]
    assert "goodput" not in api.get(f"{GV}/noderemediations/{FORGED}")["status"]
    version = closed["metadata"]["resourceVersion"]
    again = gpufleet("goodput", *kube, "--write-status", "-o", "json")
    assert again.returncode == 0, again.stderr
    assert api.get(f"{GV}/noderemediations/{CLOSED}")["metadata"]["resourceVersion"] == version
    status = gpufleet("status", "--kubeconfig", str(info.kubeconfig))
    assert status.returncode == 0, status.stderr
    assert "goodput ledger" in status.stdout
    # The session's cluster may hold other modules' NodeRemediations, some charged too: the
    # status must sum exactly those that carry a goodput (this one once), whatever they are.
    shown = gpufleet("status", "--kubeconfig", str(info.kubeconfig), "-o", "json")
    assert shown.returncode == 0, shown.stderr
    ledger = json.loads(shown.stdout)["goodput"]
    charged = [
        item["status"]["goodput"]
        for item in api.get(f"{GV}/noderemediations")["items"]
        if "goodput" in (item.get("status") or {})
    ]
    assert closed["status"]["goodput"] in charged
    assert ledger["incidents"] == len(charged)
    for category, seconds in llm["lostGpuSeconds"].items():
        total = sum(g["lostGpuSeconds"].get(category, 0.0) for g in charged)
        assert ledger["lostGpuSeconds"][category] == pytest.approx(total)
        assert total >= seconds


def test_serve_publishes_the_ledger_as_metrics(env: Any) -> None:
    info, _api, tel = env
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli.main", "goodput", "--kubeconfig",
         str(info.kubeconfig), "--telemetry", str(tel), "--serve", "0", "--every", "1",
         "--metrics-address", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "/metrics on port" in line, line
        url = f"http://127.0.0.1:{int(line.rsplit(' ', 1)[1])}/metrics"

        def recovery_published() -> bool:
            text = httpx.get(url, timeout=5).text
            return 'gpufleet_goodput_lost_gpu_seconds{category="recovery"} 15.0' in text

        wait_for("the ledger on /metrics", recovery_published, timeout=30)
        text = httpx.get(url, timeout=5).text
        assert "gpufleet_goodput_productive_gpu_seconds 170.0" in text
        assert "gpufleet_goodput_allocated_gpu_seconds 200.0" in text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
