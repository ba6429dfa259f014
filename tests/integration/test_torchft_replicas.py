"""The replica-group example (examples/torchft-replicas) as real processes on 127.0.0.1:
torchft's lighthouse and three groups, no cluster.

One training runs through the module (the tests build on each other, ``steps``):
a group given notice leaves at a step boundary while the others lose no step; a
fresh group copies the weights from a live peer and holds the same weights; a
bit flipped on one node's simulated GPU makes that group's fingerprint differ
from then on; a group killed without notice drops out and the others go on; the
lighthouse killed and restarted a few seconds later stalls the groups, which
then go on (they retry the quorum, ``--quorum-retries``).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.demo.replica_events import (
    ReplicaEvent,
    first_step_in_quorum,
    last_step,
    of,
    survivor_gap,
)
from gpufleet.demo.replicas import Groups, Lighthouse, lighthouse
from gpufleet.domain.departure import DEPARTED_EXIT_CODE

pytestmark = [pytest.mark.integration, pytest.mark.steps]

GROUPS = ("g0", "g1", "g2")


@dataclass
class Training:
    lighthouse: Lighthouse
    groups: Groups
    telemetry: Path
    sim_gpus: Path

    def fingerprints(self) -> dict[str, dict[int, str]]:
        """Group -> step -> fingerprint, from every telemetry file of the training."""
        out: dict[str, dict[int, str]] = {}
        for path in self.telemetry.glob("*/rank-*.jsonl"):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if "fingerprint" in rec:
                    out.setdefault(rec["group"], {})[rec["step"]] = rec["fingerprint"]
        return out


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Training]:
    work = tmp_path_factory.mktemp("torchft-replicas")
    telemetry, sim_gpus = work / "telemetry", work / "sim-gpus"
    sim_gpus.mkdir()
    with lighthouse(work / "lighthouse.log") as lh:
        groups = Groups(
            lh,
            work,
            step_time_s=0.1,
            extra_env={
                "GPUFLEET_TELEMETRY_DIR": str(telemetry),
                "GPUFLEET_SIM_GPUS": str(sim_gpus),
                "GPUFLEET_TRAINING": "replicas",
            },
        )
        try:
            for i in range(3):
                groups.start(i, "--fingerprint-every", "2")
            groups.wait_for(
                "all three groups in one quorum",
                lambda ev: all(first_step_in_quorum(ev, g, 0, 3) is not None for g in GROUPS),
            )
            yield Training(lh, groups, telemetry, sim_gpus)
        finally:
            groups.stop()


def steps_after(events: list[ReplicaEvent], groups: tuple[str, ...], t: float, n: int) -> bool:
    return all(len([e for e in of(events, "step", g) if e.t > t]) >= n for g in groups)


def test_a_group_given_notice_leaves_at_a_step_boundary_and_the_others_lose_no_step(
    training: Training,
) -> None:
    groups = training.groups
    noticed = time.time()
    groups.signal("g2", signal.SIGUSR1)
    assert groups.procs["g2"].wait(30) == DEPARTED_EXIT_CODE  # it wants to come back
    events = groups.wait_for(
        "the survivors' five steps after the departure",
        lambda ev: steps_after(ev, ("g0", "g1"), noticed, 5),
    )
    (departed,) = of(events, "departed", "g2")
    # Its last step is complete: committed, in the log, and the one it says it left after.
    assert departed.step == last_step(events, "g2")
    survivors = [survivor_gap(events, g, noticed, time.time()) for g in ("g0", "g1")]
    for gap in survivors:
        assert (gap.steps_lost, gap.gap_steps) == (0, 0), gap
    # Once it is gone, the survivors train on in a quorum of two.
    assert of(events, "step", "g0")[-1].quorum == 2
    print(
        "survivors' largest gap across the departure: "
        f"{max(g.gap_steps for g in survivors)} steps, {max(g.gap_s for g in survivors):.2f} s"
    )


def test_a_fresh_group_recovers_the_weights_from_a_live_peer(training: Training) -> None:
    groups = training.groups
    joined = time.time()
    groups.start(2, "--fingerprint-every", "2", node="node-3")
    events = groups.wait_for(
        "the new group's fourth step in a quorum of three",
        lambda ev: (
            steps_after(ev, GROUPS, joined, 4)
            and first_step_in_quorum(ev, "g2", joined, 3) is not None
        ),
    )
    start = next(e for e in of(events, "start", "g2") if e.t > joined)
    assert start.recovered_from in {"peer g0", "peer g1"}
    assert start.step > 0
    # Its first step continues from the peers' step: the step after the one it copied,
    # taken by the peers in the same quorum (no step repeated, none restarted).
    first = next(e for e in of(events, "step", "g2") if e.t > joined)
    assert first.step == start.step + 1
    assert first.quorum == 3
    peers = {e.step: e for e in of(events, "step", "g0")}
    assert peers[first.step].quorum == 3
    assert len({e.step for e in of(events, "step", "g0")}) == len(of(events, "step", "g0"))
    fps = training.fingerprints()
    common = sorted(set(fps["g2"]) & set(fps["g0"]) & set(fps["g1"]))
    assert common, fps
    assert all(fps["g0"][s] == fps["g1"][s] == fps["g2"][s] for s in common)
    print(f"the new group copied step {start.step} from {start.recovered_from}")


def test_a_flipped_bit_makes_that_groups_fingerprint_differ_from_then_on(
    training: Training,
) -> None:
    groups = training.groups
    flip_at = last_step(groups.events(), "g1") + 4
    (training.sim_gpus / "node-1.json").write_text(
        json.dumps({"speed": 1.0, "sdc_flip_at_step": flip_at})
    )
    groups.wait_for(
        "three fingerprints after the flip",
        lambda ev: all(last_step(ev, g) >= flip_at + 6 for g in GROUPS),
    )
    fps = training.fingerprints()
    before = [s for s in fps["g1"] if s < flip_at and s in fps["g0"]]
    after = [s for s in fps["g1"] if s >= flip_at and s in fps["g0"] and s in fps["g2"]]
    assert before and len(after) >= 3
    assert all(fps["g1"][s] == fps["g0"][s] for s in before)
    # The others agree with each other; the corrupted group differs at every step since.
    assert all(fps["g0"][s] == fps["g2"][s] != fps["g1"][s] for s in after)


def test_a_group_killed_without_notice_drops_out_and_the_others_go_on(
    training: Training,
) -> None:
    groups = training.groups
    killed = time.time()
    groups.procs["g1"].kill()
    events = groups.wait_for(
        "the survivors' five steps in a quorum of two",
        lambda ev: all(
            len([e for e in of(ev, "step", g) if e.t > killed and e.quorum == 2]) >= 5
            for g in ("g0", "g2")
        ),
    )
    assert not of(events, "departed", "g1")
    for g in ("g0", "g2"):
        gap = survivor_gap(events, g, killed, time.time())
        # A step in flight with the killed group is discarded at most; none is skipped.
        assert gap.gap_steps == 0 and gap.steps_lost <= 1, gap
    print(
        "killed without notice: survivors' largest gap "
        f"{max(survivor_gap(events, g, killed, time.time()).gap_s for g in ('g0', 'g2')):.2f} s"
    )


def test_the_groups_wait_out_a_lighthouse_restart_and_go_on(training: Training) -> None:
    groups, lh = training.groups, training.lighthouse
    lh.kill()
    down = time.time()
    time.sleep(2)
    lh.start()
    events = groups.wait_for(
        "both groups' three steps after the lighthouse came back",
        lambda ev: steps_after(ev, ("g0", "g2"), down + 2, 3),
    )
    assert all(groups.procs[g].poll() is None for g in ("g0", "g2"))
    for g in ("g0", "g2"):
        assert survivor_gap(events, g, down, time.time()).steps_lost <= 1
    codes = groups.stop()
    assert codes["g0"] == codes["g2"] == DEPARTED_EXIT_CODE
    events = groups.events()
    assert {e.group for e in of(events, "departed") if e.t > down} == {"g0", "g2"}
