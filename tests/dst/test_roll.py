"""The slurmd roll in the simulation (decision 0217): the real operator rolls a DaemonSet
of simulated slurmd pods among faults, jobs, admins, outages, pause and dry-run, and
invariant 7 holds; each part of invariant 7 fails on a roll mutated to break it.

The mutations patch the pure decisions (``gpufleet.domain.slurmd_roll``) the operator
calls, so the same run with the real decisions passes: what fails is the check, not
the scenario.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.domain import slurmd_roll
from gpufleet.domain.slurm_reasons import ROLL_REASON
from gpufleet.domain.slurmd_roll import RollNode
from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config, Env, with_roll
from gpufleet.dst.world import World

QUIET = with_roll(Config(duration=300.0, calm_s=120.0))
BOUNDED = 6
"""Seeds of whole runs with the roll in the test command (``bench/dst_soak.py
--slurmd-roll`` runs hundreds)."""

# An upgrade while a job runs on n1 and an admin holds n2; nothing else happens, every
# scheduling choice is the default.
JOB = Env(10.0, "job", (0, True, True, 120))
ADMIN = Env(12.0, "admin-drain", ("n2", 250))
UPGRADE = Env(20.0, "upgrade", ())


def story(events: tuple[Env, ...], **inspect: object) -> tuple[Result, dict[str, object]]:
    seen: dict[str, object] = {}

    def look(world: World) -> None:
        fleet = world.slurmd
        assert fleet is not None
        seen["current"] = sorted(
            n for n in world.node_names if (p := fleet.pod_of(n)) and fleet.current(p)
        )
        seen["drained"] = sorted(n for n, s in world.slurm.nodes.items() if "DRAIN" in s.flags)

    r = run(Spec(1, QUIET, events=events, choices=(), shuffle=False), inspect=look)
    return r, seen


def deletes(r: Result) -> list[tuple[float, str]]:
    return [(ln.at, ln.call) for ln in r.lines if ln.call.startswith("delete pods")]


def test_an_upgrade_rolls_every_pod_around_a_job_and_an_admin() -> None:
    r, seen = story((JOB, ADMIN, UPGRADE))
    assert r.violation is None, r.violation.line()
    assert seen["current"] == ["n1", "n2", "n3", "n4"]
    # n1's pod went only after its job: the job started at 10 for 120 s.
    n1 = [at for at, call in deletes(r) if "-n1-" in call]
    assert n1 and n1[0] >= 130.0
    # The admin's drain is kept by the roll and lifted by the admin at 262; no one
    # else is left drained (Slurm 24.11 keeps each reason after the resume).
    assert seen["drained"] == []
    resumes = [ln.call for ln in r.lines if ln.proc.startswith("operator") and "undrain" in ln.call]
    assert not any("n2" in c for c in resumes)


@pytest.mark.parametrize(
    ("invariant", "mutate", "events"),
    [
        # A planner that does not see a node's jobs replaces its pod under them.
        ("7a", lambda m: m.setattr(RollNode, "busy", property(lambda self: False)), (JOB, UPGRADE)),
        # One that takes any drain for its own resumes the admin's.
        (
            "7c",
            lambda m: m.setattr(
                RollNode, "ours", property(lambda self: bool(self.slurm and self.slurm.drained))
            ),
            (ADMIN, UPGRADE),
        ),
        # One that counts nobody out drains every node at once.
        ("7b", lambda m: m.setattr(slurmd_roll, "counts_out", lambda node: False), (UPGRADE,)),
        # One that never sees the new slurmd register leaves its drain forever.
        (
            "7d",
            lambda m: m.setattr(RollNode, "registered", property(lambda self: False)),
            (UPGRADE,),
        ),
    ],
)
def test_each_invariant_catches_a_roll_that_breaks_it(
    monkeypatch: pytest.MonkeyPatch, invariant: str, mutate: object, events: tuple[Env, ...]
) -> None:
    mutate(monkeypatch)  # type: ignore[operator]
    r, _ = story(events)
    assert r.violation is not None and r.violation.invariant == invariant, (
        r.violation.line() if r.violation else "no violation"
    )


def test_the_roll_resumes_its_drain_once_slurm_appended_not_responding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each replacement here outlasts SlurmdTimeout: Slurm 24.11 shows the roll's drain as
    ``gpufleet: slurmd upgrade : Not responding``. Read as someone else's drain (the
    exact match before decision 0218), the first node no longer counted as the roll's:
    the roll drained the next one beside it (7b), and would never have resumed it."""
    r, _ = story((UPGRADE,))
    assert r.violation is None, r.violation.line()
    assert any(ln.call == "scontrol undrain n1" for ln in r.lines)
    exact = lambda reason: (reason or "").strip() == ROLL_REASON  # noqa: E731
    monkeypatch.setattr(slurmd_roll, "is_roll_reason", exact)
    r, _ = story((UPGRADE,))
    assert r.violation is not None and r.violation.invariant == "7b", r.violation


def test_an_admins_resume_during_a_replacement_does_not_let_a_second_node_go() -> None:
    """n1's pod is deleted at 22 and its new slurmd registers at 29; an admin resumes n1 at
    24. Counted as down by someone else's doing, n1 let the roll drain n2 beside it (7b)
    before decision 0217's change to rule 5."""
    r, seen = story((UPGRADE, Env(24.0, "resume", ("n1",))))
    assert r.violation is None, r.violation.line()
    assert seen["current"] == ["n1", "n2", "n3", "n4"]


def test_dry_run_writes_nothing_and_the_roll_goes_on_after_it() -> None:
    dry = Env(15.0, "roll-dry-run", (100,))
    r, seen = story((dry, UPGRADE))
    assert r.violation is None, r.violation.line()
    assert all(at >= 115.0 for at, _ in deletes(r))
    assert seen["current"] == ["n1", "n2", "n3", "n4"]


@pytest.mark.parametrize("seed", range(BOUNDED))
def test_a_bounded_run_with_the_roll_holds_every_invariant(seed: int) -> None:
    r = run(Spec(seed, with_roll(Config(duration=600.0))), keep_trace=False)
    assert r.violation is None, r.violation.line()


def test_without_the_switch_a_seed_draws_no_roll_event() -> None:
    """A recorded seed, drawn before the roll, replays the same story: its events do not
    change, and no DaemonSet is made."""
    from gpufleet.dst.scenario import generate

    plain = generate(7, Config())
    assert not any(e.kind in ("upgrade", "roll-pause", "roll-dry-run", "roll-kill") for e in plain)
    assert generate(7, replace(Config(), slurmd_roll=True)) == plain
