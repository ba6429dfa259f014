"""The read-only commands against a real apiserver: -o json and -o yaml parse and
name what the cluster holds; a table in a pipe has one line per node; a missing
Node is one error line and exit 2.

The commands run as a user runs them (a subprocess of ``python -m
gpufleet.cli.main``), so the pipe is a real pipe, not a terminal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from controller_harness import Api, install
from waiting import wait_for

from gpufleet.domain import well_known
from gpufleet.provision import machines

MACHINE = "cli-output-m0"


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def info(local_cluster: Any) -> Iterator[Any]:
    api = Api(local_cluster)
    install(api)  # CRDs (idempotent)
    gv = f"/apis/{well_known.GROUP}/{well_known.VERSION}"
    for plural in ("noderemediations", "machines", "fleetpolicies"):
        # A CRD just made Established can answer 429 while its storage initializes.
        wait_for(f"{plural} served", lambda p=plural: api.http.get(f"{gv}/{p}").status_code == 200)
    spec = machines.MachineSpec.model_validate(
        {
            "pool": "cli-output",
            "macs": ["aa:bb:cc:21:00:01"],
            "serial": "SN-cli-output",
            "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": "gpufleet-system/x"},
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
        }
    )
    api.post(
        f"{gv}/machines",
        machines.manifest(MACHINE, spec),
        ok=(201, 409),
    )
    yield local_cluster
    api.http.delete(f"{gv}/machines/{MACHINE}")


def test_nodes_json_and_yaml_name_every_node(info: Any) -> None:
    kube = ["--kubeconfig", str(info.kubeconfig)]
    as_json = gpufleet("nodes", *kube, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)["nodes"]
    assert set(info.node_names) <= {n["name"] for n in listed}
    assert all({"name", "state", "since", "reason", "step", "cordoned"} <= set(n) for n in listed)
    as_yaml = gpufleet("nodes", *kube, "-o", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert [n["name"] for n in yaml.safe_load(as_yaml.stdout)["nodes"]] == [
        n["name"] for n in listed
    ]


def test_nodes_table_in_a_pipe_is_one_line_per_node(info: Any) -> None:
    r = gpufleet("nodes", "--kubeconfig", str(info.kubeconfig), "-o", "wide")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[0].split()
    assert header[0] == "NODE" and {"STATE", "REASON", "INCIDENT", "CORDONED", "POOL"} <= set(
        header
    )
    for name in info.node_names:
        assert len([line for line in lines if line.startswith(name + " ")]) == 1


def test_node_yaml_and_a_missing_node(info: Any) -> None:
    name = info.node_names[0]
    r = gpufleet("node", name, "--kubeconfig", str(info.kubeconfig), "-o", "yaml")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    assert doc["name"] == name and isinstance(doc["history"], list)
    assert {"state", "cordoned", "taints", "conditions", "incident"} <= set(doc)
    missing = gpufleet("node", "no-such-node", "--kubeconfig", str(info.kubeconfig))
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[0] == "error: no Node named no-such-node"


def test_machines_json(info: Any) -> None:
    r = gpufleet("machines", "--kubeconfig", str(info.kubeconfig), "-o", "json")
    assert r.returncode == 0, r.stderr
    mine = [m for m in json.loads(r.stdout)["machines"] if m["name"] == MACHINE]
    assert mine and mine[0]["gpus"] == 8 and mine[0]["macs"] == ["aa:bb:cc:21:00:01"]


def test_status_json_counts_every_node(info: Any) -> None:
    r = gpufleet("status", "--run-dir", str(info.run_dir), "-o", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sum(doc["nodesByState"].values()) >= len(info.node_names)
    assert {p["name"] for p in doc["slurmPartitions"]}  # the cluster runs Slurm
