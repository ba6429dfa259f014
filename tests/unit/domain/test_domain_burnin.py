"""The domain burn-in's plan and verdict, and the nccl-tests codec it reads (real
all_reduce_perf layout: header rank lines, the out-of-place/in-place table, the
out-of-bounds and average lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.domain import domain_burnin as db
from gpufleet.domain import nccl_tests
from gpufleet.domain.nccl_tests import NcclTestsResult

FIXTURES = Path(__file__).parents[2] / "fixtures" / "health"
TWO_NODES = (FIXTURES / "nccl-tests-all-reduce-2nodes.txt").read_text()

WRONG = (FIXTURES / "nccl-tests-all-reduce-wrong.txt").read_text()


def test_the_codec_reads_all_reduce_perf_with_its_ranks_and_hosts() -> None:
    r = nccl_tests.parse(TWO_NODES)
    assert r is not None and r.peak_busbw == pytest.approx(703.42)
    assert r.avg_busbw == pytest.approx(378.6625) and r.correct
    assert r.hosts[0] == "gb200-r07-t01" and r.hosts[7] == "gb200-r07-t02" and len(r.hosts) == 8
    assert len(r.busbw_by_size) == 6


def test_wrong_elements_and_out_of_bounds_values_make_a_run_incorrect() -> None:
    r = nccl_tests.parse(WRONG)
    assert r is not None and r.wrong == 16 and r.out_of_bounds == 16 and not r.correct


def test_a_run_that_printed_no_table_is_no_result() -> None:
    text = "gb200-r07-t01: Test NCCL failure common.cu:1012 'unhandled system error'\n"
    assert nccl_tests.parse(text) is None


def test_one_output_holds_several_runs_each_after_its_mark() -> None:
    text = "noise before\n# gpufleet test: domain\n" + TWO_NODES + "\n# gpufleet test: pair:a,b\n"
    runs = nccl_tests.parse_runs(text + WRONG)
    assert set(runs) == {"domain", "pair:a,b"}
    assert runs["domain"] is not None and runs["domain"].correct
    assert runs["pair:a,b"] is not None and not runs["pair:a,b"].correct


def test_pairs_are_ring_neighbours_in_disjoint_phases() -> None:
    assert db.ring_pairs(["c", "a", "b"]) == [("a", "b"), ("b", "c"), ("c", "a")]
    assert db.ring_pairs(["a", "b"]) == [("a", "b")] and db.ring_pairs(["a"]) == []
    four = db.pair_phases(["a", "b", "c", "d"])
    assert four == [[("a", "b"), ("c", "d")], [("b", "c"), ("d", "a")]]
    assert len(db.pair_phases(["a", "b", "c"])) == 3
    plan = db.runs(["b", "a", "c"])
    assert plan[0] == [(db.DOMAIN_TEST, ["a", "b", "c"])]
    assert [name for phase in plan[1:] for name, _ in phase] == [
        "pair:a,b",
        "pair:b,c",
        "pair:a,c",
    ]


def _run(bw: float, wrong: int = 0) -> NcclTestsResult:
    return NcclTestsResult({1 << 20: bw / 2, 1 << 23: bw}, bw, wrong)


def _runs(trays: list[str], domain: float, pairs: dict[tuple[str, str], NcclTestsResult | None]):
    runs: dict[str, NcclTestsResult | None] = {db.DOMAIN_TEST: _run(domain)}
    for (a, b), r in pairs.items():
        runs[db.pair_test(a, b)] = r
    return runs


TRAYS = ["t1", "t2", "t3", "t4"]
HEALTHY = {p: _run(1.0 + i / 10) for i, p in enumerate(db.ring_pairs(TRAYS))}


def test_a_healthy_domain_passes_with_its_bandwidth() -> None:
    v = db.judge("nvl-7", TRAYS, _runs(TRAYS, 0.9, HEALTHY), db.Limits())
    assert v.passed and v.bad == () and v.busbw_gbps == 0.9
    assert "every sum correct" in v.reason and set(v.pairs) == {
        db.pair_test(*p) for p in db.ring_pairs(TRAYS)
    }


def test_a_slow_tray_spoils_both_its_pairs_and_is_named() -> None:
    pairs = dict(HEALTHY)
    pairs[("t2", "t3")] = _run(0.05)
    pairs[("t1", "t2")] = _run(0.04)
    v = db.judge("nvl-7", TRAYS, _runs(TRAYS, 0.3, pairs), db.Limits())
    assert not v.passed and v.bad == ("t2",)
    assert "tray t2 is bad in every pair it is in" in v.reason


def test_in_a_domain_of_three_the_slow_tray_is_named_though_it_is_in_most_pairs() -> None:
    trays = ["a", "b", "c"]
    pairs = {("a", "b"): _run(0.01), ("b", "c"): _run(0.01), ("c", "a"): _run(1.0)}
    v = db.judge("d", trays, _runs(trays, 0.01, pairs), db.Limits())
    assert not v.passed and v.bad == ("b",)


def test_a_wrong_sum_fails_the_domain_and_names_the_tray_of_both_wrong_pairs() -> None:
    pairs = dict(HEALTHY)
    pairs[("t3", "t4")] = _run(1.0, wrong=8)
    pairs[("t2", "t3")] = _run(1.0, wrong=8)
    runs = _runs(TRAYS, 1.0, pairs)
    runs[db.DOMAIN_TEST] = _run(1.0, wrong=32)
    v = db.judge("d", TRAYS, runs, db.Limits())
    assert not v.passed and v.bad == ("t3",) and "summed wrong" in v.reason


def test_one_bad_pair_between_good_trays_fails_the_domain_and_names_nobody() -> None:
    pairs = dict(HEALTHY)
    pairs[("t1", "t2")] = _run(0.1)
    v = db.judge("d", TRAYS, _runs(TRAYS, 1.0, pairs), db.Limits())
    assert not v.passed and v.bad == () and "no single tray explains it" in v.reason


def test_below_the_minimum_or_without_a_result_the_domain_fails() -> None:
    v = db.judge("d", TRAYS, _runs(TRAYS, 0.9, HEALTHY), db.Limits(min_busbw_gbps=500))
    assert not v.passed and "below the minimum 500 GB/s" in v.reason and v.bad == ()
    runs = _runs(TRAYS, 0.9, HEALTHY)
    del runs[db.DOMAIN_TEST]
    v = db.judge("d", TRAYS, runs, db.Limits())
    assert not v.passed and v.busbw_gbps is None and "gave no result" in v.reason


def test_two_trays_are_one_pair_and_neither_can_be_named() -> None:
    v = db.judge("d", ["a", "b"], _runs(["a", "b"], 0.9, {("a", "b"): None}), db.Limits())
    assert not v.passed and v.bad == ()


def test_a_missing_pair_counts_against_its_trays() -> None:
    pairs: dict[tuple[str, str], NcclTestsResult | None] = dict(HEALTHY)
    pairs[("t3", "t4")] = None
    pairs[("t4", "t1")] = None
    v = db.judge("d", TRAYS, _runs(TRAYS, 0.9, pairs), db.Limits())
    assert v.bad == ("t4",) and "no result" in v.reason


def test_the_kept_verdict_reads_back_and_anything_else_is_none() -> None:
    kept = db.Recorded("nvl-7", False, 1700.0, "slow", ("t2",))
    assert db.read_recorded(kept.to_json()) == kept
    assert db.read_recorded(None) is None and db.read_recorded("{") is None
    assert db.read_recorded('{"passed": true}') is None
