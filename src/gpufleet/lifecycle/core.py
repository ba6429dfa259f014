"""What every collaborator of the controller shares: settings, names, the feed.

The controller (:mod:`gpufleet.lifecycle.controller`) is composed of objects
that own their state and are handed only what they use (docs/decisions/0140);
this module holds the few things they all speak of: the settings, the logger,
the JSON alias and :data:`Feed`, the one way a collaborator asks for a decision
about a node (the node pass decides it under the node's lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain import events as ev
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.generated_secrets import GeneratedSecret
from gpufleet.remediate import redfish

log = logging.getLogger("gpufleet.controller")

Json = dict[str, Any]
S = NodeState

Feed = Callable[[str, ev.Event], Coroutine[Any, Any, None]]
"""Decide an event about a node that did not come from the Node (a drain done, a step's
result, a tick, a plan's request): the node pass reads the Node and decides it."""


@dataclass(frozen=True)
class ControllerSettings:
    """How the controller runs. Every field has a default suited to production."""

    policy_name: str = "default"
    """The FleetPolicy object to obey. Until it exists and is valid, nothing
    disruptive happens (fail closed)."""
    dry_run: bool = False
    """Force dry-run whatever the policy says (decide and report only)."""
    tick_s: float = 2.0
    """How often held decisions are retried and step/check timeouts examined."""
    drain_poll_s: float = 1.0
    """How often a draining node's pods are looked at."""
    event_namespace: str = "default"
    """Where Events about Nodes (cluster-scoped) are written."""
    conflict_retries: int = 8
    """Re-reads of a Node after a 409 before giving up until the next event."""
    bmc_retry_delays: tuple[float, ...] = redfish.RETRY_DELAYS
    """Pauses between attempts of one BMC request."""
    bmc_ca_file: str | None = None
    """CA bundle (PEM) for BMCs whose Secret has no ``ca.crt`` (docs/decisions/0208)."""
    graceful_settle_s: float = 300.0
    """After a GracefulRestart whose answer was lost (or a restart in the middle), how
    long the BMC is given to show it: the OS shuts down first, and only then does the
    machine reset. Nothing else is posted for the attempt meanwhile (docs/decisions/0142)."""
    status_save_delay_s: float = 0.5
    """The FleetPolicy status (breaker, budget) is saved at most this often."""
    ticket_webhook: str | None = None
    """Where RMA tickets are opened and closed (POST, docs/schemas/rma-ticket.schema.json);
    None: no tickets, no evidence bundles (docs/decisions/0108)."""
    ticket_auth_file: str | None = None
    """A file whose content is the webhook's ``Authorization`` header (a mounted Secret)."""
    ticket_timeout_s: float = 10.0
    """Longest wait for one webhook answer."""
    ticket_retry_s: float = 5.0
    """Pause after a ticket call's first failure; it doubles with each failure..."""
    ticket_retry_max_s: float = 300.0
    """...up to this (the call is retried until the receiver acknowledges it)."""
    evidence_namespace: str | None = None
    """Where evidence bundles (ConfigMaps) are stored; None: the event namespace."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Labels (exact values) of the Nodes the controller manages; empty: every Node. A
    cluster's CPU and system nodes (where the controller itself runs) are left alone."""
    key_secret: str = "gpufleet-record-key"
    """The Secret holding the key records and marks are signed with (created if absent)."""
    key_namespace: str | None = None
    """Where that Secret lives; None: the event namespace."""
    lease: str = "gpufleet-controller"
    """The Lease the replicas hold to act (one acts; docs/decisions/0141)."""
    lease_namespace: str | None = None
    """Where that Lease lives; None: the event namespace."""
    device_taints: bool = False
    """Keep one DRA DeviceTaintRule per quarantined GPU (:mod:`~gpufleet.lifecycle.
    device_taints`): where the agents publish the GPUs as ResourceSlices (the chart's
    ``dra.enabled``) on a cluster that serves DeviceTaintRules (docs/decisions/0237)."""
    generated_secrets: tuple[GeneratedSecret, ...] = ()
    """Secrets created in the Lease's namespace when absent, never read: the Slurm keys
    the chart no longer renders (docs/decisions/0188)."""
    lease_duration_s: float = 30.0
    """How long the Lease holds without a renewal (a standby takes over this long after
    the holder stopped renewing). It is renewed every sixth of it, and the gate starts
    an act only while it holds for half of it more; a BMC request is given no longer."""
    identity: str = ""
    """This replica's name in the Lease (empty: host name and a random suffix)."""
    adoption_writes_per_s: float = 50.0
    """First writes of healthy nodes gpufleet has never seen, per second (decision 0124):
    they are acted on at once and labelled at this pace; 0 writes each at once."""
