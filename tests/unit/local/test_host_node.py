"""The host node's plan (:mod:`gpufleet.local.host_node`): the files its overlays start
with, the token it bootstraps with, its cgroups, and the forwarder's listeners in a
network namespace this test makes. Run for real by tests/integration/test_host_node.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from gpufleet.domain import enrollment, well_known
from gpufleet.local import host_node, machines, vm

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def planned(tmp_path: Path) -> host_node.HostNodeConfig:
    return host_node.prepare(
        run_dir=tmp_path,
        files=tmp_path / "files",
        fabric_socket=tmp_path / "fabric",
        apiserver_port=6443,
        ca_pem=CA,
        token="abcdef.0123456789abcdef",
        forward_ports=[6443, 5000, 6443, 7000],
        registry_mirrors=(("gpufleet.local", f"http://{vm.CLUSTER_ADDRESS}:5000"),),
    )


def test_its_fabric_address_is_what_the_machines_derive_from_its_mac() -> None:
    assert machines.fabric_address_of(host_node.FABRIC_MAC) == host_node.ADDRESS
    assert not host_node.FABRIC_MAC.startswith(machines.fabric_mac_of(0)[:-5] + "00:")


def test_the_kubelet_bootstraps_with_its_token_against_the_forwarded_apiserver(
    tmp_path: Path,
) -> None:
    planned(tmp_path)
    conf = tmp_path / "host-node/etc.upper/kubernetes/bootstrap-kubelet.conf"
    body = yaml.safe_load(conf.read_text())
    assert oct(conf.stat().st_mode & 0o777) == "0o600"
    cluster = body["clusters"][0]["cluster"]
    assert cluster["server"] == f"https://{vm.CLUSTER_ADDRESS}:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == CA
    assert body["users"][0]["user"] == {"token": "abcdef.0123456789abcdef"}
    assert (tmp_path / "host-node/etc.upper/kubernetes/pki/ca.crt").read_bytes() == CA


def test_the_kubelet_runs_on_cgroup_v1_without_systemd_under_its_own_root(
    tmp_path: Path,
) -> None:
    config = planned(tmp_path)
    kubelet = yaml.safe_load((tmp_path / "host-node/var.upper/lib/kubelet/config.yaml").read_text())
    assert kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["failCgroupV1"] is False
    assert kubelet["cgroupRoot"] == config.cgroup_root == host_node.cgroup_root_of(tmp_path)
    assert kubelet["staticPodPath"] == ""
    # The rest is the cluster's: what every machine's kubeadm join writes.
    assert kubelet["authentication"]["webhook"]["enabled"] is True
    assert kubelet["clusterDNS"] == ["10.0.0.10"]


def test_containerd_runs_debian_s_runc_with_the_node_image_s_cni(tmp_path: Path) -> None:
    planned(tmp_path)
    toml = (tmp_path / "host-node/etc.upper/containerd/config.toml").read_text()
    assert f'BinaryName = "{host_node.RUNC}"' in toml
    assert "SystemdCgroup = false" in toml
    assert "restrict_oom_score_adj = true" in toml
    assert f'bin_dir = "{tmp_path / "files/usr/lib/cni"}"' in toml
    assert 'sandbox_image = "gpufleet.local/pause:1.0"' in toml
    hosts = tmp_path / "host-node/etc.upper/containerd/certs.d/gpufleet.local/hosts.toml"
    assert f'server = "http://{vm.CLUSTER_ADDRESS}:5000"' in hosts.read_text()


def test_the_plan_is_saved_for_the_runner(tmp_path: Path) -> None:
    config = planned(tmp_path)
    again = host_node.HostNodeConfig.load(tmp_path / "host-node/host-node.json")
    assert again == config
    assert again.forward_ports == [5000, 6443, 7000]
    assert again.labels == {well_known.LABEL_POOL: "system"}
    assert well_known.LABEL_MACHINE not in again.labels
    saved = json.loads((tmp_path / "host-node/host-node.json").read_text())
    assert saved["name"] == "host-node-0000"


def test_its_bootstrap_token_is_a_kubeadm_token_for_the_node_group() -> None:
    now = time.time()
    token, secret = host_node.bootstrap_token_secret(now)
    m = enrollment.TOKEN.match(token)
    assert m is not None
    data = secret["stringData"]
    assert secret["metadata"] == {
        "name": enrollment.secret_name(m.group(1)),
        "namespace": "kube-system",
    }
    assert secret["type"] == enrollment.SECRET_TYPE
    assert (data["token-id"], data["token-secret"]) == (m.group(1), m.group(2))
    assert data["auth-extra-groups"] == enrollment.EXTRA_GROUPS
    expires = enrollment.parse_rfc3339(data["expiration"])
    assert expires is not None and now < expires <= now + host_node.TOKEN_TTL_S + 1
    assert host_node.bootstrap_token_secret(now)[0] != token


def test_each_run_directory_has_its_own_cgroup_root(tmp_path: Path) -> None:
    a, b = host_node.cgroup_root_of(tmp_path / "a"), host_node.cgroup_root_of(tmp_path / "b")
    assert a != b and a == host_node.cgroup_root_of(tmp_path / "a")
    assert re.fullmatch(r"/gpufleet-[0-9a-f]{12}", a)


def test_its_cgroups_are_removed_deepest_first_in_every_hierarchy(tmp_path: Path) -> None:
    root = "/gpufleet-test"
    for hierarchy in ("cpu", "memory", "pids"):
        (tmp_path / hierarchy / "gpufleet-test/kubepods/burstable/pod1/c1").mkdir(parents=True)
    (tmp_path / "memory/other").mkdir()
    assert host_node.remove_cgroups(root, timeout=0, base=tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu", "memory", "pids"]
    assert [p.name for p in (tmp_path / "memory").iterdir()] == ["other"]


def test_a_cgroup_that_cannot_go_is_reported(tmp_path: Path) -> None:
    busy = tmp_path / "memory/gpufleet-test/pod"
    busy.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("1\n")  # a real cgroup with a task refuses rmdir
    left = host_node.remove_cgroups("/gpufleet-test", timeout=0, base=tmp_path)
    assert left == [str(busy), str(tmp_path / "memory/gpufleet-test")]


def test_missing_host_commands_are_named_with_their_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        host_node.shutil, "which", lambda tool: None if tool in ("iptables", "conntrack") else tool
    )
    with pytest.raises(host_node.HostNodeError, match="Debian's conntrack, iptables"):
        host_node.check_host()


def test_the_forwarder_listens_inside_a_network_namespace_and_reaches_the_host() -> None:
    """A namespace made here (unshare, as root like the suite): the listener is in it, not
    on the host, and a connection made inside reaches a server on the host's loopback."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"host got " + conn.recv(100))

    threading.Thread(target=answer, daemon=True).start()
    inside = subprocess.Popen(
        ["unshare", "--net", "sh", "-c",
         f"ip link set lo up && ip addr add {vm.CLUSTER_ADDRESS}/32 dev lo && sleep 60"],
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    try:
        deadline = time.monotonic() + 10  # until unshare has made the namespace
        while os.readlink(f"/proc/{inside.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (listener,) = host_node.listeners_in(
            Path(f"/proc/{inside.pid}/ns/net"), vm.CLUSTER_ADDRESS, [port], timeout=10
        )
        assert listener.getsockname() == (vm.CLUSTER_ADDRESS, port)
        with pytest.raises(OSError):  # not on the host: the address is only inside
            socket.create_connection((vm.CLUSTER_ADDRESS, port), timeout=1)
        forwarding = threading.Thread(
            target=loop.run_until_complete, args=(host_node._forward([listener], stop),)
        )
        forwarding.start()
        client = (
            f"import socket; s = socket.create_connection(('{vm.CLUSTER_ADDRESS}', {port}),"
            " timeout=10); s.sendall(b'ping'); print(s.recv(100).decode())"
        )
        done = subprocess.run(
            ["nsenter", f"--net=/proc/{inside.pid}/ns/net", sys.executable, "-c", client],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.stdout.strip() == "host got ping", done.stderr
        loop.call_soon_threadsafe(stop.set)
        forwarding.join(10)
        assert not forwarding.is_alive()
    finally:
        inside.kill()
        inside.wait()
        server.close()
        loop.close()
