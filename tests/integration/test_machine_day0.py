"""Day 0 on a real machine: a qemu VM of the local cluster network-boots the node image
through ``gpufleet provision``, joins with its single-use token (real kubeadm, real
kubelet TLS bootstrap), runs the agent on simulated GPUs, passes burn-in and reaches
production; the used token is refused. The reimage after an XID 79 (re-armed, one-time
PXE, power cycle of the VM, a new token, a network boot with a fresh root, production
again) is test_chart_on_machines's, where every component runs in a pod: one reimage
under software emulation is minutes, and the decision and BMC code are the same.

Bounded waits only; the durations are measured by bench/machine_boot.py, not asserted.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from controller_harness import (
    GV,
    Api,
    issue_join_token,
    policy_spec,
    put_policy,
    running,
    self_subject_review,
)
from waiting import wait_for

from gpufleet.domain import well_known
from gpufleet.local import kube, node_image, processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.provision.render import ca_hash_of_file

pytestmark = [pytest.mark.integration, pytest.mark.machines, pytest.mark.timeout(1200)]

MACHINE = "vm-node-0000"
POLICY = "machines"
NETCHECK_IMAGE = node_image.NETCHECK_REFERENCE
"""Imported into containerd at boot from the node image, beside the pause image."""
BOOT_TIMEOUT = 900.0
"""Power-on to production under software emulation on 2 shared cores: about 4-5 minutes
idle, twice that under a load average of 8 (docs/provisioning.md); generous, because a
slow run must not fail, only a broken one."""


class TokenWatch:
    """Every join token issued to a machine, read from its Secret before the controller
    deletes it (the test is cluster admin; a node never sees another's token)."""

    def __init__(self, info: ClusterInfo, machine: str) -> None:
        self.api = Api(info)  # its own connection: an httpx client is not shared by threads
        self.machine = machine
        self.tokens: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TokenWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        selector = f"{well_known.LABEL_MACHINE}%3D{self.machine}"
        while not self._stop.wait(0.2):
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                items = self.api.get(
                    f"/api/v1/namespaces/kube-system/secrets?labelSelector={selector}"
                )["items"]
                for item in items:
                    data = {k: base64.b64decode(v).decode() for k, v in item["data"].items()}
                    token = f"{data['token-id']}.{data['token-secret']}"
                    if token not in self.tokens:
                        self.tokens.append(token)


@pytest.fixture(scope="module")
def day0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterInfo, Api, TokenWatch]]:
    spec = ClusterSpec(nodes=1, slurm=False, machines=1, machine_power_on=False)
    logs = tmp_path_factory.mktemp("machine-day0")
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        api = Api(info)
        put_policy(api, POLICY, machine_policy())
        with TokenWatch(info, MACHINE) as tokens, running(info, logs, policy=POLICY):
            power(info, "On")
            try:
                yield info, api, tokens
            finally:
                console = Path(info.machines[MACHINE].console_log)
                if console.exists():  # where a failure shows first
                    print(console.read_text(errors="replace")[-6000:])


def machine_policy() -> dict[str, Any]:
    """The test policy for machines: after a reimage the machine boots again before it can
    be verified (minutes under software emulation, not the two minutes the KWOK tests
    allow), and XID 79 reimages (a stateless machine: a reboot is a reimage)."""
    policy = policy_spec()
    policy["checks"]["verificationTimeoutSeconds"] = int(BOOT_TIMEOUT)
    for entry in policy["ladder"]:
        entry["timeoutSeconds"] = int(BOOT_TIMEOUT)
    for rule in policy["rules"]:
        if rule["match"].get("xid") == 79:
            rule["action"] = "reimage"
    return policy


def power(info: ClusterInfo, reset_type: str) -> None:
    bmc = info.bmcs[MACHINE]
    r = httpx.post(
        f"{bmc.system_url}/Actions/ComputerSystem.Reset",
        json={"ResetType": reset_type},
        auth=(bmc.user, bmc.password),
        timeout=10,
    )
    assert r.status_code == 204, r.text


def node_ready(api: Api, name: str) -> dict[str, Any] | None:
    r = api.http.get(f"/api/v1/nodes/{name}")
    if r.status_code != 200:
        return None
    node: dict[str, Any] = r.json()
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions") or []
    )
    return node if ready else None


def state(api: Api, name: str) -> str | None:
    """The Node's lifecycle state; None while there is no Node (a machine still booting)."""
    r = api.http.get(f"/api/v1/nodes/{name}")
    if r.status_code != 200:
        return None
    value = (r.json()["metadata"].get("labels") or {}).get(well_known.LABEL_STATE)
    return str(value) if value else None


def signed_for(api: Api, token_id: str) -> bool:
    """Whether cluster-info still carries the JWS for this token (kubeadm join's discovery
    needs it: without it the join stops before it trusts the cluster)."""
    data = api.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")["data"]
    return f"jws-kubeconfig-{token_id}" in data


def kubeadm_discovery(info: ClusterInfo, token: str) -> subprocess.CompletedProcess[str]:
    """``kubeadm join phase preflight`` on this host with ``token``: its checks (their errors
    ignored: this host is no node) and the token discovery of the cluster, which trusts the
    apiserver only if cluster-info carries the token's signature. Only the discovery talks
    to the cluster, at 127.0.0.1; a refused token ends it after the discovery timeout."""
    config = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "JoinConfiguration",
        "discovery": {
            "bootstrapToken": {
                "apiServerEndpoint": info.apiserver_url.removeprefix("https://"),
                "token": token,
                "caCertHashes": [ca_hash_of_file(Path(info.ca_file))],
            }
        },
        "timeouts": {"discovery": "10s"},
        # A name the host resolves itself: kubeadm's hostname check asks no DNS server.
        "nodeRegistration": {"name": "localhost"},
    }
    assert info.bin_dir is not None
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(config, f)
        f.flush()
        return subprocess.run(
            [
                *(str(info.bin_dir / "kubeadm"), "join", "phase", "preflight"),
                *("--config", f.name, "--ignore-preflight-errors=all"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )


def create_pod(api: Api, name: str, node: str, args: list[str], **spec: Any) -> None:
    """A pod of the node image's netcheck image on ``node`` (nothing is pulled: no registry
    is reachable from a machine)."""
    api.post(
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "netcheck",
                        "image": NETCHECK_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": args,
                    }
                ],
                **spec,
            },
        },
    )


def serve_behind_a_service(api: Api, name: str, node: str, **spec: Any) -> None:
    """A netcheck server pod ``name`` on ``node`` answering on 8080, and a Service ``name``
    (port 80) in front of it."""
    create_pod(api, name, node, ["serve", ":8080"], **spec)
    api.post(
        "/api/v1/namespaces/default/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )


def pod_phase(api: Api, name: str, *phases: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = api.get(f"/api/v1/namespaces/default/pods/{name}")
    return pod if pod.get("status", {}).get("phase") in phases else None


def check_pod_network(api: Api, node: str) -> tuple[dict[str, Any], str]:
    """A server pod behind a Service and a client pod on ``node``; the client fetches the
    Service's ClusterIP and the API through the ``kubernetes`` Service (kube-proxy's rules,
    the node's own pod subnet, the bridge CNI). Returns the server pod and what the client
    wrote to its termination message."""
    server, client = "netcheck-server", "netcheck-client"
    serve_behind_a_service(api, server, node)
    try:
        running = wait_for(f"pod {server} Running", lambda: pod_phase(api, server, "Running"), 300)
        service_ip = api.get(f"/api/v1/namespaces/default/services/{server}")["spec"]["clusterIP"]
        api_ip = api.get("/api/v1/namespaces/default/services/kubernetes")["spec"]["clusterIP"]
        create_pod(
            api,
            client,
            node,
            ["get", f"http://{service_ip}/", f"https://{api_ip}/livez"],
            restartPolicy="Never",
        )
        done = wait_for(
            f"pod {client} finished", lambda: pod_phase(api, client, "Succeeded", "Failed"), 300
        )
        state = done["status"]["containerStatuses"][0]["state"]["terminated"]
        message = str(state.get("message", ""))
        assert done["status"]["phase"] == "Succeeded", message
        return running, message
    finally:
        for name in (server, client):
            api.delete(f"/api/v1/namespaces/default/pods/{name}?gracePeriodSeconds=0")
        api.delete(f"/api/v1/namespaces/default/services/{server}")


def test_a_machine_network_boots_joins_and_reaches_production(day0: Any) -> None:
    info, api, tokens = day0
    node = wait_for("the machine's Node Ready", lambda: node_ready(api, MACHINE), BOOT_TIMEOUT)
    # A real kubelet registered it (no KWOK), with the inventory's labels.
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
    labels = node["metadata"]["labels"]
    assert labels[well_known.LABEL_MACHINE] == MACHINE
    assert labels[well_known.LABEL_POOL] == "machines"
    wait_for("production", lambda: state(api, MACHINE) == "production", BOOT_TIMEOUT)
    machine = api.get(f"{GV}/machines/{MACHINE}")["status"]
    assert machine["node"] == MACHINE and machine["phase"] == "Joined"
    assert machine["armed"] is False and machine["tokensIssued"] == 1
    # Real pods run on it (the kubelet, containerd, runc, the bridge CNI of the image) with
    # addresses of the node's own pod subnet, and reach Services through its kube-proxy:
    # one backed by a pod of the machine, and the API through `kubernetes`.
    server, answers = check_pod_network(api, MACHINE)
    subnet = ipaddress.ip_network(api.get(f"/api/v1/nodes/{MACHINE}")["spec"]["podCIDR"])
    assert subnet.subnet_of(ipaddress.ip_network(kube.POD_SUBNET))
    assert ipaddress.ip_address(server["status"]["podIP"]) in subnet
    assert " 200 netcheck netcheck-server" in answers, answers
    assert "/livez 200 ok" in answers, answers
    # The boot watchdog followed the boot from its iPXE request to the Ready Node.
    wait_for(
        "the boot recorded as joined",
        lambda: api.get(f"{GV}/machines/{MACHINE}")["status"]["boot"]["outcome"] == "Joined",
        60,
    )

    # The token was used once: its Secret is gone, the apiserver refuses it, and
    # cluster-info no longer carries its signature (a second kubeadm join stops there).
    assert len(tokens.tokens) == 1
    token = tokens.tokens[0]
    token_id = token.split(".")[0]
    wait_for("used token refused", lambda: self_subject_review(info, token).status_code == 401, 60)
    wait_for("its cluster-info signature removed", lambda: not signed_for(api, token_id), 60)
    # What a second `kubeadm join` with it gets: real kubeadm, stopped at discovery.
    refused = kubeadm_discovery(info, token)
    assert refused.returncode != 0
    expected = (
        f'could not find a JWS signature in the cluster-info ConfigMap for token ID "{token_id}"'
    )
    assert expected in refused.stderr, refused.stderr[-2000:]
    # A boot that asks again gets no token (the Machine is disarmed).
    mac = info.machines[MACHINE].mac
    again = httpx.get(
        f"{info.provision_url}/cloud-init/{mac}/user-data",
        headers={"X-Gpufleet-Serial": info.machines[MACHINE].serial},
        timeout=10,
    )
    assert again.status_code == 409


def test_an_expired_token_is_refused_by_real_kubeadm(day0: Any) -> None:
    """A token valid a moment ago (the apiserver authenticates it, cluster-info carries its
    signature) is refused by kubeadm's discovery once it expired: the bootstrap signer drops
    its signature and the token cleaner its Secret. Issued by the provisioning code for a
    Machine of its own (no VM boots: only the token matters). kubeadm runs only with the
    expired token: with a valid one it would go on to the address cluster-info names, the
    machines' side of their network, which the host must not call."""
    info, api, _ = day0
    token = issue_join_token(info, api, "expiry-probe", "aa:00:00:00:0e:01", ttl_s=20)
    token_id = token.split(".")[0]
    wait_for("cluster-info signed for it", lambda: signed_for(api, token_id), 30)
    assert self_subject_review(info, token).status_code == 201
    wait_for("expired: signature removed", lambda: not signed_for(api, token_id), 120)
    assert self_subject_review(info, token).status_code == 401
    refused = kubeadm_discovery(info, token)
    assert refused.returncode != 0
    expected = (
        f'could not find a JWS signature in the cluster-info ConfigMap for token ID "{token_id}"'
    )
    assert expected in refused.stderr, refused.stderr[-2000:]
    api.delete(f"{GV}/machines/expiry-probe")
