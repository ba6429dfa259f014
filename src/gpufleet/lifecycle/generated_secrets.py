"""Secrets an install needs that nobody named: created once by the controller, never read.

The chart renders no random data (a render is the same every time, so a GitOps tool that
renders without cluster access, such as Argo CD, does not replace the Slurm keys on each
sync); in its place the controller, which may already create Secrets in its namespace,
creates each missing one with random content (docs/decisions/0188). A Secret that is
already there, made by an earlier chart, by the operator or by the other replica, is left
exactly as it is: the create is refused as a conflict and the controller never reads it,
so it never holds the Slurm keys in memory.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
import string
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gpufleet.kubeapi import SECRETS, ApiError, Conflict, KubePort

log = logging.getLogger("gpufleet.controller")

ALPHABET = string.ascii_letters + string.digits
"""The keys' characters: printable, so a key survives a copy into a file or a value."""

RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Pauses between attempts while the apiserver refuses; the last repeats until done."""

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


@dataclass(frozen=True)
class GeneratedSecret:
    """Secret ``name`` with one key ``key`` of ``length`` random characters."""

    name: str
    key: str
    length: int

    @classmethod
    def parse(cls, text: str) -> GeneratedSecret:
        """``NAME:KEY:LENGTH`` (the controller's ``--generate-secret``); ValueError says why."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"{text!r}: expected NAME:KEY:LENGTH")
        name, key, length = parts
        if not _NAME.match(name) or len(name) > 253:
            raise ValueError(f"{name!r} is not a Secret name")
        if not _KEY.match(key):
            raise ValueError(f"{key!r} is not a Secret key")
        if not length.isdigit() or not 32 <= int(length) <= 4096:
            raise ValueError(f"{length!r}: a length from 32 to 4096 characters")
        return cls(name, key, int(length))

    def manifest(self, namespace: str) -> dict[str, object]:
        """The Secret with fresh random content."""
        value = "".join(secrets.choice(ALPHABET) for _ in range(self.length))
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpufleet"},
            },
            "type": "Opaque",
            "data": {self.key: base64.b64encode(value.encode()).decode()},
        }


async def ensure(client: KubePort, namespace: str, wanted: Sequence[GeneratedSecret]) -> list[str]:
    """Create each of ``wanted`` that does not exist; the names created. ApiError: retry."""
    created: list[str] = []
    for secret in wanted:
        try:
            await client.create(SECRETS, secret.manifest(namespace), namespace=namespace)
        except Conflict:
            continue  # there already: kept as it is, unread
        log.info("Secret %s/%s created (key %s)", namespace, secret.name, secret.key)
        created.append(secret.name)
    return created


async def ensure_until_done(
    client: KubePort,
    namespace: str,
    wanted: Sequence[GeneratedSecret],
    delays: Sequence[float] = RETRY_DELAYS_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """:func:`ensure`, again after each refusal: the pods that mount these Secrets wait
    for them, so a controller that could not create them says so and keeps trying."""
    attempt = 0
    while True:
        try:
            await ensure(client, namespace, wanted)
            return
        except ApiError as exc:
            delay = delays[min(attempt, len(delays) - 1)]
            log.error(
                "Secrets %s not created in %s (again in %.0f s): %s",
                ", ".join(s.name for s in wanted),
                namespace,
                delay,
                exc,
            )
            attempt += 1
            await sleep(delay)
