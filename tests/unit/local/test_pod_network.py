"""Pods on the local cluster's machines: one pod subnet per Node, kube-proxy's rights,
the ``kubernetes`` Service pointing where machines reach the apiserver (decision 0123),
and the node image's ``pod-network`` script against a real TLS endpoint that asks
for the kubelet's client certificate, with a kubelet kubeconfig of the kubelet's own
shape."""

from __future__ import annotations

import base64
import datetime
import http.server
import importlib.util
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufleet.local import joining, kube, pki, vm
from gpufleet.local.binaries import Binaries

from .conftest import LayoutOf

SCRIPT = Path(__file__).parents[3] / "scripts/node-image/files/usr/lib/gpufleet/pod-network"


def test_a_joinable_cluster_gives_each_node_a_pod_subnet_and_pods_the_machines_address(
    layout_of: LayoutOf, bins: Binaries
) -> None:
    manager = kube.controller_manager(layout_of(joinable=True), bins).argv
    assert "--allocate-node-cidrs=true" in manager
    assert f"--cluster-cidr={kube.POD_SUBNET}" in manager
    assert f"--node-cidr-mask-size={kube.NODE_POD_MASK}" in manager
    apiserver = kube.apiserver(layout_of(joinable=True), bins).argv
    assert f"--advertise-address={vm.CLUSTER_ADDRESS}" in apiserver
    # Without machines nothing changes: no node IPAM for KWOK nodes, loopback endpoints.
    assert not any("cidr" in a for a in kube.controller_manager(layout_of(), bins).argv)
    assert "--advertise-address=127.0.0.1" in kube.apiserver(layout_of(), bins).argv


def test_the_pod_subnet_holds_a_fleet_and_overlaps_nothing_else() -> None:
    pods = ipaddress.ip_network(kube.POD_SUBNET)
    assert 2 ** (kube.NODE_POD_MASK - pods.prefixlen) >= 12_500
    for other in (kube.SERVICE_SUBNET, "10.0.2.0/24", "10.0.0.0/16"):
        assert not pods.overlaps(ipaddress.ip_network(other)), other


def test_the_join_objects_let_nodes_run_kube_proxy_and_name_the_pod_subnet() -> None:
    objects = joining.objects(server="https://10.0.2.100:6443", ca_pem=b"x", version="v1.36.3")
    by_name = {body["metadata"]["name"]: body for _, body in objects}
    proxier = by_name["gpufleet:node-proxier"]
    assert proxier["roleRef"]["name"] == "system:node-proxier"
    assert proxier["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
    ]
    config = by_name["kubeadm-config"]["data"]["ClusterConfiguration"]
    assert f"podSubnet: {kube.POD_SUBNET}" in config


# ------------------------------------------------------- the node image's script


@pytest.fixture
def script() -> ModuleType:
    """The script itself (no .py suffix: it is loaded by path)."""
    loader = SourceFileLoader("pod_network", str(SCRIPT))
    spec = importlib.util.spec_from_loader("pod_network", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _client_cert(ca_dir: pki.ClusterPki, out: Path, node: str) -> None:
    """A kubelet client certificate signed by the cluster CA, as the kubelet keeps it
    (certificate and key in one file: ``kubelet-client-current.pem``)."""
    ca_key = serialization.load_pem_private_key(ca_dir.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(ca_dir.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(ca_key, hashes.SHA256())
    )
    out.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[tuple[str, pki.ClusterPki, list[str]]]:
    """HTTPS on 127.0.0.1 that requires a client certificate of the cluster CA and answers
    ``GET /api/v1/nodes/node-a`` with a pod subnet; the paths asked are recorded."""
    ca = pki.ClusterPki(tmp_path / "pki")
    pki.create(ca, ips=["127.0.0.1"], dns=["localhost"])
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            found = self.path == "/api/v1/nodes/node-a"
            body = json.dumps({"spec": {"podCIDR": "10.128.7.0/24"}} if found else {}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.serving_cert, ca.serving_key)
    context.load_verify_locations(ca.ca_cert)
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca, asked
    finally:
        server.shutdown()
        server.server_close()


def _kubelet_conf(path: Path, server: str, ca: Path, pem: Path) -> None:
    """The kubeconfig the kubelet writes after its TLS bootstrap (its exact layout)."""
    ca_data = base64.b64encode(ca.read_bytes()).decode()
    path.write_text(
        "apiVersion: v1\nclusters:\n- cluster:\n"
        f"    certificate-authority-data: {ca_data}\n    server: {server}\n"
        "  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n"
        "    namespace: default\n    user: default-auth\n  name: default-context\n"
        "current-context: default-context\nkind: Config\npreferences: {}\nusers:\n"
        f"- name: default-auth\n  user:\n    client-certificate: {pem}\n"
        f"    client-key: {pem}\n"
    )


def _as_node(
    script: ModuleType,
    apiserver: tuple[str, pki.ClusterPki, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    node: str,
) -> Path:
    """The script on a node named ``node`` that has joined: its kubelet's client certificate
    and kubeconfig in place. Returns where the CNI configuration goes."""
    url, ca, _ = apiserver
    pem = tmp_path / "kubelet-client-current.pem"
    _client_cert(ca, pem, node)
    _kubelet_conf(tmp_path / "kubelet.conf", url, ca.ca_cert, pem)
    conflist = tmp_path / "net.d" / "10-gpufleet-bridge.conflist"
    monkeypatch.setattr(script, "KUBECONFIG", str(tmp_path / "kubelet.conf"))
    monkeypatch.setattr(script, "CONFLIST", str(conflist))
    monkeypatch.setattr(script.socket, "gethostname", lambda: node)
    return conflist


def test_the_script_writes_the_nodes_own_subnet_with_the_kubelets_credentials(
    script: ModuleType,
    apiserver: tuple[str, pki.ClusterPki, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conflist = _as_node(script, apiserver, tmp_path, monkeypatch, "node-a")
    masqueraded: list[str] = []  # not this host's iptables
    monkeypatch.setattr(script, "apply_masquerade", masqueraded.append)
    assert script.main() == 0
    assert apiserver[2] == ["/api/v1/nodes/node-a"]
    written = json.loads(conflist.read_text())
    bridge = written["plugins"][0]
    # The script masquerades, before the kubelet can start a pod (the file is the signal).
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert masqueraded == ["10.128.7.0/24"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.128.7.0/24"}]]
    assert not conflist.with_name(conflist.name + ".tmp").exists()


def test_the_script_gives_up_after_its_deadline_and_writes_nothing(
    script: ModuleType,
    apiserver: tuple[str, pki.ClusterPki, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conflist = _as_node(script, apiserver, tmp_path, monkeypatch, "node-b")  # no such Node: 404
    monkeypatch.setattr(script, "DEADLINE_S", 0.5)
    monkeypatch.setattr(script, "INTERVAL_S", 0.1)
    assert script.main() == 1
    asked = apiserver[2]
    assert asked and set(asked) == {"/api/v1/nodes/node-b"}
    assert not conflist.exists()
    assert "no pod subnet for node-b" in capsys.readouterr().err


def _node(name: str, subnet: str | None, *addresses: tuple[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {"podCIDR": subnet} if subnet else {},
        "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]},
    }


def test_routes_go_to_other_nodes_pod_subnets_via_their_fabric_address(
    script: ModuleType,
) -> None:
    nodes = [
        _node("vm-node-0000", "10.128.1.0/24", ("InternalIP", "10.1.0.1")),
        _node("vm-node-0001", "10.128.2.0/24", ("InternalIP", "10.1.0.2"), ("Hostname", "x")),
        # Not on the fabric (a machine without a second NIC, a KWOK node): no route.
        _node("vm-node-0002", "10.128.3.0/24", ("InternalIP", "10.0.2.15")),
        _node("gpu-node-0000", None, ("InternalIP", "127.0.0.1")),
        # Its subnet not allocated yet.
        _node("vm-node-0003", None, ("InternalIP", "10.1.0.4")),
    ]
    assert script.wanted_routes(nodes, "vm-node-0000") == {"10.128.2.0/24": "10.1.0.2"}


def test_the_service_ranges_go_out_of_the_fabric_nic_from_its_address(
    script: ModuleType, tmp_path: Path
) -> None:
    """A machine has no default route: a host-network pod reaches a ClusterIP (cluster
    DNS above all) only through this route."""
    cidrs = [
        {"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.0.0.0/24", "fd00::/108"]}},
        {"metadata": {"name": "more"}, "spec": {"cidrs": ["10.0.1.0/24", "nonsense"]}},
        {"metadata": {"name": "empty"}, "spec": {}},
    ]
    ranges = script.service_ranges(cidrs)
    assert ranges == ["10.0.0.0/24", "10.0.1.0/24"]
    marker = tmp_path / "fabric"  # what the fabric unit writes
    marker.write_text("ens3 10.1.0.2\n")
    nic = script.fabric_nic(str(marker))
    assert nic == ("ens3", "10.1.0.2")
    assert script.wanted_service_routes(ranges, nic) == {
        "10.0.0.0/24": ("dev", "ens3", "src", "10.1.0.2"),
        "10.0.1.0/24": ("dev", "ens3", "src", "10.1.0.2"),
    }
    # Without a fabric NIC there is nowhere to send them: no route.
    assert script.fabric_nic(str(tmp_path / "absent")) is None
    assert script.wanted_service_routes(ranges, None) == {}


def test_pod_traffic_is_masqueraded_only_when_it_leaves_the_cluster_network(
    script: ModuleType,
) -> None:
    """Pods keep their address to pods and hosts across the fabric (Slurm calls srun back
    at its request's source address); traffic out of qemu's user network, to the host,
    is masqueraded."""
    chain = script.MASQ_CHAIN
    assert script.masquerade_rules("10.128.2.0/24", "ens3") == [
        ["-A", "POSTROUTING", "-s", "10.128.2.0/24", "-j", chain],
        ["-A", chain, "-o", "cni0", "-j", "RETURN"],
        ["-A", chain, "-o", "ens3", "-j", "RETURN"],
        ["-A", chain, "-d", "224.0.0.0/4", "-j", "RETURN"],
        ["-A", chain, "-j", "MASQUERADE"],
    ]
    # A machine without a fabric: everything that leaves the bridge is masqueraded.
    rules = script.masquerade_rules("10.128.2.0/24", None)
    assert ["-A", chain, "-j", "MASQUERADE"] in rules and len(rules) == 4


def test_the_image_and_the_cluster_derive_the_same_fabric_address(script: ModuleType) -> None:
    from gpufleet.local import machines

    fabric = SourceFileLoader("fabric", str(SCRIPT.with_name("fabric")))
    spec = importlib.util.spec_from_loader("fabric", fabric)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    fabric.exec_module(module)
    for index in (0, 1, 255, 256, 1000):
        mac = machines.fabric_mac_of(index)
        assert mac.startswith(module.PREFIX)
        assert str(module.address_of(mac)) == machines.fabric_address_of(mac)
    assert machines.fabric_address_of(machines.fabric_mac_of(0)) == "10.1.0.1"
    assert str(module.SUBNET) == machines.FABRIC_SUBNET
    # pod-network reads the NIC and address from the file the fabric unit writes.
    assert script.FABRIC_MARKER == module.MARKER
