"""The simulator obeys the fleet-wide budget: it decides through the same ``decide()`` and
keeps its fleet view with the same ``apply_decision``, so no more nodes are out at once than
``safety.budget.fleetMaxNodes`` allows (here below what the one pool's budget would)."""

from __future__ import annotations

import json

from gpufleet.domain import events as ev
from gpufleet.domain.policy import Policy, default_policy, load_policy
from gpufleet.domain.states import OUT_OF_SERVICE
from gpufleet.sim.engine import Simulator
from gpufleet.sim.model import default_model


class PeakWatch(Simulator):
    """The simulator, noting the most nodes out of service after any decision."""

    peak = 0

    def _decide(self, i: int, event: ev.Event) -> None:
        super()._decide(i, event)
        self.peak = max(self.peak, sum(self.state_count[s] for s in OUT_OF_SERVICE))


def _fleet_limited(n: int) -> Policy:
    base = default_policy()
    budget = base.safety.budget.model_copy(update={"fleet_max_nodes": n})
    return base.model_copy(update={"safety": base.safety.model_copy(update={"budget": budget})})


def test_no_more_nodes_out_than_the_fleet_budget_and_the_rest_are_held() -> None:
    free = PeakWatch(default_model(), default_policy(), gpus=16000, days=60, seed=7)
    free.run()
    capped = PeakWatch(default_model(), _fleet_limited(1), gpus=16000, days=60, seed=7)
    result = capped.run()
    assert free.peak > 1  # without it, the pool budget (50 of 2,000 nodes) lets more out
    assert capped.peak == 1
    assert result.held > free.held


def test_a_node_groups_budget_holds_in_the_simulator_too() -> None:
    """An override whose selector matches the simulated nodes (their pool label), with a
    budget of one node: the simulator resolves each node's policy the controller's way and
    never has more than one out."""
    spec = default_policy().model_dump(by_alias=True, mode="json")
    spec["overrides"] = [
        {
            "name": "everyone",
            "nodeSelector": {"matchLabels": {"gpufleet.io/pool": "default"}},
            "budget": {"maxNodes": 1},
        }
    ]
    grouped = load_policy(json.dumps(spec))
    sim = PeakWatch(default_model(), grouped, gpus=16000, days=60, seed=7)
    result = sim.run()
    assert {r.group for r in sim.records} == {"everyone"}
    assert sim.peak == 1 and result.held > 0


class DomainPeakWatch(Simulator):
    """The simulator, noting the most nodes of one NVLink domain out after any decision."""

    peak = 0

    def _decide(self, i: int, event: ev.Event) -> None:
        super()._decide(i, event)
        self.peak = max([self.peak, *(v.out_of_service for v in self.fleet.domains.values())])


def test_an_nvlink_domains_budget_holds_in_the_simulator_too() -> None:
    """Simulated nodes in NVLink domains (fleet.nvlinkDomainNodes; 4 domains of 505 here,
    so that two faults of one domain overlap within the run) under safety.budget.perDomain
    of one: never two nodes of one domain out at once, and the domain's limit holds faults
    the pool's budget alone lets through."""
    from gpufleet.sim.scenarios import with_overrides

    spec = default_policy().model_dump(by_alias=True, mode="json")
    spec["safety"]["budget"]["perDomain"] = {"maxNodes": 1}
    per_domain = load_policy(json.dumps(spec))
    model = with_overrides(default_model(), {"fleet.nvlink_domain_nodes": 505})
    free = PeakWatch(model, default_policy(), gpus=16000, days=60, seed=7)
    free_result = free.run()
    sim = DomainPeakWatch(model, per_domain, gpus=16000, days=60, seed=7)
    result = sim.run()
    assert sim.records[0].nvlink_domain == "nvl-0000"
    assert sim.records[505].nvlink_domain == "nvl-0001"
    assert free.fleet.domains == {}  # no per-domain budget: no domain counted
    assert sim.peak == 1 and result.held > free_result.held
