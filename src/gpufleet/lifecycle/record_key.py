"""The key the controller signs its records and marks with, kept in a Secret.

Every replica reads the same key (a Secret in the controller's namespace that
no other gpufleet identity may read); the first replica to start creates it
with 32 random bytes. A key that cannot be read or created leaves the
controller unable to trust any record: it does not act (fail closed) and says
why (docs/decisions/0144).
"""

from __future__ import annotations

import base64
import secrets

from gpufleet.api.nodedata import SigningKey
from gpufleet.kubeapi import SECRETS, ApiError, Conflict, KubePort, NotFound
from gpufleet.lifecycle.core import log

KEY_FIELD = "key"


class KeyUnavailable(Exception):
    """The signing key could not be read or created."""


async def load_or_create(client: KubePort, namespace: str, name: str) -> SigningKey:
    """The signing key in Secret ``namespace/name``; created once if it does not exist."""
    for _ in range(3):
        try:
            body = await client.get(SECRETS, name, namespace=namespace)
        except NotFound:
            pass
        except ApiError as exc:
            raise KeyUnavailable(f"Secret {namespace}/{name} could not be read: {exc}") from exc
        else:
            return _key_of(body, namespace, name)
        fresh = secrets.token_bytes(32)
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpufleet"},
            },
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(fresh).decode()},
        }
        try:
            await client.create(SECRETS, manifest, namespace=namespace)
        except Conflict:
            continue  # another replica created it first: read theirs
        except ApiError as exc:
            raise KeyUnavailable(f"Secret {namespace}/{name} could not be created: {exc}") from exc
        key = SigningKey.of(fresh)
        log.info("record signing key %s created in Secret %s/%s", key.kid, namespace, name)
        return key
    raise KeyUnavailable(f"Secret {namespace}/{name} neither read nor created")


def _key_of(body: dict[str, object], namespace: str, name: str) -> SigningKey:
    data = body.get("data") or {}
    raw = data.get(KEY_FIELD) if isinstance(data, dict) else None
    try:
        secret = base64.b64decode(str(raw), validate=True) if raw else b""
        return SigningKey.of(secret)
    except ValueError as exc:
        raise KeyUnavailable(f"Secret {namespace}/{name} holds no usable key: {exc}") from exc
