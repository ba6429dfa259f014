"""The local cluster's own certificate authority, for clusters that real machines join.

Without machines the apiserver makes its own self-signed serving certificate
(``--cert-dir``), valid for 127.0.0.1 only, and nobody presents a client
certificate. A machine that runs ``kubeadm join`` needs more:

- a serving certificate valid for the address the machine dials: qemu's user
  networking shows the host's loopback as ``10.0.2.2`` inside the guest;
- a cluster CA whose public-key hash the join pins (``caCertHashes``);
- the same CA signing the kubelets' client certificates (the controller-manager's
  ``csrsigning`` controller) and trusted by the apiserver (``--client-ca-file``).

ECDSA P-256 keys: generated instantly and accepted by every Kubernetes component.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

GUEST_ADDRESSES = ("10.0.2.2", "10.0.2.100")
"""The host as a qemu user-networking guest sees it: its loopback (``10.0.2.2``), and
the address the local machines reach forwarded cluster ports at (``10.0.2.100``,
:data:`gpufleet.local.vm.CLUSTER_ADDRESS`). No packet leaves the host."""

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class ClusterPki:
    """Files of the cluster CA and the apiserver's serving certificate under ``dir``."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver-serving.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver-serving.key"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key."""
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = _key()
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca, ca_key


def issue_serving(
    ca: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey | None,
    common_name: str,
    *,
    ips: list[str],
    dns: list[str],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A TLS server certificate for ``ips`` and ``dns``, signed by ``ca`` (None: by
    itself, as a BMC's factory certificate is)."""
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    key = _key()
    if ca is None or ca_key is None:
        issuer, ca_key = _name(common_name), key
    else:
        issuer = ca.subject
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    serving = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectAlternativeName(names), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return serving, key


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def create(pki: ClusterPki, *, ips: list[str], dns: list[str]) -> None:
    """Write a CA and a serving certificate for ``ips`` and ``dns`` (kept if present:
    a restarted start-up keeps the CA the machines already pinned)."""
    if pki.ca_cert.exists() and pki.serving_cert.exists():
        return
    pki.dir.mkdir(parents=True, exist_ok=True)
    ca, ca_key = new_ca("gpufleet-local-ca")
    serving, key = issue_serving(ca, ca_key, "kube-apiserver", ips=ips, dns=dns)
    _write_key(pki.ca_key, ca_key)
    _write_key(pki.serving_key, key)
    pki.serving_cert.write_bytes(pem(serving))
    pki.ca_cert.write_bytes(pem(ca))


@dataclass(frozen=True)
class BmcPki:
    """A CA and a BMC serving certificate signed by it, as files under ``dir``: what the
    Redfish emulator serves HTTPS with (its ``tls`` entry) and a BMC Secret's ``ca.crt``."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "bmc-ca.crt"

    @property
    def cert(self) -> Path:
        return self.dir / "bmc.crt"

    @property
    def key(self) -> Path:
        return self.dir / "bmc.key"

    def emulator_tls(self) -> dict[str, str]:
        """The emulator's ``tls`` entry for this certificate."""
        return {"cert": str(self.cert), "key": str(self.key)}


def create_bmc(
    dir: Path, *, ips: list[str], dns: tuple[str, ...] = (), self_signed: bool = False
) -> BmcPki:
    """A BMC certificate for ``ips`` and ``dns``: signed by a new CA, or, ``self_signed``,
    its own issuer (as most BMCs ship; then ``ca_cert`` is the certificate itself)."""
    out = BmcPki(dir)
    dir.mkdir(parents=True, exist_ok=True)
    if self_signed:
        cert, key = issue_serving(None, None, "bmc", ips=ips, dns=list(dns))
        ca_pem = pem(cert)
    else:
        ca, ca_key = new_ca("gpufleet-bmc-ca")
        cert, key = issue_serving(ca, ca_key, "bmc", ips=ips, dns=list(dns))
        ca_pem = pem(ca)
    _write_key(out.key, key)
    out.cert.write_bytes(pem(cert))
    out.ca_cert.write_bytes(ca_pem)
    return out
