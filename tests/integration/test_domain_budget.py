"""A disruption budget per NVLink domain on real components: the apiserver, the controller as a
process, KWOK Nodes labelled in two NVLink domains (three trays each) of one pool with room for
all of them.

The FleetPolicy sets ``safety.budget.perDomain: {maxNodes: 2}``: a burst of faults on every
node takes exactly 2 trays of each domain out, and the third of each waits
(``budget-exhausted``, the Event naming its domain), though the pool's budget has room; the
FleetPolicy's ``status.domainBudget`` lists both domains at their limit, and
``gpufleet policy explain --node`` names the node's domain budget.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    budget_burst,
    labelled_fleet,
    policy_spec,
    put_policy,
    running,
)
from waiting import wait_for

from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

POLICY = "domains"
DOMAIN = "network.topology.nvidia.com/accelerator"
NODES = {"nvl-a": [f"dom-a-{i}" for i in range(3)], "nvl-b": [f"dom-b-{i}" for i in range(3)]}
PER_DOMAIN = 2
XID = 79


@pytest.fixture(scope="module")
def api(local_cluster: ClusterInfo) -> Iterator[Api]:
    with labelled_fleet(local_cluster, DOMAIN, NODES, pool="domains", policy=POLICY) as api:
        yield api


def spec() -> dict[str, object]:
    s = policy_spec()
    # A node taken out stays draining: Slurm must confirm it empty and never does (fail
    # closed), so it keeps counting against the budgets.
    s["drain"]["slurm"] = "always"
    s["safety"]["budget"] = {
        "maxNodes": 10,
        "maxPercent": 100,
        "minNodes": 1,
        "perDomain": {"maxNodes": PER_DOMAIN},
    }
    s["safety"]["breaker"] = {"maxNodes": 50, "maxPercent": 100, "minNodes": 20}  # out of the way
    return s


def withheld_events(api: Api, name: str) -> list[dict[str, Any]]:
    return [e for e in api.events(name) if e["reason"] == "ActionWithheld"]


def domains_status(api: Api) -> dict[str, object]:
    status = api.get(f"{GV}/fleetpolicies/{POLICY}").get("status") or {}
    return dict(status.get("domainBudget") or {})


def test_a_burst_takes_out_exactly_each_domains_budget(
    local_cluster: ClusterInfo, api: Api, tmp_path: Path
) -> None:
    put_policy(api, POLICY, spec())
    with running(local_cluster, tmp_path, policy=POLICY) as ctl:
        held = budget_burst(api, ctl, NODES, {d: PER_DOMAIN for d in NODES}, XID)
        assert len(held) == 2
        for name in held:
            domain = next(d for d, names in NODES.items() if name in names)
            withheld = wait_for(
                f"an ActionWithheld Event on {name}",
                partial(withheld_events, api, name),
                timeout=30,
            )
            message = withheld[-1]["message"]
            assert message.startswith("budget-exhausted"), withheld
            assert f"the disruption budget of NVLink domain {domain} is used up" in message
            record = api.record(name)
            assert record is not None and record.nvlink_domain == domain
        wait_for(
            "status.domainBudget",
            lambda: (
                domains_status(api)
                == {
                    d: {"size": 3, "outOfService": PER_DOMAIN, "allowed": PER_DOMAIN, "waiting": 1}
                    for d in NODES
                }
            ),
            timeout=30,
        )

        explained = subprocess.run(
            [sys.executable, "-m", "gpufleet.cli.main", "policy", "explain",
             "--node", NODES["nvl-b"][0], "--fleet-policy", POLICY,
             "--kubeconfig", str(local_cluster.kubeconfig)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert explained.returncode == 0, explained.stderr
        assert "NVLink domain nvl-b budget: at most 2 nodes of one NVLink domain" in (
            explained.stdout
        )
