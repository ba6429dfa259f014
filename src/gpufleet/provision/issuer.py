"""Serving boots: find the Machine, check who asks, issue one join token per boot.

:class:`Provisioner` is the service without HTTP (the FastAPI app in
:mod:`gpufleet.provision.service` is a thin shell around it, the bench and the
``render`` command call it directly). Every answer that gives or refuses
something leaves an audit Event on the Machine (posted in the background, so
it never delays a boot) and a metric.

Issuing is a claim in two writes: first the Machine's status is patched
*disarmed, token X issued* with the ``resourceVersion`` just read (of two
concurrent requests for one boot, exactly one wins; the other gets 409 and is
refused), then the bootstrap-token Secret is created. If that second write
fails the machine is re-armed (best effort) and the boot retries: at worst a
machine is left disarmed with no token, which fails closed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import ValidationError

from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.domain import boot_watch, enrollment, well_known
from gpufleet.kubeapi import SECRETS, ApiError, Conflict, KubePort, NotFound
from gpufleet.kubeapi import machines as kube_machines
from gpufleet.kubeapi import secrets as kube_secrets
from gpufleet.kubeapi.events import event_body
from gpufleet.provision import machines, render
from gpufleet.provision.index import MachineIndex
from gpufleet.provision.ratelimit import Buckets, Limit
from gpufleet.remediate import identity, redfish
from gpufleet.remediate.bmc_tls import BmcTls

log = logging.getLogger("gpufleet.provision")
Json = dict[str, Any]
SEED_EXTRAS = {"vendor-data": "", "network-config": "config: disabled\n"}
"""The NoCloud seed's other two documents (:meth:`Provisioner.seed_extra`)."""
TOKEN_NAMESPACE = kube_machines.TOKEN_NAMESPACE
MACHINES = kube_machines.MACHINES


@dataclass(frozen=True)
class ServiceSettings:
    """How the service runs; every field has a default suited to production."""

    token_ttl_s: float = 900.0
    """Lifetime of a join token: long enough for a slow kubeadm join, short enough
    that a leaked one is soon worthless (the token cleaner then deletes it)."""
    event_namespace: str = "default"
    """Where audit Events about Machines (cluster-scoped) go."""
    per_client: Limit = Limit(rate=200.0, burst=400)  # noqa: RUF009 (frozen)
    """Requests per source address (a whole rack may boot behind one relay)."""
    per_mac: Limit = Limit(rate=1.0, burst=10)  # noqa: RUF009 (frozen)
    """Requests per MAC: a boot takes three or four (iPXE, meta-data, user-data, a retry);
ten at once or more than one a second for long is a boot loop or an attack."""
    bmc_timeout_s: float = 5.0
    """Per BMC request when checking a presented serial."""
    bmc_ca_file: str | None = None
    """CA bundle (PEM) for BMCs whose Secret has no ``ca.crt`` (``--bmc-ca-bundle``)."""


class _Stale(Exception):
    """A decision made on the index's copy of a Machine must be made again on a fresh read."""


class BmcEndpointRefused(Exception):
    """The Machine's BMC endpoint is not its Secret's: the BMC was not asked."""


class Refused(Exception):
    """The request gets nothing; ``status`` is the HTTP status, ``reason`` is for the log."""

    def __init__(self, status: int, reason: str, public: str = "refused") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.public = public
        """What the requester is told (little: an unknown MAC learns nothing)."""


@dataclass(frozen=True)
class Boot:
    """What a known machine gets at cloud-init time."""

    machine: str
    token: str
    token_id: str
    expires_at: float
    user_data: str


@dataclass
class ProvisionMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "gpufleet_provision_requests_total",
            "Provisioning requests, by endpoint and result.",
            ["endpoint", "result"],
            registry=r,
        )
        self.unknown = Counter(
            "gpufleet_provision_unknown_mac_total",
            "Boot requests from MAC addresses no Machine lists.",
            registry=r,
        )
        self.tokens = Counter(
            "gpufleet_provision_tokens_issued_total", "Join tokens issued.", registry=r
        )
        self.refusals = Counter(
            "gpufleet_provision_refusals_total",
            "Token requests refused, by reason class.",
            ["reason"],
            registry=r,
        )
        self.latency = Histogram(
            "gpufleet_provision_request_seconds",
            "Time to answer a provisioning request, by endpoint.",
            ["endpoint"],
            buckets=(0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )


def _iso(t: float) -> str:
    return enrollment.rfc3339(t)


def token_state(body: Json) -> enrollment.TokenState:
    """The token bookkeeping of a Machine object. A Machine never booted is armed."""
    status = body.get("status") or {}
    armed = status.get("armed")
    return enrollment.TokenState(
        armed=True if armed is None and not status.get("tokenId") else bool(armed),
        token_id=status.get("tokenId"),
        issued_at=enrollment.parse_rfc3339(status.get("tokenIssuedAt")),
        expires_at=enrollment.parse_rfc3339(status.get("tokenExpiresAt")),
    )


def token_secret(machine: str, token_id: str, token_secret: str, expires_at: float) -> Json:
    """A ``bootstrap.kubernetes.io/token`` Secret as kubeadm creates one, bound to a machine."""
    return enrollment.secret_body(
        token_id,
        token_secret,
        expires_at,
        namespace=TOKEN_NAMESPACE,
        description=f"gpufleet: single-use join token for machine {machine}",
        labels={well_known.LABEL_MACHINE: machine},
    )


def new_token() -> tuple[str, str]:
    """22 uniformly random characters of [a-z0-9], from ``secrets.token_bytes`` calls
    instead of 22 ``secrets.choice`` calls."""
    return enrollment.random_token(secrets.token_bytes)


class Provisioner:
    """The provisioning service's logic, over a :class:`~gpufleet.kubeapi.KubePort`."""

    def __init__(
        self,
        api: KubePort,
        config: render.BootConfig,
        settings: ServiceSettings | None = None,
        *,
        metrics: ProvisionMetrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
        bmc_serial: Callable[[Json, machines.MachineSpec], Any] | None = None,
        index: MachineIndex | None = None,
    ) -> None:
        self.api = api
        self.index = index
        """Machines by MAC from a watch; None: every lookup reads the apiserver."""
        self.config = config
        self.settings = settings or ServiceSettings()
        self.metrics = metrics or ProvisionMetrics()
        self.clock = clock
        self._per_client = Buckets(self.settings.per_client, clock.monotonic)
        self._per_mac = Buckets(self.settings.per_mac, clock.monotonic)
        self._tasks: set[asyncio.Task[None]] = set()
        self._bmc_serial = bmc_serial or self._read_bmc_serial

    # ---------------------------------------------------------------- common

    def rate_limit(self, client: str, mac: str) -> None:
        """Token buckets per source address and per MAC. The MAC is keyed as it is
        stored (``aa:bb:..``), so ``AA-BB-..``, ``aabb.cc..`` and ``aabbcc..`` share one
        bucket; malformed MACs share one bucket of their own (they are refused 400
        without an apiserver request anyway)."""
        if not self._per_client.allow(client):
            raise Refused(429, f"rate limit for {client}", "too many requests")
        try:
            key = machines.normalize_mac(mac)
        except ValueError:
            key = "(malformed)"
        if not self._per_mac.allow(key):
            raise Refused(429, f"rate limit for MAC {key}", "too many requests")

    async def find(
        self, mac: str, *, endpoint: str, client: str, fresh: bool = False
    ) -> tuple[str, Json]:
        """The Machine that lists this MAC; an unknown MAC is refused with an Event.

        From the index when it has the MAC (unless ``fresh``), else from the apiserver.
        """
        name, body, _ = await self._find(mac, endpoint=endpoint, client=client, fresh=fresh)
        return name, body

    async def _find(
        self, mac: str, *, endpoint: str, client: str, fresh: bool = False
    ) -> tuple[str, Json, bool]:
        """:meth:`find`, also saying whether the answer came from the index."""
        try:
            mac = machines.normalize_mac(mac)
        except ValueError:
            raise Refused(400, f"malformed MAC {mac!r}", "not a MAC address") from None
        body = None if fresh or self.index is None else self.index.lookup(mac)
        cached = body is not None
        if body is None:
            body = await machine_by_mac(self.api, mac)
        if body is None or mac not in ((body.get("spec") or {}).get("macs") or []):
            self.metrics.unknown.inc()
            self.audit(
                None,
                "UnknownMachine",
                f"{endpoint} request from {client} for unknown MAC {mac}: refused",
                warning=True,
            )
            raise Refused(404, f"unknown MAC {mac}", "not found")
        return str(body["metadata"]["name"]), body, cached

    def audit(self, machine: str | None, reason: str, message: str, *, warning: bool) -> None:
        """Post an audit Event about a Machine (or about an unknown one) in the background."""
        name = machine or "unknown"
        event = event_body(
            involved={"apiVersion": machines.API_VERSION, "kind": machines.KIND, "name": name},
            type_="Warning" if warning else "Normal",
            reason=reason,
            message=message,
            component=well_known.PROVISIONER,
            instance=well_known.PROVISIONER,
            namespace=self.settings.event_namespace,
            first=_iso(self.clock.now()),
        )
        log.info("machine=%s %s: %s", name, reason, message)
        try:
            task = asyncio.get_running_loop().create_task(self._post(event))
        except RuntimeError:
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, event: Json) -> None:
        try:
            await self.api.create_event(self.settings.event_namespace, event)
        except ApiError as exc:
            log.warning("audit event not posted: %s", exc)

    async def drain_events(self) -> None:
        """Wait for the audit Events still being posted (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ------------------------------------------------------------------ iPXE

    async def ipxe(self, mac: str, *, client: str) -> str:
        self.rate_limit(client, mac)
        name, body, cached = await self._find(mac, endpoint="ipxe", client=client)
        try:
            machines.spec_of(body)
        except ValidationError as exc:
            raise Refused(409, f"machine {name} has an invalid spec: {exc}") from None
        image = (body.get("status") or {}).get("image") or None
        try:
            script = render.ipxe(self.config, name, machines.normalize_mac(mac), image)
        except render.ImageNotServed as exc:
            self.audit(name, "ImageNotServed", f"request from {client}: {exc}", warning=True)
            raise Refused(409, str(exc), "no image for this machine") from None
        await self._record_network_boot(name, body, client=client, cached=cached)
        return script

    async def _record_network_boot(
        self, name: str, body: Json, *, client: str, cached: bool
    ) -> None:
        """``status.boot.networkBootAt``: the machine's firmware reached us (the boot
        watchdog's second stage), for a boot gpufleet requested only.

        ``GET /ipxe`` is unauthenticated: anyone on the boot network can send it
        for any MAC. So it never *starts* a watched boot (a watched boot that
        stalls is power-cycled through the Machine's BMC): a Machine with no boot
        in progress (never powered on through gpufleet, joined, failed, or powered
        on by hand) gets its script, an ``UnrequestedNetworkBoot`` Event, and
        nothing the watchdog acts on (decision 0160). The index's copy may predate
        a power-on, so "no boot in progress" is confirmed on a fresh read.
        Best effort: a boot is never refused because its progress was not written.
        """
        status = body.get("status") or {}
        if boot_watch.progress_of(status) is None and cached:
            try:
                status = (await self.api.get(MACHINES, name)).get("status") or {}
            except ApiError as exc:
                log.warning("machine=%s not read again, network boot not recorded: %s", name, exc)
                return
        if boot_watch.progress_of(status) is None:
            self.audit(
                name,
                "UnrequestedNetworkBoot",
                f"iPXE script served to {client}, but no boot of this machine was requested "
                "through gpufleet (gpufleet machines power-on or the boot watchdog): this boot "
                "is not watched, and nothing is power-cycled if it stalls",
                warning=False,
            )
            return
        patch = boot_watch.network_boot_status(self.clock.now())
        try:
            await self.api.patch(MACHINES, name, {"status": patch}, status=True)
        except ApiError as exc:
            log.warning("machine=%s network boot not recorded: %s", name, exc)

    async def meta_data(self, mac: str, *, client: str) -> str:
        self.rate_limit(client, mac)
        name, _ = await self.find(mac, endpoint="meta-data", client=client)
        return render.meta_data(name)

    async def seed_extra(self, mac: str, document: str, *, client: str) -> str:
        """``vendor-data`` or ``network-config`` of the NoCloud seed (no secrets).

        cloud-init's NoCloud datasource fetches both besides meta-data and
        user-data and retries each 404 ten times a second apart: 20 s of every
        boot. vendor-data is empty; network-config is disabled, as the node image's
        own configuration says (systemd-networkd brings up every NIC by DHCP).
        """
        if document not in SEED_EXTRAS:
            raise Refused(404, f"no seed document {document!r}", "not found")
        self.rate_limit(client, mac)
        await self.find(mac, endpoint=document, client=client)
        return SEED_EXTRAS[document]

    # ------------------------------------------------------------ cloud-init

    async def _read_bmc_serial(self, body: Json, spec: machines.MachineSpec) -> str | None:
        """The serial the Machine's BMC reports, asked at the endpoint its Secret names.

        Credentials go only to the endpoint stored with them: a Machine whose
        ``spec.bmc.endpoint`` disagrees with its Secret's (or a Secret with no
        endpoint) is refused here (``BmcEndpointMismatch`` Event), which fails the
        serial check closed; the BMC is never asked.
        """
        name = str(body["metadata"]["name"])
        ref = spec.bmc.credentials_secret
        ns, _, secret_name = ref.partition("/")
        data = kube_secrets.decode_data(await self.api.get(SECRETS, secret_name, namespace=ns))
        problem = identity.endpoint_problem(name, spec.bmc.endpoint, ref, data.get("endpoint"))
        if problem is not None:
            self.audit(name, "BmcEndpointMismatch", problem, warning=True)
            raise BmcEndpointRefused(problem)
        creds = redfish.BmcCredentials(
            endpoint=str(data["endpoint"]).strip(),
            username=data.get("username", ""),
            password=data.get("password", ""),
            tls=BmcTls.from_secret(data, ref),
        )
        async with redfish.RedfishClient(
            creds,
            name=name,
            timeout_s=self.settings.bmc_timeout_s,
            retry_delays=(0.2,),
            default_ca_file=self.settings.bmc_ca_file,
        ) as bmc:
            return await bmc.serial_number()

    async def user_data(
        self,
        mac: str,
        *,
        client: str,
        enrollment_secret: str | None = None,
        serial: str | None = None,
    ) -> Boot:
        """Authenticate, claim this boot's token, create it, render the user-data.

        The first attempt may decide on the index's copy of the Machine. That copy
        is only a guess: a refusal is confirmed on a fresh read before it is
        answered, and the claim carries the copy's ``resourceVersion``, so a stale
        copy makes the claim fail (409, or 404 for a deleted Machine) and the
        decision is made again on a fresh read. A token is issued only by a claim
        that won against the Machine as it is in the apiserver.
        """
        self.rate_limit(client, mac)
        name, body, cached = await self._find(mac, endpoint="user-data", client=client)
        bmc_memo: dict[tuple[str, str], str | None] = {}
        if cached:
            try:
                return await self._issue(
                    name, body, mac, client, enrollment_secret, serial, bmc_memo, tentative=True
                )
            except _Stale:
                name, body = await self.find(mac, endpoint="user-data", client=client, fresh=True)
        try:
            return await self._issue(
                name, body, mac, client, enrollment_secret, serial, bmc_memo, tentative=False
            )
        except _Stale:  # pragma: no cover (only tentative attempts raise it)
            raise Refused(409, "machine changed while claiming", "no token for this boot") from None

    async def _issue(
        self,
        name: str,
        body: Json,
        mac: str,
        client: str,
        enrollment_secret: str | None,
        serial: str | None,
        bmc_memo: dict[tuple[str, str], str | None],
        *,
        tentative: bool,
    ) -> Boot:
        """One attempt; ``tentative`` (``body`` from the index): raise :class:`_Stale`
        instead of refusing, and when the claim loses. ``bmc_memo`` keeps a BMC's
        answer for the second attempt (one BMC request per boot request)."""
        try:
            spec = machines.spec_of(body)
        except ValidationError as exc:
            if tentative:
                raise _Stale from None
            raise Refused(409, f"machine {name} has an invalid spec: {exc}") from None
        bmc_serial: str | None = None
        if serial and not enrollment_secret:
            key = (spec.bmc.endpoint, spec.bmc.credentials_secret)
            if key in bmc_memo:
                bmc_serial = bmc_memo[key]
            else:
                try:
                    bmc_serial = await self._bmc_serial(body, spec)
                except (redfish.RedfishError, ApiError, BmcEndpointRefused) as exc:
                    log.warning("machine=%s BMC serial not read: %s", name, exc)
                bmc_memo[key] = bmc_serial
        who = enrollment.authenticate(
            presented_secret=enrollment_secret,
            secret_digest=spec.enrollment_digest,
            presented_serial=serial,
            inventory_serial=spec.serial,
            bmc_serial=bmc_serial,
        )
        if not who.allowed:
            if tentative:
                raise _Stale
            self._refuse(name, client, "authentication", who.reason)
            raise Refused(403, who.reason, "forbidden")
        now = self.clock.now()
        may = enrollment.may_issue(token_state(body), now)
        if not may.allowed:
            if tentative:
                raise _Stale
            self._refuse(name, client, "not-armed", may.reason)
            raise Refused(409, may.reason, "no token for this boot")
        token_id, token_secret_ = new_token()
        expires = now + self.settings.token_ttl_s
        issued = int((body.get("status") or {}).get("tokensIssued") or 0) + 1
        claim = {
            "armed": False,
            "tokenId": token_id,
            "tokenIssuedAt": _iso(now),
            "tokenExpiresAt": _iso(expires),
            "tokensIssued": issued,
            "lastBootAt": _iso(now),
            "phase": "Booting",
            "message": f"token {token_id} issued to {client} ({who.method})",
        }
        try:
            # The resourceVersion guards the claim: a second boot that read the same
            # armed Machine gets Conflict.
            guarded: Json = {"status": claim}
            if rv := body["metadata"].get("resourceVersion"):
                guarded["metadata"] = {"resourceVersion": rv}
            await self.api.patch(MACHINES, name, guarded, status=True)
        except (Conflict, NotFound) as exc:
            if tentative:
                raise _Stale from None
            if isinstance(exc, NotFound):
                raise Refused(404, f"machine {name} deleted while claiming", "not found") from None
            reason = "another request claimed this boot's token first"
            self._refuse(name, client, "not-armed", reason)
            raise Refused(409, reason, "no token for this boot") from None
        try:
            await self.api.create(
                SECRETS,
                token_secret(name, token_id, token_secret_, expires),
                namespace=TOKEN_NAMESPACE,
            )
        except ApiError as exc:
            log.error("machine=%s token Secret not created, re-arming: %s", name, exc)
            try:
                await self.api.patch(
                    MACHINES,
                    name,
                    {
                        "status": enrollment.rearm_status(
                            by=well_known.PROVISIONER,
                            at=self.clock.now(),
                            reason=f"token failed: {exc}",
                        )
                    },
                    status=True,
                )
            except ApiError as exc2:
                log.error("machine=%s left disarmed (fail closed): %s", name, exc2)
            raise Refused(503, f"token not created: {exc}", "try again") from None
        self.metrics.tokens.inc()
        self.audit(
            name,
            "TokenIssued",
            f"join token {token_id} (expires {_iso(expires)}) issued to {client} for MAC "
            f"{machines.normalize_mac(mac)}: {who.reason}",
            warning=False,
        )
        token = f"{token_id}.{token_secret_}"
        return Boot(
            machine=name,
            token=token,
            token_id=token_id,
            expires_at=expires,
            user_data=render.user_data(self.config, name, spec, token),
        )

    def _refuse(self, name: str, client: str, kind: str, reason: str) -> None:
        self.metrics.refusals.labels(reason=kind).inc()
        self.audit(name, "TokenRefused", f"request from {client}: {reason}", warning=True)

    # ------------------------------------------------------------------ admin

    async def rearm(self, name: str, *, by: str, reason: str) -> None:
        """Arm a machine for its next boot and delete the previous boot's token."""
        await rearm(self.api, name, by=by, reason=reason, now=self.clock.now())
        self.audit(name, "Rearmed", f"re-armed by {by}: {reason}", warning=False)


async def rearm(api: KubePort, name: str, *, by: str, reason: str, now: float) -> None:
    """Arm the Machine for its next boot and revoke the previous boot's token
    (:func:`gpufleet.kubeapi.machines.rearm`, shared with the lifecycle controller)."""
    await kube_machines.rearm(api, name, by=by, reason=reason, now=now)


async def machine_by_mac(api: KubePort, mac: str) -> Json | None:
    """The one Machine carrying ``mac`` (its MAC label), or None (none, or ambiguous)."""
    items = (await api.list(MACHINES, label_selector=machines.mac_label(mac))).items
    return items[0] if len(items) == 1 else None
