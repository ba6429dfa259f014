"""Prometheus metrics of the lifecycle controller (one registry per controller).

Names and labels are part of the API (docs/controller.md lists them); no name is
exported by another component too (decision 0099).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1, 2, 5, 10, 30)
_STEP_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)

DEFAULT_PORT = 29441
"""The controller's /metrics port (the agent's is 29440, the syncer's 29442; decision 0099)."""


class Metrics:
    """Every metric the controller exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.nodes = Gauge("gpufleet_nodes", "Nodes per lifecycle state.", ["state"], registry=r)
        self.leader = Gauge(
            "gpufleet_controller_leader",
            "1 while this replica holds the controller's Lease and acts; 0 while it stands by"
            " (or cannot hold it: the log says why).",
            registry=r,
        )
        self.adoption_pending = Gauge(
            "gpufleet_controller_adoption_pending",
            "Healthy nodes the controller has adopted and acts on whose first write (state"
            " label and record) still waits its turn (decision 0124).",
            registry=r,
        )
        self.faults = Counter(
            "gpufleet_controller_faults_total",
            "Fault occurrences the controller took into a decision, by fault key (what the"
            " agents observed is gpufleet_agent_faults_observed_total).",
            ["fault"],
            registry=r,
        )
        self.actions = Counter(
            "gpufleet_actions_total",
            "Actions carried out, by kind and result (ok, failed, withheld, kept).",
            ["action", "result"],
            registry=r,
        )
        self.boot_stalls = Counter(
            "gpufleet_machine_boot_stalls_total",
            "Machine boots that stalled (boot watchdog), by stage reason and what followed.",
            ["reason", "outcome"],
            registry=r,
        )
        self.ticks = Counter(
            "gpufleet_controller_ticks_total",
            "Completed passes over every node (held decisions retried, timeouts examined).",
            registry=r,
        )
        self.holds = Counter(
            "gpufleet_decisions_held_total",
            "Decisions a safety rail held, by reason.",
            ["reason"],
            registry=r,
        )
        self.transitions = Counter(
            "gpufleet_transitions_total", "State transitions.", ["source", "target"], registry=r
        )
        self.step_seconds = Histogram(
            "gpufleet_remediation_step_seconds",
            "Duration of remediation steps, by step and outcome.",
            ["step", "outcome"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.time_to_cordon = Histogram(
            "gpufleet_time_to_cordon_seconds",
            "From the fault's time (as the agent reported it) to the cordon written.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.budget_out = Gauge(
            "gpufleet_budget_out_of_service",
            "Nodes automation holds out, per pool.",
            ["pool"],
            registry=r,
        )
        self.budget_allowed = Gauge(
            "gpufleet_budget_allowed", "Disruption budget, per pool.", ["pool"], registry=r
        )
        self.faults_waiting = Gauge(
            "gpufleet_faults_waiting",
            "Nodes holding a fault a safety rail withheld (retried every tick), per pool.",
            ["pool"],
            registry=r,
        )
        self.breaker_open = Gauge(
            "gpufleet_breaker_open", "1 while the circuit breaker is open.", registry=r
        )
        self.breaker_nodes = Gauge(
            "gpufleet_breaker_faulting_nodes",
            "Distinct nodes with an isolating fault in the breaker window.",
            registry=r,
        )
        self.tickets = Counter(
            "gpufleet_rma_ticket_calls_total",
            "RMA ticket webhook calls, by event (opened, closed) and result (ok, failed).",
            ["event", "result"],
            registry=r,
        )
        self.policy_valid = Gauge(
            "gpufleet_policy_valid", "1 if the FleetPolicy in use is valid.", registry=r
        )

    def count_requests(self, sent: Mapping[tuple[str, str], int]) -> None:
        """Export the API client's request counts (read when scraped, not kept twice)."""
        self.registry.register(_ApiRequests(sent))

    def count_stays(self, records: Mapping[str, NodeRecord]) -> None:
        """Export since when each node under repair has been in its state (read when
        scraped, from the controller's own records)."""
        self.registry.register(_RepairStays(records))

    def set_states(self, counts: Mapping[NodeState, int]) -> None:
        for state in NodeState:
            self.nodes.labels(state=state.value).set(counts.get(state, 0))


class _ApiRequests(Collector):
    """``gpufleet_controller_api_requests_total``: what the controller costs the apiserver
    (writes per fault, a burst's load), from :attr:`gpufleet.kubeapi.KubeApi.requests`."""

    def __init__(self, sent: Mapping[tuple[str, str], int]) -> None:
        self.sent = sent

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gpufleet_controller_api_requests",
            "Requests the controller sent to the apiserver, by HTTP method (WATCH: a watch"
            " opened) and resource (with its subresource: pods/eviction); the watches kopf"
            " opens are not counted.",
            labels=["verb", "resource"],
        )
        for (verb, resource), count in sorted(self.sent.items()):
            family.add_metric([verb, resource], count)
        yield family


REPAIR_STATES = (NodeState.DRAINING, NodeState.REMEDIATING, NodeState.VERIFYING)
"""The states automation must bring a node out of by itself: a node that stays in one is
stalled (the GpufleetRemediationStalled alert)."""


class _RepairStays(Collector):
    """``gpufleet_node_state_since_timestamp_seconds{node,state}``: when each node in a
    repair state entered it, so an alert names the node that is stuck and for how long.

    Only nodes under repair are exported: their number is bounded by the disruption
    budget, so the series stay few on a fleet of any size. The records are copied in one
    step (the scrape runs in the metrics server's thread while the loop changes them).
    """

    def __init__(self, records: Mapping[str, NodeRecord]) -> None:
        self.records = records

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpufleet_node_state_since_timestamp_seconds",
            "When a node under repair (draining, remediating, verifying) entered that state"
            " (Unix time); nodes in other states are not exported.",
            labels=["node", "state"],
        )
        for record in tuple(self.records.values()):
            if record.state in REPAIR_STATES:
                family.add_metric([record.name, record.state.value], record.since)
        yield family
