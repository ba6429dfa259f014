"""The local control plane is ready for a real ``kubeadm join`` (ClusterSpec.joinable).

Checked against the real apiserver and controller-manager, step by step as
kubeadm and the kubelet do it: the serving certificate is valid for the address
machines dial, ``cluster-info`` is readable anonymously and signed by the
bootstrap signer with the token (the JWS kubeadm verifies), the token reads
kubeadm's ConfigMaps and may look up Nodes, a kubelet client CSR made with the
token is approved and signed by the cluster CA, and the signed certificate
authenticates as the node. A deleted token stops working.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from waiting import wait_for

from gpufleet.domain import enrollment
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.local.vm import CLUSTER_ADDRESS

pytestmark = pytest.mark.integration

TOKEN_ID = "abcdef"
TOKEN = f"{TOKEN_ID}.0123456789abcdef"
NODE = "join-check-node"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    with LocalCluster(ClusterSpec(nodes=1, slurm=False, redfish=False, joinable=True)) as info:
        yield info


def admin(info: ClusterInfo) -> httpx.Client:
    return httpx.Client(
        base_url=info.apiserver_url,
        headers={"Authorization": f"Bearer {info.token}"},
        verify=ssl.create_default_context(cafile=str(info.ca_file)),
        timeout=10,
    )


def as_token(info: ClusterInfo, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(
        base_url=info.apiserver_url,
        headers=headers,
        verify=ssl.create_default_context(cafile=str(info.ca_file)),
        timeout=10,
    )


def put_token(info: ClusterInfo) -> None:
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    data = {
        "token-id": TOKEN_ID,
        "token-secret": TOKEN.split(".")[1],
        "expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "auth-extra-groups": enrollment.EXTRA_GROUPS,
        **{usage: "true" for usage in enrollment.USAGES},
    }
    with admin(info) as api:
        r = api.post(
            "/api/v1/namespaces/kube-system/secrets",
            json={
                "apiVersion": "v1",
                "kind": "Secret",
                "type": enrollment.SECRET_TYPE,
                "metadata": {"name": enrollment.secret_name(TOKEN_ID)},
                "stringData": data,
            },
        )
        assert r.status_code in (201, 409), r.text


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_the_serving_certificate_is_valid_for_the_machines_address(cluster: ClusterInfo) -> None:
    port = int(cluster.apiserver_url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    for name in (CLUSTER_ADDRESS, "10.0.2.2", "127.0.0.1"):
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=name) as tls,
        ):
            assert tls.version() is not None
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname="10.0.2.3")


def test_cluster_info_is_public_and_signed_with_the_token(cluster: ClusterInfo) -> None:
    put_token(cluster)
    with as_token(cluster, None) as anonymous:

        def signed() -> dict[str, str] | None:
            r = anonymous.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")
            assert r.status_code == 200, r.text
            data: dict[str, str] = r.json()["data"]
            return data if f"jws-kubeconfig-{TOKEN_ID}" in data else None

        data = wait_for("cluster-info signed for the token", signed, timeout=30)
    assert data is not None
    kubeconfig = yaml.safe_load(data["kubeconfig"])
    port = cluster.apiserver_url.rsplit(":", 1)[1]
    server = kubeconfig["clusters"][0]["cluster"]["server"]
    assert server == f"https://{CLUSTER_ADDRESS}:{port}"
    ca = base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"])
    assert ca == Path(cluster.ca_file).read_bytes()
    # kubeadm's check: a detached JWS (HS256, key = the token secret) over the kubeconfig.
    header, empty, signature = data[f"jws-kubeconfig-{TOKEN_ID}"].split(".")
    assert empty == "" and json.loads(base64.urlsafe_b64decode(header + "==")) == {
        "alg": "HS256",
        "kid": TOKEN_ID,
    }
    signing_input = f"{header}.{_b64url(data['kubeconfig'].encode())}".encode()
    want = hmac.new(TOKEN.split(".")[1].encode(), signing_input, hashlib.sha256).digest()
    assert hmac.compare_digest(_b64url(want), signature)


def test_the_token_reads_what_kubeadm_join_reads(cluster: ClusterInfo) -> None:
    put_token(cluster)
    with as_token(cluster, TOKEN) as token:
        cfg = token.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
        assert cfg.status_code == 200, cfg.text
        cluster_config = yaml.safe_load(cfg.json()["data"]["ClusterConfiguration"])
        assert cluster_config["kind"] == "ClusterConfiguration"
        assert cluster_config["kubernetesVersion"].startswith("v1.")
        kubelet = token.get("/api/v1/namespaces/kube-system/configmaps/kubelet-config")
        assert kubelet.status_code == 200, kubelet.text
        assert yaml.safe_load(kubelet.json()["data"]["kubelet"])["cgroupDriver"] == "systemd"
        # The join looks for a Node of its name (absent: 404, not 403).
        assert token.get(f"/api/v1/nodes/{NODE}").status_code == 404
        # Anything else stays closed.
        assert token.get("/api/v1/namespaces/kube-system/secrets").status_code == 403


def _csr(name: str) -> tuple[bytes, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{name}"),
                ]
            )
        )
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM), key


def test_a_kubelet_csr_made_with_the_token_is_approved_signed_and_authenticates(
    cluster: ClusterInfo, tmp_path: Path
) -> None:
    put_token(cluster)
    pem, key = _csr(NODE)
    csr_name = f"node-csr-{int(time.time() * 1000)}"
    with as_token(cluster, TOKEN) as token:
        r = token.post(
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            json={
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "CertificateSigningRequest",
                "metadata": {"name": csr_name},
                "spec": {
                    "request": base64.b64encode(pem).decode(),
                    "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                    "usages": ["digital signature", "client auth"],
                },
            },
        )
        assert r.status_code == 201, r.text

    with admin(cluster) as api:

        def issued() -> dict[str, Any] | None:
            status = api.get(
                f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr_name}"
            ).json()["status"]
            return status if status.get("certificate") else None

        status = wait_for("CSR approved and signed", issued, timeout=60)
        assert status is not None
        assert any(c["type"] == "Approved" for c in status["conditions"])
        cert_file = tmp_path / "kubelet.crt"
        key_file = tmp_path / "kubelet.key"
        cert_file.write_bytes(base64.b64decode(status["certificate"]))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        api.delete(f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr_name}")
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    context.load_cert_chain(str(cert_file), str(key_file))
    with httpx.Client(base_url=cluster.apiserver_url, verify=context, timeout=10) as node:
        r = node.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert r.status_code == 201, r.text
        user = r.json()["status"]["userInfo"]
        assert user["username"] == f"system:node:{NODE}"
        assert "system:nodes" in user["groups"]


def test_a_deleted_token_no_longer_authenticates(cluster: ClusterInfo) -> None:
    put_token(cluster)
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    with as_token(cluster, TOKEN) as token:
        path = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
        assert token.post(path, json=review).status_code == 201
        with admin(cluster) as api:
            api.delete(f"/api/v1/namespaces/kube-system/secrets/{enrollment.secret_name(TOKEN_ID)}")
        # The apiserver caches a successful token authentication for 10 s.
        wait_for("token refused", lambda: token.post(path, json=review).status_code == 401, 30)
