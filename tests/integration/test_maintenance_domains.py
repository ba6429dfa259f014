"""Whole NVLink domains in a MaintenancePlan on real components (decision 0244): the
apiserver, the controller as a process, KWOK trays in two NVLink domains (three each) of one
pool with room for all of them, and a per-domain budget of one tray.

A plan of ``scope: nvlinkDomain`` running a command takes every tray of one domain out at
once (the domain's k of 1 exceeded with the plan's consent), asks the command of each only
once all three are empty, returns none before all three answered, verifies them and only
then takes the other domain: never trays of both domains out at once. A plan of node scope
under the same policy starts one tray of each domain in its first batch, though it asked for
six (decision 0243). The test plays the trays' agents (it answers their requests).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    answer_request,
    labelled_fleet,
    plan_status,
    policy_spec,
    put_policy,
    running,
)
from waiting import wait_for

from gpufleet.domain import well_known
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

POLICY = "maintenance-domains"
DOMAIN = "network.topology.nvidia.com/accelerator"
NODES = {"nvl-a": [f"mdom-a-{i}" for i in range(3)], "nvl-b": [f"mdom-b-{i}" for i in range(3)]}
EVERY = [n for names in NODES.values() for n in names]
OUT = {"draining", "maintenance", "verifying"}


@pytest.fixture(scope="module")
def api(local_cluster: ClusterInfo) -> Iterator[Api]:
    with labelled_fleet(
        local_cluster, DOMAIN, NODES, pool="mdom", policy=POLICY, plans=("nvswitch-fw", "by-node")
    ) as api:
        yield api


def spec() -> dict[str, Any]:
    s = policy_spec()
    s["safety"]["budget"] = {
        "maxNodes": 10,
        "maxPercent": 100,
        "minNodes": 1,
        "perDomain": {"maxNodes": 1},
    }
    return s


def create_plan(api: Api, name: str, **spec: Any) -> None:
    api.post(
        f"{GV}/maintenanceplans",
        {
            "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
            "kind": "MaintenancePlan",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {well_known.LABEL_POOL: "mdom"}, **spec},
        },
    )


class Watch:
    """Reads every tray's state; each read checks that never both domains have trays out."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.reads = 0

    def states(self) -> dict[str, str | None]:
        states = {n: self.api.state(n) for n in EVERY}
        out = {d for d, names in NODES.items() if any(states[n] in OUT for n in names)}
        assert len(out) < 2, f"trays of both domains out at once: {states}"
        self.reads += 1
        return states

    def domain(self, domain: str) -> set[str | None]:
        states = self.states()
        return {states[n] for n in NODES[domain]}


def run_domain(api: Api, ctl: Any, watch: Watch, domain: str, other: str) -> None:
    """One domain through the plan: out together, acted on when all are empty, returned
    together; the other domain untouched meanwhile."""
    trays = NODES[domain]
    wait_for(f"{domain} all in maintenance", lambda: watch.domain(domain) == {"maintenance"})
    assert watch.domain(other) == {"production"}
    records = [api.record(n) for n in trays]
    assert all(r is not None and r.incident is not None for r in records)
    last_in = max(r.since for r in records if r is not None)
    for r in records:
        assert r is not None and r.incident is not None
        assert r.incident.whole_domain == domain
        acting = wait_for(
            f"{r.name}'s command asked",
            lambda n=r.name: (rec := api.record(n)) and rec.incident and rec.incident.acting_since,
        )
        assert acting >= last_in  # asked only once the last tray was empty
    for name in trays[:-1]:
        assert answer_request(api, name, True, "flashed") == "command"
    ctl.wait_ticks(3, timeout=30)  # the plan has read both answers
    assert watch.domain(domain) == {"maintenance"}  # none back before the last answered
    assert answer_request(api, trays[-1], True, "flashed") == "command"
    wait_for(f"{domain} verifying together", lambda: watch.domain(domain) == {"verifying"})
    for name in trays:
        assert answer_request(api, name, True, "checks passed") == "checks"
    wait_for(f"{domain} back in production", lambda: watch.domain(domain) == {"production"})


def test_a_domain_scope_plan_takes_each_domain_out_whole_and_one_at_a_time(
    local_cluster: ClusterInfo, api: Api, tmp_path: Path
) -> None:
    put_policy(api, POLICY, spec())
    watch = Watch(api)
    with running(local_cluster, tmp_path, policy=POLICY) as ctl:
        wait_for("adopted", lambda: set(watch.states().values()) == {"production"})
        create_plan(
            api, "nvswitch-fw", scope="nvlinkDomain", action="command", command="nvswitch-fw"
        )
        run_domain(api, ctl, watch, "nvl-a", "nvl-b")
        run_domain(api, ctl, watch, "nvl-b", "nvl-a")
        wait_for("completed", lambda: plan_status(api, "nvswitch-fw").get("phase") == "Completed")
        status = plan_status(api, "nvswitch-fw")
        assert (status["succeeded"], status["failed"]) == (6, 0)
        assert {e["domain"] for e in status["nodes"]} == set(NODES)
        assert watch.reads > 10

        # Node scope, same policy: a batch of six holds to the domains' k of 1.
        create_plan(api, "by-node", action="noop", maxUnavailable=6, maxPerDomain=6, maxFailures=6)
        wait_for(
            "the first batch",
            lambda: plan_status(api, "by-node").get("inProgress") == 2,
        )
        started = [
            e["name"] for e in plan_status(api, "by-node")["nodes"] if e["phase"] != "Pending"
        ]
        assert sorted(n[:6] for n in started) == ["mdom-a", "mdom-b"], started
        api.patch(f"{GV}/maintenanceplans/by-node", {"spec": {"abort": True}})
