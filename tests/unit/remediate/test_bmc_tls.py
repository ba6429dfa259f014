"""TLS to BMCs against the project's BMC emulator serving HTTPS on loopback: verified with
the right CA (the Secret's ca.crt, or the bundle every client is given), refused with a
wrong or no CA, a pinned certificate accepted by its fingerprint alone and refused by any
other; every refusal names the BMC and the Secret key to set, and sends no request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpufleet.local import pki
from gpufleet.local import redfish as emulator
from gpufleet.remediate import bmc_tls, power, redfish
from gpufleet.remediate.bmc_tls import BmcTls
from gpufleet.waits import within

SECRET = "gpufleet-bmc/bmc-n1"


def _pin(cert: Path) -> str:
    der = x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    return bmc_tls.fingerprint(der)


@dataclass
class Bmc:
    state: emulator.BmcState
    url: str
    pki: pki.BmcPki

    @property
    def ca(self) -> str:
        return self.pki.ca_cert.read_text()

    @property
    def pin(self) -> str:
        return _pin(self.pki.cert)


@dataclass
class Bmcs:
    signed: Bmc
    """A certificate for 127.0.0.1 from a CA of its own."""
    self_signed: Bmc
    """A self-signed certificate for 127.0.0.1, as BMCs ship."""
    elsewhere: Bmc
    """A certificate from a CA of its own, for another address (10.9.9.9) only."""
    plain: Bmc
    """HTTP, no TLS."""


@pytest.fixture(scope="module")
def bmcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bmcs]:
    root = tmp_path_factory.mktemp("bmc-pki")
    made = {
        "signed": pki.create_bmc(root / "signed", ips=["127.0.0.1"], dns=["bmc-n1.example"]),
        "self_signed": pki.create_bmc(root / "self", ips=["127.0.0.1"], self_signed=True),
        "elsewhere": pki.create_bmc(root / "elsewhere", ips=["10.9.9.9"]),
        "plain": pki.create_bmc(root / "plain", ips=["127.0.0.1"]),
    }
    entries = []
    for name, files in made.items():
        entry: dict[str, Any] = {"node": "n1", "port": 0, "os_shutdown_seconds": 0.05}
        if name != "plain":
            entry["tls"] = files.emulator_tls()
        entries.append(entry)
    with emulator.serving({"user": "admin", "password": "pw", "bmcs": entries}) as servers:
        found = {}
        for (name, files), server in zip(made.items(), servers, strict=True):
            scheme = "http" if name == "plain" else "https"
            url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
            found[name] = Bmc(server.bmc, url, files)  # type: ignore[attr-defined]
        yield Bmcs(**found)


def creds(bmc: Bmc, **tls: str) -> redfish.BmcCredentials:
    return redfish.BmcCredentials(bmc.url, "admin", "pw", tls=BmcTls(secret=SECRET, **tls))


def read_serial(creds: redfish.BmcCredentials, ca_file: Path | None = None) -> str | None:
    async def go() -> str | None:
        async with redfish.RedfishClient(
            creds,
            name="n1",
            retry_delays=(0.05,),
            timeout_s=5.0,
            default_ca_file=str(ca_file) if ca_file else None,
        ) as client:
            return await client.serial_number()

    return asyncio.run(go())


def refused(creds: redfish.BmcCredentials, bmc: Bmc, ca_file: Path | None = None) -> str:
    """The refusal's message; the BMC received no request."""
    before = bmc.state.requests
    with pytest.raises(redfish.BmcTlsError) as err:
        read_serial(creds, ca_file)
    assert bmc.state.requests == before, "a request was sent after a refusal"
    message = str(err.value)
    assert message.startswith(f"BMC n1 ({bmc.url}): TLS: ") and "nothing sent" in message
    return message


# ----------------------------------------------------------------------------- verified


def test_the_secrets_ca_verifies_the_bmcs_certificate(bmcs: Bmcs) -> None:
    assert read_serial(creds(bmcs.signed, ca_pem=bmcs.signed.ca)) == "SN-n1"


def test_a_self_signed_certificate_is_its_own_ca(bmcs: Bmcs) -> None:
    bmc = bmcs.self_signed
    assert read_serial(creds(bmc, ca_pem=bmc.ca)) == "SN-n1"


def test_the_bundle_every_client_is_given_verifies_a_secret_without_ca(bmcs: Bmcs) -> None:
    assert read_serial(creds(bmcs.signed), ca_file=bmcs.signed.pki.ca_cert) == "SN-n1"


def test_the_secrets_ca_comes_before_the_bundle(bmcs: Bmcs) -> None:
    # The bundle holds the right CA, the Secret a wrong one: the Secret decides.
    right = bmcs.signed.pki.ca_cert
    message = refused(creds(bmcs.signed, ca_pem=bmcs.self_signed.ca), bmcs.signed, right)
    assert f"against the ca.crt of Secret {SECRET}" in message


# ------------------------------------------------------------------------------ refused


def test_no_ca_refuses_and_says_which_key_to_set(bmcs: Bmcs) -> None:
    message = refused(creds(bmcs.self_signed), bmcs.self_signed)
    assert "not verified against the default trusted CAs (self-signed certificate)" in message
    assert f"set the key ca.crt of Secret {SECRET} to the CA certificate (PEM)" in message
    assert "or certSha256" in message and "--bmc-ca-bundle" in message
    assert "bmcCredentials.caBundle" in message


def test_a_wrong_ca_refuses_per_secret_and_chart_wide(bmcs: Bmcs) -> None:
    wrong = bmcs.self_signed
    message = refused(creds(bmcs.signed, ca_pem=wrong.ca), bmcs.signed)
    assert "against the ca.crt of Secret" in message and "unable to get local issuer" in message
    message = refused(creds(bmcs.signed), bmcs.signed, wrong.pki.ca_cert)
    assert f"against the CA bundle {wrong.pki.ca_cert} (--bmc-ca-bundle)" in message
    assert f"set the key ca.crt of Secret {SECRET}" in message


def test_a_certificate_for_another_host_is_refused_with_the_pin_as_a_way_out(bmcs: Bmcs) -> None:
    bmc = bmcs.elsewhere
    message = refused(creds(bmc, ca_pem=bmc.ca), bmc)
    assert "IP address mismatch" in message
    assert f"a host name the certificate carries, or set the key certSha256 of Secret {SECRET}" in (
        message
    )
    assert read_serial(creds(bmc, pin=bmc.pin)) == "SN-n1"


def test_a_refused_certificate_is_not_retried_and_no_reset_is_posted(bmcs: Bmcs) -> None:
    bmc = bmcs.self_signed

    async def go() -> None:
        async with power.RedfishPower(creds(bmc), name="n1", retry_delays=(5.0,)) as client:
            for _ in range(2):  # a second call after the refusal sends nothing either
                with pytest.raises(redfish.BmcTlsError):
                    await client.reset("ForceRestart")

    before = (bmc.state.requests, bmc.state.reset_posts, bmc.state.reset_count)
    asyncio.run(within(4.0, go()))  # a retry would wait 5 s first
    assert (bmc.state.requests, bmc.state.reset_posts, bmc.state.reset_count) == before


# -------------------------------------------------------------------------------- pinned


def test_a_pin_accepts_the_certificate_without_a_ca(bmcs: Bmcs) -> None:
    bmc = bmcs.self_signed
    assert read_serial(creds(bmc, pin=bmc.pin)) == "SN-n1"
    # as openssl prints it, lower case without colons, one of several
    line = f"sha256 Fingerprint={bmc.pin}"
    assert read_serial(creds(bmc, pin=line)) == "SN-n1"
    several = f"{bmcs.signed.pin.replace(':', '').lower()}, {bmc.pin}"
    assert read_serial(creds(bmc, pin=several)) == "SN-n1"


def test_a_wrong_pin_refuses_before_the_first_request(bmcs: Bmcs) -> None:
    bmc = bmcs.self_signed
    message = refused(creds(bmc, pin=bmcs.signed.pin), bmc)
    assert f"the certificate's sha256 fingerprint is {bmc.pin}" in message
    assert f"not the certSha256 of Secret {SECRET} ({bmcs.signed.pin})" in message


def test_with_a_ca_and_a_pin_both_must_hold(bmcs: Bmcs) -> None:
    bmc = bmcs.signed
    assert read_serial(creds(bmc, ca_pem=bmc.ca, pin=bmc.pin)) == "SN-n1"
    assert "certSha256" in refused(creds(bmc, ca_pem=bmc.ca, pin=bmcs.self_signed.pin), bmc)
    assert "ca.crt" in refused(creds(bmc, ca_pem=bmcs.self_signed.ca, pin=bmc.pin), bmc)


def test_the_certificate_is_checked_for_the_name_the_secret_gives(bmcs: Bmcs) -> None:
    # The controller reaches bmc-n1.example at 127.0.0.1 (--bmc-address-map): the
    # certificate must still be valid for bmc-n1.example.
    bmc = bmcs.signed
    port = bmc.url.rsplit(":", 1)[1]
    named = redfish.BmcCredentials(
        f"https://bmc-n1.example:{port}", "admin", "pw", tls=BmcTls(SECRET, ca_pem=bmc.ca)
    )
    redfish.set_address_map({"bmc-n1.example": "127.0.0.1"})
    try:
        assert read_serial(named) == "SN-n1"
    finally:
        redfish.set_address_map({})


# ------------------------------------------------------------------- what a Secret says


def test_skipping_verification_is_asked_per_secret_and_logged(
    bmcs: Bmcs, caplog: pytest.LogCaptureFixture
) -> None:
    bmc = bmcs.self_signed
    with caplog.at_level(logging.WARNING, logger="gpufleet.remediate.redfish"):
        assert read_serial(creds(bmc, insecure="true")) == "SN-n1"
    (record,) = caplog.records
    assert "NOT verified" in record.getMessage() and SECRET in record.getMessage()
    assert "insecureSkipVerify" in refused(creds(bmc, insecure="yes"), bmc)
    message = refused(creds(bmc, insecure="true", pin=bmc.pin), bmc)
    assert "remove insecureSkipVerify" in message


def test_tls_keys_on_an_http_endpoint_are_refused(bmcs: Bmcs) -> None:
    bmc = bmcs.plain
    message = refused(creds(bmc, ca_pem=bmcs.signed.ca), bmc)
    assert "not https://" in message and "ca.crt" in message
    assert read_serial(creds(bmc)) == "SN-n1"  # plain HTTP without TLS keys, as before


def test_keys_that_cannot_be_used_name_the_key(bmcs: Bmcs, tmp_path: Path) -> None:
    bmc = bmcs.signed
    message = refused(creds(bmc, ca_pem="not a certificate"), bmc)
    assert f"the key ca.crt of Secret {SECRET} holds no usable PEM CA certificate" in message
    message = refused(creds(bmc, pin="AB:CD"), bmc)
    assert f"the key certSha256 of Secret {SECRET}: 'AB:CD' is not a sha256" in message
    missing = tmp_path / "absent.crt"
    message = refused(creds(bmc), bmc, missing)
    assert f"the CA bundle {missing} (--bmc-ca-bundle) cannot be used" in message


def test_a_secrets_tls_keys_are_read_with_empty_ones_absent() -> None:
    data = {"endpoint": "https://x", "ca.crt": "PEM", "certSha256": " ", "insecureSkipVerify": ""}
    tls = BmcTls.from_secret(data, "ns/bmc")
    assert (tls.secret, tls.ca_pem, tls.pin, tls.insecure) == ("ns/bmc", "PEM", "", "")
    assert tls.keys() == ("ca.crt",)
    assert BmcTls.from_secret({}, "ns/bmc").keys() == ()


def test_pins_are_read_in_the_forms_tools_print() -> None:
    hexpin = "ab" * 32
    spelled = ":".join(["AB"] * 32)
    assert bmc_tls.parse_pins(spelled) == (hexpin,)
    assert bmc_tls.parse_pins(f"SHA256 Fingerprint={spelled}") == (hexpin,)
    assert bmc_tls.parse_pins(f"sha256:{hexpin}\n{'cd' * 32}") == (hexpin, "cd" * 32)
    for bad in ("", "ab" * 31, "zz" * 32):
        with pytest.raises(ValueError):
            bmc_tls.parse_pins(bad)
