"""HS256 tokens for slurmrestd and ``scontrol`` (``AuthAltTypes=auth/jwt``), the one minter.

The same claims ``scontrol token`` writes (``iat``, ``exp``, ``sun``), signed with the
cluster's JWT key (the chart's ``<release>-slurm-jwt`` Secret, or the local cluster's key
file), so neither the syncer nor the local cluster needs munge or a shell into slurmctld to
get a token. Here, below the products, because two of them mint (``gpufleet slurm token``
and the syncer's CLI; ``gpufleet.local`` for its cluster) and products do not import each
other; it is pure (HMAC over JSON, the time is an argument), so it fits ``domain``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _json(value: dict[str, object]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def mint(key: bytes, *, issued_at: float, user: str = "root", lifespan_s: int = 24 * 3600) -> str:
    """A token for ``user`` valid from ``issued_at`` (epoch seconds) for ``lifespan_s``."""
    issued = int(issued_at)
    header = _b64(_json({"alg": "HS256", "typ": "JWT"}))
    payload = _b64(_json({"iat": issued, "exp": issued + lifespan_s, "sun": user}))
    sig = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(sig)}"
