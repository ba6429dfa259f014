"""One acting replica: a Kubernetes Lease held by compare-and-swap, and the fence it gives.

Shared by every product that runs as replicas with one acting (the lifecycle
controller, the pod scheduler), so it lives beside the port it writes through.
Every replica of the controller watches and keeps its caches; only the one that
holds the Lease (``coordination.k8s.io/v1``, :attr:`ControllerSettings.lease`)
decides and acts. The rules are client-go's leader election, with the fence
the gate needs (docs/decisions/0141):

- the Lease is created, renewed and taken over only with its ``resourceVersion``
  (a 409 means someone else wrote it first: not the leader this round);
- a replica takes over only after it has seen the Lease unchanged for a whole
  ``leaseDurationSeconds`` on its *own* monotonic clock (no clock comparison
  across machines);
- the holder counts its lease from the moment it *sent* its last successful
  renewal, so its own view ends no later than the others' (``valid_until``);
- the gate acts only while the lease holds for a margin longer than any one
  BMC request takes (:meth:`Leadership.holds`), so an act never outlives the
  lease and never overlaps a successor's;
- losing the Lease (or failing to renew it in time) stops every acting task at
  once; a replica that stops cleanly releases the Lease for a quick handover;
- no Lease API (forbidden, absent) means nobody acts, and the log and the
  ``gpufleet_controller_leader`` gauge say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.kubeapi.errors import ApiError, Conflict, NotFound
from gpufleet.kubeapi.port import KubePort
from gpufleet.kubeapi.resources import LEASES
from gpufleet.kubeapi.slots import urgent

DURATION_S = 30.0
"""How long a lease holds without a renewal."""
RENEW_S = 5.0
"""How often the holder renews it."""
RETRY_S = 2.0
"""How often a standby looks at it."""


def default_identity() -> str:
    """This replica's name in the Lease: the pod (host) name and a random suffix."""
    host = os.environ.get("POD_NAME") or socket.gethostname() or "controller"
    return f"{host}-{secrets.token_hex(3)}"


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Leadership:
    """Holds or waits for the Lease; the :class:`~gpufleet.gate.Fence` of this process."""

    def __init__(
        self,
        client: KubePort,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration_s: float = DURATION_S,
        renew_s: float = RENEW_S,
        retry_s: float = RETRY_S,
        clock: Clock = SYSTEM_CLOCK,
        logger: logging.Logger | None = None,
    ) -> None:
        self._client = client
        self._log = logger or logging.getLogger("gpufleet.leadership")
        self.namespace = namespace
        self.name = name
        self._identity = identity
        self.duration_s = duration_s
        self.renew_s = renew_s
        self.retry_s = retry_s
        self._clock = clock
        self._leading = False
        self._valid_until = float("-inf")
        self._epoch = -1
        self._seen: tuple[Any, ...] | None = None
        """The Lease's (holder, renewTime, transitions) as last read, and when it changed."""
        self._seen_at = 0.0
        self.problem: str | None = None
        """Why this replica cannot lead (None: it can, or it does)."""

    # ----------------------------------------------------------------- the fence

    @property
    def holder(self) -> str:
        return self._identity

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def leading(self) -> bool:
        """Whether this replica holds the lease now."""
        return self._leading and self._clock.monotonic() < self._valid_until

    def holds(self, margin_s: float) -> bool:
        return self._leading and self._clock.monotonic() + margin_s < self._valid_until

    # ------------------------------------------------------------------ the loop

    async def run(
        self,
        on_lead: Callable[[], Awaitable[None]],
        on_lose: Callable[[str], None],
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        """Keep trying to hold the Lease until ``stopped``; tell the controller when it
        starts and stops leading. Releases the Lease when it ends while holding it."""
        try:
            while not stopped():
                was = self.leading
                await self.attempt()
                now_leading = self.leading
                if now_leading and not was:
                    self._log.info(
                        "lease %s/%s held by %s (epoch %d): acting",
                        self.namespace,
                        self.name,
                        self._identity,
                        self._epoch,
                    )
                    await on_lead()
                elif was and not now_leading:
                    on_lose(self.problem or "the lease was lost")
                await asyncio.sleep(self.renew_s if now_leading else self.retry_s)
                if self._leading and not self.leading:  # ran out between attempts
                    self._leading = False
                    on_lose("the lease ran out before it was renewed")
        finally:
            if self._leading:
                self._leading = False
                on_lose("stopping")
                with contextlib.suppress(ApiError, asyncio.CancelledError):
                    await self.release()

    async def attempt(self) -> bool:
        """One read and, if due, one compare-and-swap write of the Lease; whether held now.

        Both go before the process's ordinary requests (decision 0292): queued behind a
        storm's drains and steps, a renewal came too late, the lease was lost, every task
        stopped, and the takeover's own work starved the next renewal again."""
        with urgent():
            return await self._attempt()

    async def _attempt(self) -> bool:
        sent = self._clock.monotonic()
        try:
            lease = await self._client.get(LEASES, self.name, namespace=self.namespace)
        except NotFound:
            return await self._create(sent)
        except ApiError as exc:
            return self._failed(f"the Lease could not be read: {exc}")
        spec = lease.get("spec") or {}
        duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
        holder = str(spec.get("holderIdentity") or "")
        transitions = int(spec.get("leaseTransitions") or 0)
        seen = (holder, spec.get("renewTime"), transitions)
        if seen != self._seen:
            self._seen, self._seen_at = seen, sent
        if holder == self._identity:
            return await self._write(lease, sent, transitions, renew=True)
        expired = sent - self._seen_at >= duration
        if holder and not expired:
            self._leading = False
            self.problem = f"{holder} holds the lease"
            return False
        return await self._write(lease, sent, transitions + 1, renew=False)

    async def release(self) -> None:
        """Give the Lease up (a clean stop): a standby takes over at once."""
        lease = await self._client.get(LEASES, self.name, namespace=self.namespace)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self._identity:
            return
        await self._client.patch(
            LEASES,
            self.name,
            {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": None, "renewTime": None},
            },
            namespace=self.namespace,
        )
        self._log.info("lease %s/%s released by %s", self.namespace, self.name, self._identity)

    # --------------------------------------------------------------------- writes

    async def _create(self, sent: float) -> bool:
        now = _micro(self._clock.now())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self._identity,
                "leaseDurationSeconds": int(self.duration_s),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            await self._client.create(LEASES, body, namespace=self.namespace)
        except Conflict:
            return False  # another replica created it first
        except ApiError as exc:
            return self._failed(f"the Lease could not be created: {exc}")
        return self._won(sent, 0)

    async def _write(
        self, lease: Mapping[str, Any], sent: float, transitions: int, *, renew: bool
    ) -> bool:
        now = _micro(self._clock.now())
        spec: dict[str, Any] = {
            "holderIdentity": self._identity,
            "leaseDurationSeconds": int(self.duration_s),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if not renew:
            spec["acquireTime"] = now
        patch = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": spec,
        }
        try:
            await self._client.patch(LEASES, self.name, patch, namespace=self.namespace)
        except Conflict:
            self._leading = False
            self.problem = "another replica wrote the lease first"
            return False
        except ApiError as exc:
            return self._failed(f"the Lease could not be written: {exc}")
        return self._won(sent, transitions)

    def _won(self, sent: float, transitions: int) -> bool:
        self._leading = True
        self._valid_until = sent + self.duration_s
        self._epoch = transitions
        self.problem = None
        return True

    def _failed(self, why: str) -> bool:
        """A read or write failed: a holder keeps acting until its lease runs out (the gate's
        margin stops acts before that); nobody else acts meanwhile."""
        if self.problem != why:
            self._log.warning("lease %s/%s: %s", self.namespace, self.name, why)
        self.problem = why
        return self.leading
