"""``gpufleet goodput`` offline: a telemetry directory and NodeRemediations from a file."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.main import app

runner = CliRunner()


def write_rank(
    root: Path, training: str, run: int, rank: int, node: str, steps: range, t0: float, group: str
) -> None:
    d = root / f"{training}.{run}"
    d.mkdir(parents=True, exist_ok=True)
    with (d / f"rank-{rank}.{node}.jsonl").open("a") as f:
        for i, step in enumerate(steps):
            line = {
                "v": 1,
                "job": training,
                "run": run,
                "rank": rank,
                "node": node,
                "step": step,
                "compute_s": 0.5,
                "t": t0 + i,
                "group": group,
            }
            f.write(json.dumps(line) + "\n")
        f.write('{"half a line')


def remediation(name: str, node: str, started: str, step: str, completed: str | None) -> dict:
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "NodeRemediation",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "gpufleet-controller"},
        },
        "spec": {"node": node, "fault": "xid-79"},
        "status": {
            "startedAt": started,
            "steps": [{"step": "gpu-reset", "startedAt": step}],
            "completedAt": completed,
        },
    }


def test_goodput_charges_a_replaced_group_from_files(tmp_path: Path) -> None:
    tel = tmp_path / "telemetry"
    write_rank(tel, "llm", 0, 0, "n0", range(1, 101), 1.0, "g0")
    write_rank(tel, "llm", 0, 1, "n1", range(1, 41), 1.0, "g1")
    write_rank(tel, "llm", 0, 1, "n9", range(71, 101), 71.0, "g1")
    nrem = tmp_path / "nrem.json"
    forged = remediation("forged", "n1", "1970-01-01T00:00:41Z", "1970-01-01T00:00:42Z", None)
    forged["metadata"].pop("labels")
    nrem.write_text(
        json.dumps(
            {
                "items": [
                    remediation(
                        "n1-50000",
                        "n1",
                        "1970-01-01T00:00:50Z",
                        "1970-01-01T00:00:55Z",
                        "1970-01-01T00:10:00Z",
                    ),
                    remediation(
                        "n5-20000", "n5", "1970-01-01T00:00:20Z", "1970-01-01T00:00:21Z", None
                    ),
                ]
            }
        )
    )
    png = tmp_path / "g.png"
    r = runner.invoke(
        app,
        [
            "goodput",
            "--telemetry",
            str(tel),
            "--remediations",
            str(nrem),
            "-o",
            "json",
            "--plot",
            str(png),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    (t,) = data["trainings"]
    assert t["ranks"] == 2 and t["groups"] == 2 and t["allocatedGpuSeconds"] == 200.0
    assert t["lostGpuSeconds"] == {
        "detection": 10.0,
        "isolation": 5.0,
        "recovery": 15.0,
        "redone": 0.0,
        "degraded": 0.0,
    }
    by_name = {i["name"]: i for i in data["incidents"]}
    assert sum(by_name["n1-50000"]["lostGpuSeconds"].values()) == 30.0
    assert sum(by_name["n5-20000"]["lostGpuSeconds"].values()) == 0.0
    assert "forged" not in by_name  # not the controller's: neither charged nor written
    assert data["goodput"] == 0.85
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = runner.invoke(app, ["goodput", "--telemetry", str(tel), "--remediations", str(nrem)])
    assert table.exit_code == 0, table.output
    assert "n1-50000" in table.output and "n5-20000" not in table.output
    assert "goodput 85.00%" in table.output


def test_goodput_refuses_to_write_status_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "nrem.json"
    f.write_text("[]")
    r = runner.invoke(
        app, ["goodput", "--telemetry", str(tmp_path), "--remediations", str(f), "--write-status"]
    )
    assert r.exit_code != 0
    assert "--remediations" in r.output
