"""The replica groups' vote on their weights (gpufleet.domain.sdc_vote) and the
telemetry fields it reads (gpufleet.domain.stragglers)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.sdc_vote import LossRule, Outcome, loss_outliers, vote, vote_step
from gpufleet.domain.stragglers import StepSample, parse_sample, sample_line

GOOD, BAD, OTHER = "00112233445566aa", "00112233445566ab", "ffeeddccbbaa9988"


def fp(
    group: str,
    node: str,
    step: int,
    value: str | None,
    *,
    rank: int = 0,
    gpu: int = 0,
    at: float | None = None,
    loss: float | None = None,
) -> StepSample:
    """One rank's line of a replica-group training (rank unique over the training)."""
    return StepSample(
        "train",
        0,
        rank,
        node,
        step,
        0.1,
        1000.0 + step if at is None else at,
        group=group,
        fingerprint=value,
        loss=loss,
        gpu=gpu,
    )


def groups(values: dict[str, str], step: int = 10) -> list[StepSample]:
    """One rank per group, group gN on node nN."""
    return [fp(g, "n" + g[1:], step, v, rank=i) for i, (g, v) in enumerate(values.items())]


def test_three_groups_one_differs_its_node_is_named() -> None:
    samples = groups({"g0": GOOD, "g1": BAD, "g2": GOOD})
    verdict = vote(10, samples)
    assert verdict.outcome is Outcome.NAMED and verdict.groups == 3
    (s,) = verdict.named
    assert (s.node, s.group, s.fingerprint, s.expected) == ("n1", "g1", BAD, GOOD)
    assert (s.agreeing, s.witnesses, s.within_group, s.gpus) == (2, 3, False, (0,))
    assert verdict.to_check == () and verdict.suspect("n0") is None


def test_all_agree() -> None:
    verdict = vote(10, groups({"g0": GOOD, "g1": GOOD, "g2": GOOD}))
    assert (verdict.outcome, verdict.named, verdict.to_check) == (Outcome.AGREE, (), ())


def test_two_groups_that_disagree_are_both_to_be_checked() -> None:
    verdict = vote(10, groups({"g0": GOOD, "g1": BAD}))
    assert verdict.outcome is Outcome.NO_MAJORITY
    assert verdict.named == () and verdict.to_check == ("n0", "n1")


def test_a_tie_of_four_groups_trusts_nobody() -> None:
    verdict = vote(10, groups({"g0": GOOD, "g1": BAD, "g2": GOOD, "g3": BAD}))
    assert verdict.outcome is Outcome.NO_MAJORITY
    assert verdict.to_check == ("n0", "n1", "n2", "n3")


def test_three_groups_all_different_trust_nobody() -> None:
    verdict = vote(10, groups({"g0": GOOD, "g1": BAD, "g2": OTHER}))
    assert verdict.outcome is Outcome.NO_MAJORITY and len(verdict.to_check) == 3


def test_a_node_that_differs_from_its_own_group_is_named_directly() -> None:
    """Group g0 spans three nodes; one of them holds other weights than its two peers,
    even with only one group (no vote across groups possible)."""
    samples = [
        fp("g0", "a", 10, GOOD, rank=0, gpu=0),
        fp("g0", "b", 10, BAD, rank=1, gpu=6),
        fp("g0", "c", 10, GOOD, rank=2, gpu=0),
    ]
    verdict = vote(10, samples)
    (s,) = verdict.named
    assert (s.node, s.gpus, s.within_group, s.agreeing, s.witnesses) == ("b", (6,), True, 2, 3)
    # With a second group that agrees with g0's majority, the same node is named.
    verdict = vote(10, [*samples, fp("g1", "d", 10, GOOD, rank=3)])
    assert [x.node for x in verdict.named] == ["b"] and verdict.to_check == ()


def test_a_group_split_in_two_is_judged_by_the_other_groups() -> None:
    split = [fp("g0", "a", 10, GOOD, rank=0), fp("g0", "b", 10, BAD, rank=1)]
    alone = vote(10, split)
    assert alone.outcome is Outcome.NO_MAJORITY and alone.to_check == ("a", "b")
    verdict = vote(10, [*split, fp("g1", "c", 10, GOOD, rank=2), fp("g2", "d", 10, GOOD, rank=3)])
    assert [s.node for s in verdict.named] == ["b"] and verdict.to_check == ()


def test_missing_fingerprints_and_other_steps_do_not_vote() -> None:
    samples = [
        *groups({"g0": GOOD, "g1": BAD, "g2": GOOD}, step=10),
        fp("g1", "n1", 11, None, rank=1),  # no fingerprint at this step
        fp("g0", "n0", 15, GOOD, rank=0),
    ]
    assert vote(11, samples).groups == 0 and vote(11, samples).outcome is Outcome.AGREE
    assert vote(15, samples).outcome is Outcome.AGREE  # one group: nothing to compare
    assert vote(10, samples).outcome is Outcome.NAMED


def test_the_vote_step_is_the_newest_that_every_live_rank_has_written() -> None:
    samples = groups({"g0": GOOD, "g1": BAD, "g2": GOOD}, step=10)
    samples += [fp("g0", "n0", 15, GOOD, rank=0), fp("g2", "n2", 15, GOOD, rank=2)]
    assert vote_step(samples) == 10  # g1 has not reached step 15 yet
    samples.append(fp("g1", "n1", 15, BAD, rank=1))
    assert vote_step(samples) == 15
    samples += [fp("g0", "n0", 20, None, rank=0), fp("g2", "n2", 20, GOOD, rank=2)]
    samples.append(fp("g1", "n1", 20, GOOD, rank=1))
    assert vote_step(samples) == 15  # g0 wrote step 20 without its fingerprint


def test_the_vote_step_does_not_wait_for_a_departed_group_or_ask_a_late_one() -> None:
    samples = groups({"g0": GOOD, "g1": GOOD, "g2": GOOD}, step=10)
    samples += [
        fp("g0", "n0", 20, GOOD, rank=0, at=1500.0),
        fp("g2", "n2", 20, GOOD, rank=2, at=1500.0),
        fp("g1", "n9", 18, None, rank=1, at=1490.0),  # g1 replaced on n9: joined at step 18
    ]
    # g1's first rank file (n1) stopped at step 10, 490 s before the newest line: gone.
    assert vote_step(samples) == 10  # g1 on n9 has not reached 20 yet
    samples.append(fp("g1", "n9", 20, GOOD, rank=1, at=1501.0))
    assert vote_step(samples) == 20
    assert vote_step([fp("g0", "a", 5, GOOD)]) is None
    assert vote_step([StepSample("j", 0, 0, "a", 5, 0.1, 1.0)]) is None


def test_a_rank_that_wrote_a_step_twice_is_judged_by_its_last_line() -> None:
    samples = [*groups({"g0": GOOD, "g1": GOOD, "g2": GOOD}), fp("g1", "n1", 10, BAD, rank=1)]
    assert [s.node for s in vote(10, samples).named] == ["n1"]


def losses(values: dict[str, list[float]]) -> list[StepSample]:
    out = []
    for i, (g, vs) in enumerate(values.items()):
        for step, v in enumerate(vs, start=1):
            out.append(fp(g, "n" + g[1:], step, None, rank=i, loss=v))
    return out


NOISE = [2.30, 2.28, 2.31, 2.27, 2.29, 2.26, 2.30, 2.25, 2.28, 2.24]


def test_a_loss_spike_of_one_group_makes_its_nodes_to_be_checked() -> None:
    rule = LossRule(factor=6.0, window_steps=10, min_steps=3)
    spiked = [*NOISE[:6], 9.0, 8.5, math.nan, 8.0]
    samples = losses(
        {
            "g0": NOISE,
            "g1": [v + 0.01 for v in NOISE],
            "g2": spiked,
            "g3": [v - 0.01 for v in NOISE],
        }
    )
    (out,) = loss_outliers(samples, rule)
    assert (out.group, out.nodes, out.metric, out.steps, out.last_step) == (
        "g2",
        ("n2",),
        "loss",
        4,
        10,
    )
    assert out.value == 8.0 and 2.2 < out.median < 2.3


def test_one_odd_step_or_two_groups_are_not_an_outlier() -> None:
    rule = LossRule(factor=6.0, window_steps=10, min_steps=3)
    once = [*NOISE[:9], 9.0]
    assert loss_outliers(losses({"g0": NOISE, "g1": once, "g2": NOISE}), rule) == []
    spiked = [*NOISE[:6], 9.0, 8.5, 8.7, 8.0]
    assert loss_outliers(losses({"g0": NOISE, "g1": spiked}), rule) == []  # who is right?


def test_the_codec_reads_and_writes_the_replica_group_fields() -> None:
    s = StepSample(
        "train",
        0,
        5,
        "n1",
        10,
        0.1,
        1000.0,
        group="g-1",
        fingerprint=GOOD,
        loss=2.5,
        grad_norm=0.75,
        gpu=6,
    )
    assert parse_sample(sample_line(s)) == s
    plain = StepSample("7", 0, 0, "n1", 1, 0.1, 1.0)
    assert "group" not in sample_line(plain) and parse_sample(sample_line(plain)) == plain
    diverged = parse_sample(sample_line(StepSample("t", 0, 0, "n", 1, 0.1, 1.0, loss=math.nan)))
    assert diverged is not None and diverged.loss is not None and math.isnan(diverged.loss)


@pytest.mark.parametrize(
    "field",
    [
        {"group": "g 1"},
        {"group": "x" * 65},
        {"group": 3},
        {"fingerprint": "00112233445566AA"},
        {"fingerprint": "0011223344556"},
        {"loss": "2.3"},
        {"grad_norm": True},
        {"gpu": -1},
        {"gpu": 1.5},
        {"gpu": True},
    ],
)
def test_a_malformed_replica_group_field_rejects_the_line(field: dict[str, object]) -> None:
    doc = json.loads(sample_line(StepSample("t", 0, 0, "n", 1, 0.1, 1.0, group="g0")))
    assert parse_sample(json.dumps(doc)) is not None
    assert parse_sample(json.dumps({**doc, **field})) is None


def test_a_gradient_norm_that_stands_out_is_found_too() -> None:
    rule = LossRule(factor=6.0, window_steps=10, min_steps=3)
    samples = []
    for i, group in enumerate(("g0", "g1", "g2")):
        for step, v in enumerate(NOISE, start=1):
            norm = 40.0 if group == "g0" and step > 6 else v / 4 + 0.002 * i
            samples.append(replace(fp(group, f"n{i}", step, None, rank=i, loss=v), grad_norm=norm))
    (out,) = loss_outliers(samples, rule)
    assert (out.group, out.metric, out.steps, out.value) == ("g0", "grad_norm", 4, 40.0)


@given(
    agreeing=st.integers(min_value=2, max_value=8),
    ranks=st.integers(min_value=1, max_value=3),
    odd_rank=st.integers(min_value=0, max_value=2),
    seed=st.randoms(use_true_random=False),
)
def test_one_odd_rank_among_agreeing_groups_is_named_whatever_the_order(
    agreeing: int, ranks: int, odd_rank: int, seed: random.Random
) -> None:
    """Groups of ``ranks`` ranks, each rank on its own node; one rank of the last group
    holds other weights: exactly its node is named, in any order of the lines."""
    samples = [
        fp(f"g{g}", f"n{g}-{r}", 10, GOOD, rank=g * ranks + r)
        for g in range(agreeing + 1)
        for r in range(ranks)
    ]
    odd = agreeing * ranks + min(odd_rank, ranks - 1)
    samples[odd] = replace(samples[odd], fingerprint=BAD)
    seed.shuffle(samples)
    verdict = vote(10, samples)
    (bad,) = [s for s in samples if s.fingerprint == BAD]
    assert [s.node for s in verdict.named] == [bad.node]
    assert verdict.to_check == () and verdict.groups == agreeing + 1
