"""Wiring of the lifecycle controller into kopf: watches, the tick daemon, HA, metrics.

kopf provides the watches (Nodes, FleetPolicies, Machines, MaintenancePlans),
finite error backoffs, and the daemon that ticks the fleet. Which replica acts
is not kopf's peering (a priority, not a lease: no fence, and a paused replica's
tasks ran on) but a Kubernetes Lease held by compare-and-swap
(:mod:`gpufleet.lifecycle.leadership`, docs/decisions/0141): every replica
watches and keeps its caches, only the Lease's holder decides and acts, and
without a Lease nobody acts. The handlers are thin: all decisions are in
:class:`gpufleet.lifecycle.controller.Controller` (and below it, ``domain``).

Node handlers are ``on.event`` handlers on purpose: they keep no progress in
the Node (kopf writes nothing there), and they run on every change with no
extra round trip, which is what makes sub-second cordons possible.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from prometheus_client import start_http_server

from gpufleet.api import maintenanceplan
from gpufleet.domain import well_known
from gpufleet.gate import GateSettings, redfish_bmcs
from gpufleet.kubeapi import SERVICE_IN_FLIGHT, KubeApi, contexts
from gpufleet.lifecycle import crds, generated_secrets
from gpufleet.lifecycle.controller import Controller, ControllerSettings
from gpufleet.lifecycle.leadership import Leadership, default_identity
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.remediate import redfish

log = logging.getLogger("gpufleet.controller")

FINALIZER = f"{well_known.GROUP}/controller"
ERROR_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21)
"""Seconds between retries of a failing API connection (finite, as kopf's own default)."""
QUEUE_ERROR_DELAYS = (1, 1, 2, 3, 5, 8, 13, 21, 34, 55)
"""Seconds between retries of a handler that raised (finite)."""


class NodesWithoutDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's default diff base, except for Nodes: none is built for them.

    For every watch event kopf deep-copies the object, to compare it with what a change
    handler saw last. The controller has no change handler and no daemon on Nodes, only
    ``kopf.on.event``, which is handed every event as it is: for Nodes that copy was never
    read, and it was 6-7 % of the controller's CPU in a burst of 100 faults at 2,000 nodes
    (each of its own writes comes back as an event too). ``None`` is kopf's own "no
    essence": the diff is empty and nothing is stored. Other kinds keep the default. A
    change handler, daemon or timer on Nodes needs the default back (decision 0223)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        if _is_node(body):
            return None
        return super().build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> Any:
        if _is_node(body):
            return None
        return super().fetch(body=body)


def _is_node(body: Mapping[str, Any]) -> bool:
    """kopf sets ``kind`` and ``apiVersion`` on listed objects too (watched ones carry them)."""
    return body.get("kind") == "Node" and body.get("apiVersion") == "v1"


@dataclass(frozen=True)
class RunOptions:
    """How ``gpufleet controller`` runs."""

    kubeconfig: str | None = None
    metrics_port: int = 0
    """0: no metrics endpoint."""
    metrics_address: str = "127.0.0.1"
    """Where /metrics listens: loopback unless asked (the chart passes 0.0.0.0)."""


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ACCOUNT_TOKEN = f"{SERVICE_ACCOUNT_DIR}/token"


def uses_service_account(env: Mapping[str, str], token_file: str = SERVICE_ACCOUNT_TOKEN) -> bool:
    """In a pod with no kubeconfig named: the pod's ServiceAccount, as kr8s does for
    :class:`~gpufleet.kubeapi.KubeApi` (kopf's kubeconfig login finds no file there)."""
    return not env.get("KUBECONFIG") and os.path.isfile(token_file)


def service_account_login(
    env: Mapping[str, str], directory: str = SERVICE_ACCOUNT_DIR
) -> kopf.ConnectionInfo:
    """The pod's ServiceAccount, at the address the kubelet put in the environment
    (``KUBERNETES_SERVICE_HOST``/``_PORT``), as client-go's in-cluster config does.

    Not kopf's own service-account login: it dials ``kubernetes.default.svc``, which
    needs cluster DNS, so a controller on a cluster whose DNS is down could not act,
    and that is when nodes need it. The token is read on every login: kopf logs in again
    after a 401, which is how a rotated (projected) token is picked up.
    """
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise kopf.LoginError("in a pod without KUBERNETES_SERVICE_HOST: no apiserver to call")
    if ":" in host:
        host = f"[{host}]"  # IPv6
    with open(f"{directory}/token", encoding="utf-8") as f:
        token = f.read().strip()
    namespace = None
    if os.path.isfile(f"{directory}/namespace"):
        with open(f"{directory}/namespace", encoding="utf-8") as f:
            namespace = f.read().strip() or None
    ca = f"{directory}/ca.crt"
    return kopf.ConnectionInfo(
        server=f"https://{host}:{port}",
        ca_path=ca if os.path.isfile(ca) else None,
        token=token or None,
        default_namespace=namespace,
    )


async def context_login(kubeconfig: str | None) -> kopf.ConnectionInfo:
    """The kubeconfig's chosen context (``--context``), resolved as the controller's own
    client resolves it: kopf's kubeconfig login reads only the current-context (and no
    exec plugin), so with a context named the two clients could reach different clusters."""
    found = (await KubeApi.connect(kubeconfig)).credentials()
    return kopf.ConnectionInfo(
        server=found.server,
        ca_path=found.ca_file,
        insecure=found.insecure,
        certificate_path=found.cert_file,
        private_key_path=found.key_file,
        token=found.token,
    )


async def _hold_lease(ctl: Controller, leadership: Leadership) -> None:
    """Hold the Lease for as long as the process runs; act only while holding it."""

    async def lead() -> None:
        ctl.metrics.leader.set(1)
        await ctl.activate()

    def lose(why: str) -> None:
        ctl.metrics.leader.set(0)
        log.warning("not acting: %s", why)
        ctl.deactivate(why)

    await leadership.run(lead, lose)


def build_registry(
    ctl: Controller,
    leadership: Leadership,
    options: RunOptions,
    primed: Callable[[], None] = lambda: None,
) -> kopf.OperatorRegistry:
    """The controller's handlers; ``primed`` is called once every record is held (the
    metrics endpoint starts then: the chart's probes read it, so a replica is Ready only
    once it could log in and list the fleet, active or standing by)."""
    registry = kopf.OperatorRegistry()
    policy_name = ctl.settings.policy_name
    lease_task: list[asyncio.Task[None]] = []

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> Any:
        if uses_service_account(os.environ):
            return service_account_login(os.environ)
        if contexts.chosen():
            return await context_login(options.kubeconfig)
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING
        settings.networking.error_backoffs = ERROR_BACKOFFS
        settings.queueing.error_delays = QUEUE_ERROR_DELAYS
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.persistence.diffbase_storage = NodesWithoutDiffBase()
        if ctl.settings.generated_secrets:  # every replica: the first one there creates
            lease_task.append(
                asyncio.create_task(
                    generated_secrets.ensure_until_done(
                        ctl.client,
                        ctl.settings.lease_namespace or ctl.settings.event_namespace,
                        ctl.settings.generated_secrets,
                    )
                )
            )
        await ctl.prime()
        primed()
        lease_task.append(asyncio.create_task(_hold_lease(ctl, leadership)))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in lease_task:  # releases the Lease (a standby takes over at once)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await ctl.close()

    @kopf.on.event(
        "", "v1", "nodes", registry=registry, labels=dict(ctl.settings.node_selector) or None
    )
    async def node_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            ctl.on_node_deleted(body["metadata"]["name"])
            return
        await ctl.on_node(dict(body))

    @kopf.on.event(
        well_known.GROUP, well_known.VERSION, well_known.MACHINE_PLURAL, registry=registry
    )
    async def machine_event(type: str, body: kopf.Body, **_: Any) -> None:
        ctl.on_machine(type or "", body)

    @kopf.on.event(well_known.GROUP, well_known.VERSION, maintenanceplan.PLURAL, registry=registry)
    async def plan_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            ctl.on_plan_deleted(body["metadata"]["name"])
            return
        ctl.on_plan(dict(body))

    def is_ours(name: str, **_: Any) -> bool:
        return name == policy_name

    @kopf.on.event(
        well_known.GROUP,
        well_known.VERSION,
        crds.FLEET_POLICY_PLURAL,
        registry=registry,
        when=is_ours,
    )
    async def policy_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            ctl.on_policy_deleted()
            return
        await ctl.on_policy(dict(body))

    @kopf.daemon(
        well_known.GROUP,
        well_known.VERSION,
        crds.FLEET_POLICY_PLURAL,
        registry=registry,
        when=is_ours,
        cancellation_timeout=5,
    )
    async def ticker(stopped: kopf.DaemonStopped, **_: Any) -> None:
        while not stopped:
            # The fleet's tick, then the Day-0 boot watchdog (a pass over the booting
            # Machines only); one failing never stops the other.
            for what, work in (("tick", ctl.tick_all), ("boot watch", ctl.watch_boots)):
                try:
                    await work()
                except Exception:
                    log.exception("%s failed", what)
            await asyncio.sleep(ctl.settings.tick_s)

    return registry


async def run(
    settings: ControllerSettings,
    options: RunOptions,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the controller until ``stop_flag`` is set (or the process is signalled)."""
    if options.kubeconfig:
        os.environ["KUBECONFIG"] = options.kubeconfig
    metrics = Metrics()

    def serve_metrics() -> None:
        if options.metrics_port:
            start_http_server(
                options.metrics_port, addr=options.metrics_address, registry=metrics.registry
            )

    client = await KubeApi.connect(options.kubeconfig, max_in_flight=SERVICE_IN_FLIGHT)
    metrics.count_requests(client.requests)
    leadership = Leadership(
        client,
        namespace=settings.lease_namespace or settings.event_namespace,
        name=settings.lease,
        identity=settings.identity or default_identity(),
        duration_s=settings.lease_duration_s,
        renew_s=settings.lease_duration_s / 6,
    )
    margin = settings.lease_duration_s / 2
    ctl = Controller(
        client,
        settings,
        metrics,
        fence=leadership,
        bmcs=redfish_bmcs(
            timeout_s=min(redfish.REQUEST_TIMEOUT_S, margin),
            retry_delays=settings.bmc_retry_delays,
            ca_file=settings.bmc_ca_file,
        ),
        gate_settings=GateSettings(
            lease_margin_s=margin, graceful_settle_s=settings.graceful_settle_s
        ),
    )
    metrics.count_stays(ctl.fleet.records)
    registry = build_registry(ctl, leadership, options, primed=serve_metrics)
    await kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
