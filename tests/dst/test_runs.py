"""Whole runs: the same seed is the same run, a failure replays and shrinks, and today's
code holds every invariant on a bounded set of seeds and on every recorded seed.

``seeds/`` keeps the shrunk specs of the violations the simulation found: ``before-gate-*``
on the code before the gate (issue 33's defects; docs/dst.md says which seed is which),
``after-gate-*`` on the code after it, before the fixes they led to; ``roll-*`` with the
slurmd roll (``Config.slurmd_roll``), before decisions 0255 and 0256. A spec is a list of
environment events and scheduling choices; replayed on today's code, the story may
drift (the code asks other questions), but the events that broke an invariant still
happen, and no invariant may break.

The seeds are short (300 virtual seconds) and the recorded ones end early, so the whole
module stays around a minute on two cores.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import replace

import pytest

from gpufleet.dst.runner import Result, Spec, run, shrink
from gpufleet.dst.scenario import Config, Env

SHORT = Config(duration=300.0, calm_s=120.0)
SEEDS = sorted((pathlib.Path(__file__).parent / "seeds").glob("*.json"))
BOUNDED = 40
"""Seeds of whole runs (900 virtual seconds of events, 200 of calm) in the test command;
``bench/dst_soak.py`` runs thousands."""
FAILURES = pathlib.Path("/tmp/gpufleet-dst-failures")
GROUP_SEEDS = 6
"""Short runs with node groups (Config.groups)."""
DOMAIN_SEEDS = 3
"""Short runs with NVLink domains and a per-domain budget (Config.domains)."""


def test_the_same_seed_is_the_same_run() -> None:
    a = run(Spec(3, SHORT))
    b = run(Spec(3, SHORT))
    assert a.digest == b.digest
    assert [ln.text() for ln in a.lines] == [ln.text() for ln in b.lines]
    assert a.steps == b.steps and len(a.lines) > 100


def test_a_recorded_run_replays_exactly() -> None:
    a = run(Spec(4, SHORT))
    again = run(a.replay_spec())
    assert again.digest == a.digest
    assert again.choices == a.choices


def test_seeds_differ() -> None:
    assert len({run(Spec(s, replace(SHORT, duration=120.0))).digest for s in range(3)}) == 3


def _reaches_triage(node: str) -> object:
    def keeps(r: Result) -> bool:
        return any("state=triage" in ln.call and f"nodes {node} " in ln.call for ln in r.lines)

    return keeps


def test_shrinking_keeps_the_failure_and_drops_what_does_not_matter() -> None:
    """A dead GPU among unrelated events: what is left is the fault (the ladder ends in
    triage whatever else happens), with every choice at its default."""
    noise = tuple(Env(float(t), "pod", ("n2", False, False, 30)) for t in range(20, 200, 15))
    fault = Env(30.0, "fault", ("n1", "xid79-dead", 0))
    spec = Spec(5, replace(SHORT, duration=600.0), events=(*noise, fault), choices=None)
    first = run(spec)
    keeps = _reaches_triage("n1")
    assert keeps(first)  # type: ignore[operator]
    small = shrink(first, keeps=keeps, max_runs=60)  # type: ignore[arg-type]
    assert small.events == (fault,)
    assert not any(small.choices)
    assert keeps(run(small.replay_spec()))  # type: ignore[operator]


@pytest.mark.parametrize("seed", range(BOUNDED))
def test_a_bounded_run_holds_every_invariant(seed: int) -> None:
    r = run(Spec(seed, Config()), keep_trace=False)
    if r.violation is None:
        return
    again = run(r.replay_spec(), keep_trace=False)
    assert again.digest == r.digest  # the same story on replay
    FAILURES.mkdir(parents=True, exist_ok=True)
    saved = FAILURES / f"seed-{seed}.json"
    saved.write_text(r.replay_spec().to_json() + "\n")
    hashing = os.environ.get("PYTHONHASHSEED", "random")
    pytest.fail(
        f"{r.violation.line()}\nreplay: PYTHONHASHSEED={hashing} "
        f"python bench/dst_soak.py --replay {saved}"
    )


@pytest.mark.parametrize("seed", range(GROUP_SEEDS))
def test_a_run_with_node_groups_holds_every_invariant(seed: int) -> None:
    """Nodes in two racks, rack a under a FleetPolicy override (its own budget of one node,
    its own XID 79 rule): the controller and the agents resolve each node's policy, and
    invariant 4 holds per pool and per group."""
    r = run(Spec(seed, replace(SHORT, groups=True)), keep_trace=False)
    assert r.violation is None, r.violation.line()


@pytest.mark.parametrize("seed", range(DOMAIN_SEEDS))
def test_a_run_with_nvlink_domains_holds_every_invariant(seed: int) -> None:
    """Nodes in two NVLink domains, at most one node of a domain out (safety.budget.
    perDomain), with node groups too: invariant 4 holds per pool, group and domain."""
    r = run(Spec(seed, replace(SHORT, groups=True, domains=True)), keep_trace=False)
    assert r.violation is None, r.violation.line()


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_a_recorded_violation_does_not_happen_again(path: pathlib.Path) -> None:
    r = run(Spec.from_json(path.read_text()), keep_trace=False)
    assert r.violation is None, r.violation.line()


def test_the_recorded_seeds_are_there() -> None:
    names = {p.stem for p in SEEDS}
    for category in ("1_pod-after-drain", "1_stale-slurm-report", "2_two-replicas", "3a_isolate"):
        assert f"before-gate-{category}" in names
