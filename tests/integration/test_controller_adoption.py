"""A first adoption (decision 0124): the controller acts on every node as soon as it holds
the fleet, and writes the healthy nodes' state labels and records at a bounded pace, not
in one burst. Real apiserver, KWOK nodes, the controller as a process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    create_kwok_nodes,
    policy_spec,
    prepare_fleet,
    put_policy,
    report_fault,
    running,
    wait_for,
)

pytestmark = pytest.mark.integration

ADOPT = [f"adopt-{i:02d}" for i in range(24)]
RATE = 4.0
"""Adoption writes per second asked of the controller: the 24 nodes take about 6 s."""


@pytest.fixture
def env(local_cluster: Any, tmp_path: Path) -> Iterator[tuple[Any, Api, Path]]:
    api = Api(local_cluster)
    prepare_fleet(api, local_cluster)
    create_kwok_nodes(api, ADOPT, pool="adopt")
    put_policy(api, "adopt", policy_spec())
    try:
        yield local_cluster, api, tmp_path
    finally:
        for node in ADOPT:
            api.delete(f"/api/v1/nodes/{node}")
        api.delete(f"{GV}/fleetpolicies/adopt")
        api.delete(f"{GV}/noderemediations")


def labelled(api: Api) -> list[str]:
    return [n for n in ADOPT if api.state(n)]


def test_a_fault_is_acted_on_at_once_and_the_fleet_is_labelled_at_a_bounded_pace(
    env: Any,
) -> None:
    info, api, logs = env
    probe = ADOPT[-1]  # the last in the adoption order
    report_fault(api, probe, 79)
    started = time.monotonic()
    with running(info, logs, policy="adopt", extra_args=("--adoption-rate", str(RATE))) as ctl:
        wait_for("the faulted node cordoned", lambda: api.node(probe)["spec"].get("unschedulable"))
        # Acted on before its turn: most healthy nodes still wait for their first write.
        assert api.state(probe) not in (None, "production")
        assert len(labelled(api)) < len(ADOPT) / 2, labelled(api)
        # Paced: never more first writes than the rate allows since the controller started
        # (the faulted node's write is its own, not one of them).
        while len(done := labelled(api)) < len(ADOPT):
            elapsed = time.monotonic() - started
            assert len(done) - 1 <= RATE * elapsed + 1, (len(done), elapsed)
            if elapsed > 120:
                pytest.fail(f"only {len(done)} of {len(ADOPT)} nodes labelled after 120 s")
            time.sleep(0.2)
        assert {api.state(n) for n in ADOPT if n != probe} == {"production"}
        # The cluster's own nodes (reset, so adopted again) come after these in its order.
        wait_for(
            "no adoption pending",
            lambda: ctl.metric("gpufleet_controller_adoption_pending") == 0,
            timeout=60,
        )
