"""Prometheus metrics of the Slurm syncer (one registry per syncer, no global state).

Names and labels are part of the API (docs/slurm.md lists them). Counters and
histograms are updated where the event happens in :mod:`gpufleet.slurm.syncer`
and :mod:`gpufleet.slurm.lender`; the node gauges are set from the syncer's
own views after every Slurm poll pass (:meth:`SyncerMetrics.set_views`).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gpufleet.domain import departure, slurm_sync
from gpufleet.slurm.operator import state_bucket

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1, 2, 5, 10, 30)
_NOTICE_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300)
_POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

SLURM_STATES = ("idle", "mixed", "allocated", "draining", "drained", "down", "unknown")
"""State label values always exported (0 when no node is in them); the words are
the operator's ``status.nodesByState`` (:func:`gpufleet.slurm.operator.state_bucket`).
Any other base state Slurm reports (``future``, ``error``...) is exported while
a node is in it."""

DEFAULT_PORT = 29442
"""The port the chart gives the syncer's /metrics (the agent's is 29440, the controller's
29441; decision 0099). The syncer serves none unless ``--metrics-port`` is given."""

ERROR_OPS = ("poll", "read", "drain", "resume", "requeue", "notice")
"""``op`` label values of ``gpufleet_syncer_slurm_errors_total``."""


class Endpoint:
    """One registry's /metrics on a port of its own: the syncer's and the pod scheduler's
    metrics hold one each (``serve`` then ``stop``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: Any = None

    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Serve /metrics; returns the bound port (0 picks a free one)."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        self._server = server
        bound: int = server.server_address[1]
        return bound

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class SyncerMetrics:
    """Every metric the syncer exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.endpoint = Endpoint(self.registry)
        """Its /metrics (``serve``, ``stop``)."""
        r = self.registry
        self.slurm_up = Gauge(
            "gpufleet_syncer_slurm_up",
            "1 when slurmrestd answered the last poll (0: Slurm view unknown, failing closed).",
            registry=r,
        )
        self.poll_seconds = Histogram(
            "gpufleet_syncer_poll_seconds",
            "Duration of one Slurm poll (/nodes and /jobs from slurmrestd), by result.",
            ["result"],
            buckets=_POLL_BUCKETS,
            registry=r,
        )
        self.poll_reads = Counter(
            "gpufleet_syncer_poll_reads_total",
            "Successful polls by what Slurm sent: full (every node and job, read every"
            " full pass), changed (asked for changes only: something changed), unchanged"
            " (nothing changed: the view held is kept, nothing parsed).",
            ["read"],
            registry=r,
        )
        self.passes = Counter(
            "gpufleet_syncer_passes_total",
            "Passes of the Slurm loop finished (a poll, then every managed node reconciled;"
            " a failed poll counts, and reconciles nothing): the syncer is alive.",
            registry=r,
        )
        self.drains = Counter(
            "gpufleet_syncer_drains_total",
            "Nodes drained in Slurm by the syncer (one per node; reason updates included).",
            registry=r,
        )
        self.resumes = Counter(
            "gpufleet_syncer_resumes_total",
            "Nodes undrained in Slurm by the syncer (only drains it owns).",
            registry=r,
        )
        self.requeues = Counter(
            "gpufleet_syncer_requeues_total",
            "Jobs requeued (scontrol requeue accepted) on nodes the syncer drained.",
            registry=r,
        )
        self.slurm_errors = Counter(
            "gpufleet_syncer_slurm_errors_total",
            "Slurm calls that failed, by operation (poll, read, drain, resume, requeue, notice).",
            ["op"],
            registry=r,
        )
        self.kube_errors = Counter(
            "gpufleet_syncer_kube_errors_total",
            "Reconciles of a node that the Kubernetes API refused.",
            registry=r,
        )
        self.sync_latency = Histogram(
            "gpufleet_syncer_sync_latency_seconds",
            "From a Kubernetes Node change seen by the watch to the Slurm drain or "
            "resume written for it, by verb.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.lends = Counter(
            "gpufleet_syncer_lends_total",
            "Nodes lent to a Kubernetes Pod (locked for it).",
            registry=r,
        )
        self.returns = Counter(
            "gpufleet_syncer_returns_total",
            "Lent nodes returned to Slurm (their Pod gone).",
            registry=r,
        )
        self.bind_refusals = Counter(
            "gpufleet_syncer_bind_refusals_total",
            "Binds the lender refused: the Pod or the Node was not one it is entitled to "
            "(lender.bind_refusal); the node was returned to Slurm.",
            registry=r,
        )
        self.kube_nodes = Gauge(
            "gpufleet_syncer_kube_nodes",
            "Kubernetes Nodes matching the syncer's node selector.",
            registry=r,
        )
        self.managed_nodes = Gauge(
            "gpufleet_syncer_managed_nodes",
            "Nodes the syncer manages: in Kubernetes and in the Slurm view "
            "(0 while the Slurm view is unknown).",
            registry=r,
        )
        self.slurm_nodes = Gauge(
            "gpufleet_syncer_slurm_nodes",
            "Managed nodes by Slurm state as of the last poll (absent while the view is unknown).",
            ["state"],
            registry=r,
        )
        self.lent_nodes = Gauge(
            "gpufleet_syncer_lent_nodes",
            "Nodes lent to Kubernetes (annotation gpufleet.io/lent-to).",
            registry=r,
        )
        self.foreign_holds = Gauge(
            "gpufleet_syncer_foreign_holds",
            "Nodes reporting a Slurm drain or DOWN that gpufleet does not own "
            "(annotation gpufleet.io/slurm-state).",
            registry=r,
        )
        self.unrequeueable_jobs = Gauge(
            "gpufleet_syncer_unrequeueable_jobs",
            "Running jobs that must leave a node the syncer drained but cannot be "
            "requeued (left running, reported on the Node).",
            registry=r,
        )
        self.notices = Counter(
            "gpufleet_syncer_notices_total",
            "Departure notices sent (SIGUSR1 to the steps of a job whose comment asks for "
            "one, before its node is taken; a notice sent again after a restart counts).",
            registry=r,
        )
        self.notice_seconds = Histogram(
            "gpufleet_syncer_notice_seconds",
            "From a job's first departure notice to its requeue or its notice dropped, by "
            "outcome: left (it departed, exit code 75, and was requeued), grace_expired (it "
            "was requeued running) or ended (it ended on its own: not requeued).",
            ["outcome"],
            buckets=_NOTICE_BUCKETS,
            registry=r,
        )
        for op in ERROR_OPS:
            self.slurm_errors.labels(op=op)
        for outcome in departure.Outcome:
            self.notice_seconds.labels(outcome=outcome.value)
        for verb in (slurm_sync.Verb.DRAIN, slurm_sync.Verb.RESUME):
            self.sync_latency.labels(verb=verb.value)
        self._states: set[str] = set()

    def set_slurm_states(self, views: Iterable[slurm_sync.SlurmView] | None) -> None:
        """Managed nodes per Slurm state; None (view unknown) removes the series."""
        if views is None:
            self.slurm_nodes.clear()
            self._states = set()
            return
        counts = Tally(state_bucket(v) for v in views)
        for state in self._states - set(counts) - set(SLURM_STATES):
            self.slurm_nodes.remove(state)
        for state in (*SLURM_STATES, *sorted(set(counts) - set(SLURM_STATES))):
            self.slurm_nodes.labels(state=state).set(counts.get(state, 0))
        self._states = set(counts)
