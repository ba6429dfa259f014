"""Policy per node group on real components: the apiserver, the controller as a process, KWOK
Nodes in two label groups (racks a and b) of one pool with room for all of them.

The FleetPolicy gives rack a a group budget of 1 and rack b one of 2: a burst of faults on
every node takes exactly 1 node of rack a and 2 of rack b out, and the others wait
(``budget-exhausted``), though the pool's budget has room; the FleetPolicy's
``status.groupBudget`` says so. ``gpufleet policy explain --node`` reads a Node's labels and
the FleetPolicy from the cluster and names the override. An override whose selector can
match no node is refused by the controller (``Valid=False``) while it keeps the last valid
policy and disrupts nothing more.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_harness import (
    GV,
    Api,
    budget_burst,
    draining,
    labelled_fleet,
    policy_spec,
    put_policy,
    running,
)
from waiting import wait_for

from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

POLICY = "groups"
RACK = "example.com/rack"
NODES = {"a": [f"groups-a-{i}" for i in range(3)], "b": [f"groups-b-{i}" for i in range(3)]}
BUDGET = {"a": 1, "b": 2}
XID = 79


@pytest.fixture(scope="module")
def api(local_cluster: ClusterInfo) -> Iterator[Api]:
    with labelled_fleet(local_cluster, RACK, NODES, pool="groups", policy=POLICY) as api:
        yield api


def spec() -> dict[str, object]:
    s = policy_spec()
    # A node taken out stays draining: Slurm must confirm it empty and never does (fail
    # closed), so it keeps counting against the budgets.
    s["drain"]["slurm"] = "always"
    s["safety"]["budget"] = {"maxNodes": 10, "maxPercent": 100, "minNodes": 1}
    s["safety"]["breaker"] = {"maxNodes": 50, "maxPercent": 100, "minNodes": 20}  # out of the way
    s["overrides"] = [
        {
            "name": f"rack-{rack}",
            "nodeSelector": {"matchLabels": {RACK: rack}},
            "budget": {"maxNodes": BUDGET[rack]},
        }
        for rack in NODES
    ]
    return s


def groups_status(api: Api) -> dict[str, object]:
    status = api.get(f"{GV}/fleetpolicies/{POLICY}").get("status") or {}
    return dict(status.get("groupBudget") or {})


def condition(api: Api, type_: str) -> dict[str, object]:
    status = api.get(f"{GV}/fleetpolicies/{POLICY}").get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def test_a_burst_takes_out_exactly_each_groups_budget(
    local_cluster: ClusterInfo, api: Api, tmp_path: Path
) -> None:
    put_policy(api, POLICY, spec())
    with running(local_cluster, tmp_path, policy=POLICY) as ctl:
        held = budget_burst(api, ctl, NODES, BUDGET, XID)
        assert len(held) == 3
        withheld = wait_for(
            "an ActionWithheld Event on a held node",
            lambda: [e for e in api.events(held[0]) if e["reason"] == "ActionWithheld"],
            timeout=30,
        )
        assert withheld[-1]["message"].startswith("budget-exhausted"), withheld
        wait_for(
            "status.groupBudget",
            lambda: (
                groups_status(api).get("rack-a")
                == {"size": 3, "outOfService": 1, "allowed": 1, "waiting": 2}
            ),
            timeout=30,
        )
        assert groups_status(api)["rack-b"] == {
            "size": 3,
            "outOfService": 2,
            "allowed": 2,
            "waiting": 1,
        }
        record = api.record(NODES["b"][0])
        assert record is not None and record.group == "rack-b"

        explained = subprocess.run(
            [sys.executable, "-m", "gpufleet.cli.main", "policy", "explain",
             "--node", NODES["b"][0], "--xid", str(XID), "--fleet-policy", POLICY,
             "--kubeconfig", str(local_cluster.kubeconfig)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert explained.returncode == 0, explained.stderr
        assert f"Node {NODES['b'][0]}: override rack-b (FleetPolicy {POLICY})" in explained.stdout
        assert "held: example.com/rack in (b): 'b'" in explained.stdout
        assert "group rack-b budget: at most 2 nodes" in explained.stdout

        # A selector no node can match (the schema admits it): refused by the controller,
        # the last valid policy kept. (A field an override may not set is not in the CRD's
        # schema: kubectl refuses it, the apiserver drops it from a plain write.)
        bad = spec()
        bad["overrides"][0]["nodeSelector"]["matchExpressions"] = [  # type: ignore[index]
            {"key": RACK, "operator": "DoesNotExist"}
        ]
        api.patch(f"{GV}/fleetpolicies/{POLICY}", {"spec": {"overrides": bad["overrides"]}})
        wait_for(
            "Valid=False",
            lambda: condition(api, "Valid").get("reason") == "Invalid",
            timeout=30,
        )
        message = str(condition(api, "Valid")["message"])
        assert "no node can match: example.com/rack must both exist and not exist" in message
        ctl.wait_ticks(3, timeout=30)
        assert {r: len(draining(api, NODES[r])) for r in NODES} == BUDGET
