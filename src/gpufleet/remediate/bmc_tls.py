"""TLS to a BMC: the CA its Secret trusts, the certificate it pins, and what a refusal says.

BMCs mostly present self-signed certificates or ones from a site's own CA, which no
public trust store holds: without a CA bundle every request fails with
``CERTIFICATE_VERIFY_FAILED``. A BMC's Secret may therefore name, beside
``endpoint``, ``username`` and ``password`` (docs/decisions/0208):

- ``ca.crt``: the CA certificates (PEM) its certificate is verified against, instead
  of the chart-wide bundle (``--bmc-ca-bundle``) or the system's trusted CAs;
- ``certSha256``: the sha256 fingerprint of its own (leaf) certificate, or several
  separated by commas (a certificate about to be replaced). With a pin and no
  ``ca.crt`` the chain is not verified, the fingerprint decides; with both, both must
  hold. The pin is checked as the handshake ends, before a byte of HTTP (the password
  in the first request's header) is sent (0209);
- ``insecureSkipVerify: "true"``: nothing verified. Asked per Secret only, never
  together with the other two, and logged as a warning at each use (0210).

This module does no I/O beyond reading the CA file it is given; the client
(:mod:`gpufleet.remediate.redfish`) turns a :class:`TlsConfigError` or a refused
certificate into a ``BmcTlsError`` naming the BMC and the Secret key to set.
"""

from __future__ import annotations

import hashlib
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

KEY_CA = "ca.crt"
KEY_PIN = "certSha256"
KEY_INSECURE = "insecureSkipVerify"
CA_FLAG = "--bmc-ca-bundle"
"""The option that names the chart-wide bundle."""
CHART_VALUE = "bmcCredentials.caBundle"
"""The chart's value that mounts that bundle into the controller."""

_HOST_MISMATCH = frozenset({62, 64})
"""OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH."""
_HEX = re.compile(r"^[0-9a-f]{64}$")
_LABEL = re.compile(r"(sha-?256\s*)?fingerprint\s*=", re.IGNORECASE)
"""What ``openssl x509 -noout -fingerprint -sha256`` prints before the fingerprint."""


class TlsConfigError(ValueError):
    """A Secret's TLS keys (or the CA bundle file) cannot be used: nothing is sent."""


class PinMismatch(ssl.SSLCertVerificationError):
    """The BMC's certificate is not the one its Secret pins."""

    def __init__(self, seen: str, pins: tuple[str, ...]) -> None:
        super().__init__(f"certificate fingerprint {seen} is not pinned")
        self.seen = seen
        self.pins = pins


@dataclass(frozen=True, slots=True)
class BmcTls:
    """What a BMC's Secret says about TLS, as written (checked when a client is made)."""

    secret: str = ""
    """The Secret, ``namespace/name``: every refusal names it."""
    ca_pem: str = field(default="", repr=False)
    pin: str = ""
    insecure: str = ""

    @classmethod
    def from_secret(cls, data: Mapping[str, str], ref: str) -> BmcTls:
        """The TLS keys of a decoded Secret ``ref``; an empty value counts as absent."""
        return cls(
            secret=ref,
            ca_pem=str(data.get(KEY_CA) or "").strip(),
            pin=str(data.get(KEY_PIN) or "").strip(),
            insecure=str(data.get(KEY_INSECURE) or "").strip(),
        )

    def keys(self) -> tuple[str, ...]:
        """The TLS keys the Secret sets."""
        given = ((KEY_CA, self.ca_pem), (KEY_PIN, self.pin), (KEY_INSECURE, self.insecure))
        return tuple(key for key, value in given if value)

    def where(self, key: str) -> str:
        return f"the key {key} of Secret {self.secret}" if self.secret else f"the key {key}"

    def skips_verification(self) -> bool:
        return self.insecure.lower() == "true"


def parse_pins(text: str) -> tuple[str, ...]:
    """``AB:CD:..`` or ``abcd..`` fingerprints (commas or blanks between several; an
    ``openssl x509 -fingerprint`` line's ``sha256 Fingerprint=`` prefix allowed) ->
    lowercase hex. ValueError naming the one that is not 64 hex digits."""
    pins: list[str] = []
    text = _LABEL.sub(" ", text)
    for part in filter(None, re.split(r"[,\s]+", text.strip())):
        word = part.lower().removeprefix("sha256:").replace(":", "")
        if not _HEX.match(word):
            raise ValueError(f"{part!r} is not a sha256 fingerprint (64 hex digits, colons too)")
        pins.append(word)
    if not pins:
        raise ValueError("no fingerprint given")
    return tuple(pins)


def fingerprint(der: bytes) -> str:
    """The sha256 fingerprint of a DER certificate as ``openssl x509 -fingerprint`` shows it."""
    return spelled(hashlib.sha256(der).hexdigest())


def spelled(hex_pin: str) -> str:
    return ":".join(hex_pin[i : i + 2] for i in range(0, len(hex_pin), 2)).upper()


def _pinned(pins: tuple[str, ...]) -> type[ssl.SSLObject]:
    """An SSLObject class whose handshake fails unless the peer's certificate is pinned.

    asyncio's and anyio's TLS streams drive ``SSLContext.wrap_bio`` objects, so the check
    runs inside the handshake: httpx reports it as a failed connection and no request
    is written on it."""

    class Pinned(ssl.SSLObject):
        def do_handshake(self) -> None:
            super().do_handshake()
            der = self.getpeercert(binary_form=True)
            seen = hashlib.sha256(der).hexdigest() if der else ""
            if seen not in pins:
                raise PinMismatch(spelled(seen) if seen else "(none)", pins)

    return Pinned


def client_context(
    tls: BmcTls, *, scheme: str, default_ca_file: str | None
) -> ssl.SSLContext | bool:
    """How a client verifies this BMC; ``True``: the default trust (certifi, or
    ``SSL_CERT_FILE``), as before any of this was configured.

    Raises :class:`TlsConfigError` for keys that contradict each other or cannot be
    read, and for TLS keys on an ``http://`` endpoint (they would protect nothing)."""
    keys = tls.keys()
    if scheme != "https":
        if keys:
            raise TlsConfigError(
                f"the endpoint is not https:// but Secret {tls.secret} sets "
                f"{', '.join(keys)}, which would protect nothing: set endpoint to https://"
            )
        return True
    insecure = tls.skips_verification()
    if tls.insecure and not insecure and tls.insecure.lower() != "false":
        raise TlsConfigError(f"{tls.where(KEY_INSECURE)} is {tls.insecure!r}, not true or false")
    if insecure and (tls.ca_pem or tls.pin):
        raise TlsConfigError(
            f"Secret {tls.secret} sets {KEY_INSECURE} together with {KEY_CA} or {KEY_PIN}: "
            f"remove {KEY_INSECURE} (the certificate is then checked)"
        )
    pins: tuple[str, ...] = ()
    if tls.pin:
        try:
            pins = parse_pins(tls.pin)
        except ValueError as exc:
            raise TlsConfigError(f"{tls.where(KEY_PIN)}: {exc}") from None
    if insecure:
        return _unverified()
    if tls.ca_pem:
        try:
            ctx = ssl.create_default_context(cadata=tls.ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise TlsConfigError(
                f"{tls.where(KEY_CA)} holds no usable PEM CA certificate ({exc})"
            ) from None
    elif pins:
        ctx = _unverified()
    elif default_ca_file:
        try:
            ctx = ssl.create_default_context(cafile=default_ca_file)
        except (OSError, ValueError) as exc:
            raise TlsConfigError(
                f"the CA bundle {default_ca_file} ({CA_FLAG}) cannot be used ({exc}): "
                f"fix it, or set {tls.where(KEY_CA)}"
            ) from None
    else:
        return True
    if pins:
        ctx.sslobject_class = _pinned(pins)
    return ctx


def _unverified() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def refused_certificate(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate refusal behind a transport error (httpx -> httpcore -> ssl), if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ssl.SSLCertVerificationError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def explain(err: ssl.SSLCertVerificationError, tls: BmcTls, default_ca_file: str | None) -> str:
    """What a refused certificate means and which key of which Secret to set."""
    if isinstance(err, PinMismatch):
        pinned = ", ".join(spelled(p) for p in err.pins)
        return (
            f"TLS: the certificate's sha256 fingerprint is {err.seen}, not the {KEY_PIN} of "
            f"Secret {tls.secret} ({pinned}); nothing sent. If the BMC's certificate was "
            f"replaced, check the new fingerprint at the BMC and set {KEY_PIN} to it"
        )
    reason = getattr(err, "verify_message", None) or str(err)
    if tls.ca_pem:
        source = f"the {KEY_CA} of Secret {tls.secret}"
    elif default_ca_file:
        source = f"the CA bundle {default_ca_file} ({CA_FLAG})"
    else:
        source = "the default trusted CAs"
    if getattr(err, "verify_code", None) in _HOST_MISMATCH:
        advice = (
            "write the endpoint with a host name the certificate carries, or set "
            f"{tls.where(KEY_PIN)} to the certificate's sha256 fingerprint"
        )
    else:
        advice = (
            f"set {tls.where(KEY_CA)} to the CA certificate (PEM) that signed the BMC's "
            f"certificate, or {KEY_PIN} to the certificate's sha256 fingerprint"
        )
        if not tls.ca_pem and not default_ca_file:
            advice += f", or give the CA to every BMC client ({CA_FLAG}; the chart's {CHART_VALUE})"
    return (
        f"TLS: the certificate was not verified against {source} ({reason}); nothing sent; {advice}"
    )
