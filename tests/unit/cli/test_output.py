"""``-o json`` and ``-o yaml`` print the same data a program can parse; ``-o table``
into a pipe is not wrapped at 80 columns; ``-o wide`` adds columns and cuts nothing."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli import nodes_cmd, provision_cmd
from gpufleet.cli.main import app
from gpufleet.cli.output import Column, table
from gpufleet.demo import status as fleet_status
from gpufleet.domain import well_known
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import (
    Incident,
    NodeRecord,
    StepAttempt,
    record_to_json,
)
from gpufleet.domain.states import NodeState, Transition, Trigger
from gpufleet.lifecycle import nodes
from gpufleet.local.cluster import STATE_FILE, ClusterInfo
from gpufleet.local.processes import ProcessRecord, start_time_of

runner = CliRunner()

T0 = 1_800_000_000.0
LONG_REASON = "XID 79 on GPU 3 (PCI 0000:5d:00): the GPU has fallen off the bus; " * 3


def _parse(fmt: str, text: str) -> Any:
    return json.loads(text) if fmt == "json" else yaml.safe_load(text)


def _node_body() -> dict[str, Any]:
    record = NodeRecord.new("gpu-node-0003", at=T0, state=NodeState.PRODUCTION)
    record = record.moved(
        Transition(NodeState.PRODUCTION, NodeState.REMEDIATING, Trigger.FAULT, LONG_REASON, T0 + 5)
    )
    record = replace(
        record,
        incident=Incident(
            key="xid-79",
            description="GPU fell off the bus",
            opened_at=T0 + 5,
            plan=Step.REBOOT,
            current=Step.REBOOT,
            tried=(StepAttempt(Step.REBOOT, 1, T0 + 10),),
        ),
    )
    return {
        "metadata": {
            "name": "gpu-node-0003",
            "annotations": {
                well_known.ANNOTATION_RECORD: record_to_json(record),
                well_known.ANNOTATION_CORDONED: well_known.CONTROLLER,
            },
        },
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "gpufleet.io/unhealthy", "effect": "NoSchedule"}],
        },
        "status": {
            "conditions": [
                {
                    "type": well_known.CONDITIONS[next(iter(well_known.CONDITIONS))],
                    "status": "True",
                    "reason": "Xid79",
                    "message": "XID 79 on GPU 3 | evidence: {}",
                },
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""},
            ]
        },
    }


def test_a_node_summary_is_what_gpufleet_nodes_prints_as_data() -> None:
    row = nodes_cmd.node_summary(_node_body(), T0 + 20)
    assert row == {
        "name": "gpu-node-0003",
        "state": "remediating",
        "managed": True,
        "since": "2027-01-15T08:00:05Z",
        "reason": LONG_REASON,
        "step": {"step": "reboot", "attempt": 1},
        "incident": "xid-79",
        "cordoned": "gpufleet",
        "pool": "default",
        "lemon": None,
        "spare": False,
    }
    json.dumps(row)  # JSON-ready as it is


def test_node_detail_data_has_history_incident_and_only_gpufleet_conditions() -> None:
    d = nodes_cmd.node_detail_data(_node_body(), [], T0 + 20)
    assert [h["to"] for h in d["history"]] == ["remediating"]
    assert d["history"][0]["reason"] == LONG_REASON  # whole, not cut
    assert d["incident"]["steps"] == [
        {
            "step": "reboot",
            "attempt": 1,
            "startedAt": "2027-01-15T08:00:10Z",
            "endedAt": None,
            "outcome": None,
            "detail": "",
        }
    ]
    assert [c["type"] for c in d["conditions"]] == [next(iter(well_known.CONDITIONS.values()))]
    assert d["conditions"][0]["message"] == "XID 79 on GPU 3"
    assert d["taints"] == [{"key": "gpufleet.io/unhealthy", "effect": "NoSchedule"}]
    assert yaml.safe_load(yaml.safe_dump(d)) == d


def test_a_machine_summary_keeps_numbers_and_lists() -> None:
    body = {
        "metadata": {"name": "m0"},
        "spec": {
            "pool": "h100",
            "macs": ["aa:bb:cc:00:00:01", "aa:bb:cc:00:00:02"],
            "hardware": {"gpuCount": 8, "gpuModel": "H100", "hcaCount": 8},
        },
        "status": {"phase": "Joined", "node": "gpu-node-0100"},
    }
    m = provision_cmd.machine_summary(body)
    assert m == {
        "name": "m0",
        "pool": "h100",
        "gpus": 8,
        "gpuModel": "H100",
        "hcas": 8,
        "macs": ["aa:bb:cc:00:00:01", "aa:bb:cc:00:00:02"],
        "phase": "Joined",
        "armed": True,  # no token issued yet: its next boot gets one
        "node": "gpu-node-0100",
        "boot": None,  # never powered on through gpufleet
    }
    failed = {"outcome": "Failed", "reason": "ImageDidNotBoot", "attempt": 3}
    assert provision_cmd.machine_summary({**body, "status": {"boot": failed}})["boot"] == (
        "Failed ImageDidNotBoot #3"
    )


def test_fleet_status_as_data() -> None:
    st = fleet_status.FleetStatus(
        by_state=Counter({"production": 3, "remediating": 1}),
        out=[("gpu-node-0003", "remediating", "xid 79", "GpuProblem: Xid79")],
        partitions=[("batch", "up", "2/1/1/4")],
        breakers=[("default", False, 1, 2)],
    )
    d = fleet_status.to_data(st)
    assert d["nodesByState"] == {"production": 3, "remediating": 1}
    assert d["slurmPartitions"] == [
        {
            "name": "batch",
            "avail": "up",
            "nodes": {"allocated": 2, "idle": 1, "other": 1, "total": 4},
        }
    ]
    assert d["breakers"] == [
        {"fleetPolicy": "default", "open": False, "faultingNodes": 1, "faultsWaiting": 2}
    ]
    assert d["nodesOut"][0]["why"] == "xid 79"


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_health_check_structured_output(fmt: str) -> None:
    r = runner.invoke(
        app, ["health", "check", "--backend", "simulated", "--inject", "xid=79,gpu=3", "-o", fmt]
    )
    assert r.exit_code == 2, r.output  # a failed check: Nagios critical
    doc = _parse(fmt, r.stdout)
    assert doc["status"] == "fail" and doc["backend"] == "simulated"
    failed = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["gpu-xid"]
    assert failed[0]["faults"][0]["xid"] == 79


def test_health_check_json_flag_is_o_json() -> None:
    args = ["health", "check", "--backend", "simulated", "--checks", "gpu-count,nvlink"]
    old = runner.invoke(app, [*args, "--json"])
    new = runner.invoke(app, [*args, "-o", "json"])
    assert old.exit_code == new.exit_code == 0
    strip = [
        {k: v for k, v in c.items() if k != "duration_s"} for c in json.loads(old.stdout)["checks"]
    ]
    assert strip == [
        {k: v for k, v in c.items() if k != "duration_s"} for c in json.loads(new.stdout)["checks"]
    ]


def test_health_check_wide_adds_the_faults_column() -> None:
    args = ["health", "check", "--backend", "simulated", "--inject", "xid=79,gpu=3"]
    narrow = runner.invoke(app, args).stdout.splitlines()
    wide = runner.invoke(app, [*args, "-o", "wide"]).stdout.splitlines()
    assert "FAULTS" not in narrow[1] and "FAULTS" in wide[1]
    assert any(line.startswith("gpu-xid") and line.rstrip().endswith("xid-79") for line in wide)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_version_structured(fmt: str) -> None:
    r = runner.invoke(app, ["version", "-o", fmt])
    assert r.exit_code == 0
    doc = _parse(fmt, r.stdout)
    assert set(doc) == {"gpufleet", "python"} and doc["gpufleet"][0].isdigit()
    flag = runner.invoke(app, ["--version"])
    assert flag.exit_code == 0 and flag.stdout.strip() == f"gpufleet {doc['gpufleet']}"


def _local_cluster(tmp_path: Path) -> Path:
    run_dir = tmp_path / "cluster"
    run_dir.mkdir(parents=True)
    me = ProcessRecord(  # this test's own process: alive for as long as the test runs
        name="kube-apiserver",
        pid=os.getpid(),
        start_time=start_time_of(os.getpid()),
        log=str(run_dir / "logs" / "apiserver.log"),
    )
    info = ClusterInfo(
        run_dir=run_dir,
        node_names=["gpu-node-0000"],
        gpus_per_node=8,
        kubeconfig=run_dir / "kubeconfig",
        apiserver_url="https://127.0.0.1:1",
        token="t",
        ca_file=run_dir / "ca.crt",
        etcd_url="http://127.0.0.1:2",
        processes=[me],
    )
    (run_dir / STATE_FILE).write_text(info.to_json())
    return run_dir


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_local_status_structured(tmp_path: Path, fmt: str) -> None:
    run_dir = _local_cluster(tmp_path)
    r = runner.invoke(app, ["local", "status", "--run-dir", str(run_dir), "-o", fmt])
    assert r.exit_code == 0, r.output
    doc = _parse(fmt, r.stdout)
    assert doc["runDir"] == str(run_dir)
    assert doc["components"] == [
        {
            "name": "kube-apiserver",
            "pid": os.getpid(),
            "running": True,
            "log": str(run_dir / "logs" / "apiserver.log"),
        }
    ]
    assert any(line.startswith("export KUBECONFIG=") for line in doc["env"])


def test_a_table_in_a_pipe_is_as_wide_as_its_content(tmp_path: Path) -> None:
    run_dir = _local_cluster(tmp_path / ("a-long-directory-name-" * 4))
    r = runner.invoke(app, ["local", "status", "--run-dir", str(run_dir), "-o", "wide"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    row = next(line for line in lines if line.startswith("kube-apiserver"))
    assert row.rstrip().endswith("apiserver.log")  # one line, not wrapped at 80
    assert len(row) > 100
    assert all(line == line.rstrip() for line in lines)  # no padding to the width
    narrow = runner.invoke(app, ["local", "status", "--run-dir", str(run_dir)]).stdout
    assert "LOG" not in narrow and "LOG" in lines[1]


def test_table_cuts_long_text_only_in_table_mode() -> None:
    columns = (Column("NAME"), Column("REASON", cut=20), Column("EXTRA", wide=True))
    rows = [("n1", "x" * 50, "more")]
    narrow, wide = table(columns, rows, wide=False), table(columns, rows, wide=True)
    assert len(narrow.columns) == 2 and len(wide.columns) == 3
    assert narrow.columns[1]._cells[0].plain == "x" * 17 + "..."  # type: ignore[attr-defined]
    assert wide.columns[1]._cells[0].plain == "x" * 50  # type: ignore[attr-defined]


def test_gpufleet_nodes_shows_the_lemon_score_decayed_to_now() -> None:
    from gpufleet.domain import lemon

    body = _node_body()
    record = nodes.record_of(body, T0)[0]
    score = lemon.add(None, weight=2.0, scope="gpu3", now=T0, half_life_seconds=86400.0)
    body["metadata"]["annotations"][well_known.ANNOTATION_RECORD] = record_to_json(
        replace(record, lemon=score)
    )
    row = nodes_cmd.node_summary(body, T0 + 86400.0)
    assert row["lemon"] == {"score": 1.0, "gpus": {"gpu3": 1.0}}
    assert nodes_cmd._lemon_cell(row["lemon"]) == "1.00 (gpu3 1.00)"
    assert nodes_cmd.node_detail_data(body, [], T0 + 2 * 86400.0)["lemon"]["score"] == 0.5


def test_gpufleet_nodes_marks_a_hot_spare() -> None:
    body = _node_body()
    record = nodes.record_of(body, T0)[0]
    spare = replace(record, state=NodeState.PRODUCTION, incident=None, spare=True)
    body["metadata"]["annotations"][well_known.ANNOTATION_RECORD] = record_to_json(spare)
    row = nodes_cmd.node_summary(body, T0)
    assert row["spare"] is True
    assert nodes_cmd._node_cells(row, T0)[1] == "production (spare)"
