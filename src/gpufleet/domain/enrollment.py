"""Who may get a join token, and when: the Day-0 decisions, without I/O.

A booting machine gets a Kubernetes bootstrap token only if

1. it proves who it is: the per-machine enrollment secret (compared with the
   SHA-256 the Machine stores, never the secret itself), or the serial number
   it reads from its firmware, which must equal both the serial its BMC
   reports out of band and the inventory's (:func:`authenticate`);
2. its Machine is *armed*: imported and never booted, or re-armed by the
   remediation controller (reimage) or an admin. Issuing a token disarms it, so
   a second request for the same boot, a replayed request or a stolen
   enrollment secret gets nothing until someone re-arms it (:func:`may_issue`).

The token format is kubeadm's: ``[a-z0-9]{6}.[a-z0-9]{16}``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

TOKEN = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
SECRET_PREFIX = "bootstrap-token-"
SECRET_TYPE = "bootstrap.kubernetes.io/token"
USAGES = ("usage-bootstrap-authentication", "usage-bootstrap-signing")
"""The usages kubeadm gives a node-join token: authenticate, and sign the
cluster-info ConfigMap for discovery."""
EXTRA_GROUPS = "system:bootstrappers:kubeadm:default-node-token"
"""The group kubeadm's RBAC lets create CSRs and be auto-approved; every
bootstrap token also gets ``system:bootstrappers``."""
BOOTSTRAPPERS = "system:bootstrappers"


def parse_token(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed bootstrap token, else None."""
    m = TOKEN.match(token)
    return (m.group(1), m.group(2)) if m else None


def secret_name(token_id: str) -> str:
    """The kube-system Secret that holds a bootstrap token."""
    return f"{SECRET_PREFIX}{token_id}"


def digest(secret: str) -> str:
    """What a Machine stores about its enrollment secret: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


def rfc3339(t: float) -> str:
    """Seconds since the epoch as RFC 3339 UTC text to the second: a bootstrap token's
    ``expiration``, condition and Event times (the one formatter for them)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: object) -> float | None:
    """RFC 3339 text (as :func:`rfc3339` writes it, or with an offset) as epoch seconds;
    None when absent or unreadable (a reader treats that as unknown)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Allowed or not, and why (the audit Event's message)."""

    allowed: bool
    reason: str
    method: str = ""
    """How the machine proved itself: ``enrollment-secret`` or ``serial``."""


def authenticate(
    *,
    presented_secret: str | None,
    secret_digest: str | None,
    presented_serial: str | None,
    inventory_serial: str,
    bmc_serial: str | None,
) -> Verdict:
    """Whether the requester is the machine it claims to be.

    The enrollment secret wins when presented; a wrong one is a refusal even if
    a serial is presented too. The serial alone is weaker (it is printed on the
    box), so it must agree with the BMC, which answers only on the management
    network; a BMC that did not answer (``bmc_serial`` None) means no (fail closed).
    """
    if presented_secret:
        if not secret_digest:
            return Verdict(False, "an enrollment secret was presented, but none is enrolled")
        ok = hmac.compare_digest(digest(presented_secret), secret_digest)
        return Verdict(
            ok,
            "enrollment secret accepted" if ok else "wrong enrollment secret",
            "enrollment-secret",
        )
    if presented_serial:
        if bmc_serial is None:
            return Verdict(False, "serial presented, but the BMC did not report one", "serial")
        if not hmac.compare_digest(presented_serial, bmc_serial):
            return Verdict(False, "the serial differs from the one the BMC reports", "serial")
        if not hmac.compare_digest(presented_serial, inventory_serial):
            return Verdict(
                False, "the BMC's serial differs from the inventory's (wrong machine?)", "serial"
            )
        return Verdict(True, "serial matches the BMC and the inventory", "serial")
    return Verdict(False, "no credentials: send the enrollment secret or the serial")


@dataclass(frozen=True, slots=True)
class TokenState:
    """The token bookkeeping in a Machine's status."""

    armed: bool
    token_id: str | None = None
    issued_at: float | None = None
    expires_at: float | None = None


def may_issue(state: TokenState, now: float) -> Verdict:
    """Whether this boot may get a new token (only an armed machine may)."""
    if state.armed:
        return Verdict(True, "the machine is armed for this boot")
    if state.token_id and state.issued_at is not None:
        when = rfc3339(state.issued_at)
        if state.expires_at is not None and state.expires_at > now:
            return Verdict(
                False,
                f"token {state.token_id} was already issued for this boot at {when}; "
                "one token per boot: re-arm the machine to issue another",
            )
        return Verdict(
            False,
            f"token {state.token_id} issued at {when} has expired or was used; "
            "re-arm the machine to issue another",
        )
    return Verdict(False, "the machine is not armed; re-arm it (gpufleet machines rearm NAME)")


def token_from(random_chars: str) -> tuple[str, str]:
    """A token ``(id, secret)`` from 22 random characters of :data:`TOKEN_ALPHABET`.

    The randomness is the caller's (``secrets``), keeping this module pure.
    """
    if len(random_chars) != 22 or any(c not in TOKEN_ALPHABET for c in random_chars):
        raise ValueError("need 22 characters of [a-z0-9]")
    return random_chars[:6], random_chars[6:]


def random_token(token_bytes: Callable[[int], bytes]) -> tuple[str, str]:
    """A token ``(id, secret)`` of 22 uniformly random characters of :data:`TOKEN_ALPHABET`
    drawn from ``token_bytes`` (the caller's ``secrets.token_bytes``): a byte below
    252 = 7 x 36, mod 36, so each character is equally likely."""
    alphabet = TOKEN_ALPHABET
    limit = 256 - 256 % len(alphabet)
    chars: list[str] = []
    while len(chars) < 22:
        chars.extend(alphabet[b % len(alphabet)] for b in token_bytes(32) if b < limit)
    return token_from("".join(chars[:22]))


def secret_body(
    token_id: str,
    token_secret: str,
    expires_at: float,
    *,
    namespace: str,
    description: str,
    labels: dict[str, str] | None = None,
) -> dict[str, object]:
    """A ``bootstrap.kubernetes.io/token`` Secret as kubeadm creates one: both
    :data:`USAGES`, kubeadm's node group, an expiration."""
    data = {
        "token-id": token_id,
        "token-secret": token_secret,
        "expiration": rfc3339(expires_at),
        "auth-extra-groups": EXTRA_GROUPS,
        "description": description,
    }
    for usage in USAGES:
        data[usage] = "true"
    metadata: dict[str, object] = {"name": secret_name(token_id), "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE,
        "metadata": metadata,
        "stringData": data,
    }


def rearm_status(*, by: str, at: float, reason: str) -> dict[str, object]:
    """The Machine ``status`` merge patch that re-arms it: its next boot gets a new token.

    Written by the lifecycle controller (reimage) and by admins (``gpufleet
    machines rearm``); the token of the previous boot is deleted by whoever re-arms.
    """
    return {
        "armed": True,
        "armedBy": by,
        "armedAt": rfc3339(at),
        "phase": "Armed",
        "message": reason[:300],
    }
