"""The live ledger's telemetry reader parses each line once across passes: only what a
rank appended since, a half-written line when it is complete, a replaced file again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.domain import goodput as ledger
from gpufleet.lifecycle import goodput
from gpufleet.lifecycle.goodput import TelemetryReader


def line(step: int) -> str:
    doc = {"v": 1, "job": "tr", "run": 0, "rank": 0, "node": "n0", "step": step,
           "compute_s": 0.1, "t": float(step), "group": "g0"}  # fmt: skip
    return json.dumps(doc) + "\n"


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every line the reader hands to the codec."""
    calls: list[str] = []
    real = ledger.progress_of

    def counting(text: str) -> ledger.Progress | None:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(goodput.goodput, "progress_of", counting)
    return calls


def test_each_line_is_parsed_once_and_a_half_line_waits(tmp_path: Path, parsed: list[str]) -> None:
    f = tmp_path / "tr.0" / "rank-0.n0.jsonl"
    f.parent.mkdir()
    half = line(3)
    f.write_text(line(1) + line(2) + half[:10])
    reader = TelemetryReader(tmp_path)
    assert [p.step for p in reader.progress()] == [1, 2]
    with f.open("a") as out:
        out.write(half[10:] + line(4))
    assert [p.step for p in reader.progress()] == [1, 2, 3, 4]
    assert len(parsed) == 4
    assert [p.step for p in reader.progress()] == [1, 2, 3, 4]
    assert len(parsed) == 4  # nothing new: nothing parsed


def test_a_replaced_file_is_read_again_and_a_removed_one_forgotten(
    tmp_path: Path, parsed: list[str]
) -> None:
    run = tmp_path / "tr.0"
    run.mkdir()
    f = run / "rank-0.n0.jsonl"
    other = run / "rank-1.n1.jsonl"
    f.write_text(line(1) + line(2) + line(3))
    other.write_text(line(1).replace('"rank": 0', '"rank": 1').replace('"n0"', '"n1"'))
    reader = TelemetryReader(tmp_path)
    assert len(reader.progress()) == 4
    f.write_text(line(7))
    other.unlink()
    assert [p.step for p in reader.progress()] == [7]
    (run / "notes.txt").write_text(line(9))  # not a rank file
    assert [p.step for p in reader.progress()] == [7]
