"""HS256 tokens for slurmrestd and ``scontrol`` (``AuthAltTypes=auth/jwt``).

The same claims ``scontrol token`` writes (``iat``, ``exp``, ``sun``), signed
with the cluster's JWT key (the chart's ``<release>-slurm-jwt`` Secret), so the
syncer needs neither munge nor a shell into slurmctld to get a token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(
    key: bytes, user: str = "root", lifespan_s: int = 24 * 3600, now: float | None = None
) -> str:
    issued = int(time.time() if now is None else now)
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"iat": issued, "exp": issued + lifespan_s, "sun": user}
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    sig = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(sig)}"
