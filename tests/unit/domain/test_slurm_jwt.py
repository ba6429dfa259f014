"""The one Slurm JWT minter: a token slurmctld's auth/jwt accepts, as `scontrol token` writes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from gpufleet.domain import slurm_jwt


def test_minted_jwt_is_hs256_with_slurm_claims() -> None:
    key = b"k" * 32
    token = slurm_jwt.mint(key, issued_at=1_700_000_000.7, user="alice", lifespan_s=60)
    header, payload, signature = token.split(".")

    def dec(part: str) -> bytes:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

    assert json.loads(dec(header)) == {"alg": "HS256", "typ": "JWT"}
    assert json.loads(dec(payload)) == {"iat": 1_700_000_000, "exp": 1_700_000_060, "sun": "alice"}
    expected = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert dec(signature) == expected
    assert "=" not in token  # unpadded base64url, as JWT requires
