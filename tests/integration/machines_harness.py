"""What the tests on real machines share (test_chart_on_machines.py): the FleetPolicy for
machines, bounded waits on Nodes and pods, pods of the node image's netcheck image, the
join tokens a machine is issued, and real kubeadm's token discovery run on this host.

A machine is a qemu VM of the local cluster that network-boots the node image through
``gpufleet provision`` and joins with its single-use token (real kubeadm, real kubelet
TLS bootstrap); the durations are measured by bench/machine_boot.py, not asserted.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import waiting
import yaml
from controller_harness import Api, policy_spec

from gpufleet.domain import well_known
from gpufleet.local import node_image
from gpufleet.local.cluster import ClusterInfo
from gpufleet.provision.render import ca_hash_of_file

POLICY = "machines"
"""The pool (and FleetPolicy) of the GPU machines."""
NETCHECK_IMAGE = node_image.NETCHECK_REFERENCE
"""Imported into containerd at boot from the node image, beside the pause image."""
BOOT_TIMEOUT = 900.0
"""Power-on to production under software emulation on 2 shared cores: about 4-5 minutes
idle, twice that under a load average of 8 (docs/provisioning.md); generous, because a
slow run must not fail, only a broken one."""


POLL_S = 1.0
"""How often the tests on machines look again. The host's two cores also run the emulated
machines: a poll ten times a second (apiserver, etcd, the test) takes time from them."""


class Consoles:
    """The machines' serial consoles, read as they grow, for a guest kernel panic.

    A machine whose kernel panics reboots, network-boots again and is refused a second join
    token (it is disarmed after one): nothing that waits on it can succeed afterwards. So a
    wait ends at once on a panic, with the panic's lines in its message, instead of running
    out its timeout with a message that says only what did not happen.
    """

    PANIC = "Kernel panic - not syncing"
    OOPS = "Oops: "
    """The line that says what went wrong, some lines before the panic (kept for the message)."""

    def __init__(self, consoles: dict[str, Path]) -> None:
        self.consoles = consoles
        self.offsets = dict.fromkeys(consoles, 0)
        self.panics: list[str] = []
        self.oops: dict[str, str] = {}

    def check(self) -> None:
        """Raise AssertionError naming every panic seen so far (once seen, always)."""
        for name, path in self.consoles.items():
            try:
                with path.open("rb") as f:
                    f.seek(self.offsets[name])
                    new = f.read()
            except OSError:
                continue
            cut = new.rfind(b"\n") + 1  # whole lines only; the rest is read next time
            self.offsets[name] += cut
            for line in new[:cut].decode(errors="replace").splitlines():
                if self.OOPS in line:
                    self.oops[name] = line.strip()[:160]
                elif self.PANIC in line:
                    self.panics.append(f"{name}: {self.oops.get(name, '')} {line.strip()[:120]}")
        if self.panics:
            raise AssertionError("a machine's kernel crashed: " + " | ".join(self.panics[:4]))


_consoles: Consoles | None = None


def watch_consoles(consoles: dict[str, Path] | None) -> None:
    """Make every :func:`wait_for` end at once on a kernel panic on one of ``consoles``
    (None: stop watching)."""
    global _consoles
    _consoles = Consoles(consoles) if consoles else None


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """:func:`waiting.wait_for`, polling every :data:`POLL_S` seconds; a machine's kernel
    panic (:func:`watch_consoles`) ends it at once."""

    def checked() -> Any:
        if _consoles is not None:
            _consoles.check()
        return check()

    return waiting.wait_for(what, checked, timeout, step=POLL_S)


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
        # A token's Secret lives from the arming to the join, minutes under emulation.
        while not self._stop.wait(POLL_S):
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                items = self.api.get(
                    f"/api/v1/namespaces/kube-system/secrets?labelSelector={selector}"
                )["items"]
                for item in items:
                    data = {k: base64.b64decode(v).decode() for k, v in item["data"].items()}
                    token = f"{data['token-id']}.{data['token-secret']}"
                    if token not in self.tokens:
                        self.tokens.append(token)


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


def assert_refused_at_discovery(info: ClusterInfo, token: str) -> None:
    """What a ``kubeadm join`` with a spent or expired token gets: real kubeadm, stopped at
    discovery, naming the token's missing signature."""
    token_id = token.split(".")[0]
    refused = kubeadm_discovery(info, token)
    assert refused.returncode != 0
    expected = (
        f'could not find a JWS signature in the cluster-info ConfigMap for token ID "{token_id}"'
    )
    assert expected in refused.stderr, refused.stderr[-2000:]


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


NETCHECK_GIVES_UP_S = 2 * 30 * 6
"""netcheck get's own bound for two URLs (scripts/node-image/netcheck: 30 tries, 5 s timeout
and 1 s pause each)."""


def pod_story(api: Api, name: str, namespace: str = "default") -> str:
    """A pod's phase, conditions and container states, and the tail of its log where the
    kubelet answers: what a timed-out wait names to say why."""
    try:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except Exception as e:  # the story is for a failure message; never mask the failure
        return f"{name}: not read ({e})"
    status = pod.get("status") or {}
    conditions = [f"{c['type']}={c['status']}" for c in status.get("conditions") or []]
    states = [c.get("state") for c in status.get("containerStatuses") or []]
    try:
        logs = api.http.get(
            f"/api/v1/namespaces/{namespace}/pods/{name}/log", params={"tailLines": 10}, timeout=10
        ).text[-600:]
    except Exception as e:
        logs = f"(log not read: {e})"
    return (
        f"{name} on {pod.get('spec', {}).get('nodeName')}: {status.get('phase')} "
        f"{conditions} {states} podIP={status.get('podIP')} log: {logs!r}"
    )


def pod_phase(api: Api, name: str, *phases: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = api.get(f"/api/v1/namespaces/default/pods/{name}")
    return pod if pod.get("status", {}).get("phase") in phases else None


def assert_reached_by_name(
    api: Api, prefix: str, server_node: str, client_node: str, timeout: float
) -> dict[str, Any]:
    """A netcheck server pod on ``server_node`` behind a Service; a client pod on
    ``client_node`` gets it by the Service's DNS name (CoreDNS, kube-proxy, the pod network
    between the nodes) and the API's ``/livez`` through the ``kubernetes`` Service. Both
    pods and the Service are deleted after; returns the server pod as it ran."""
    server, client = f"{prefix}-server", f"{prefix}-client"
    serve_behind_a_service(api, server, server_node)
    try:
        running: dict[str, Any] = wait_for(
            f"pod {server} Running", lambda: pod_phase(api, server, "Running"), timeout
        )
        api_ip = api.get("/api/v1/namespaces/default/services/kubernetes")["spec"]["clusterIP"]
        create_pod(
            api,
            client,
            client_node,
            ["get", f"http://{server}.default.svc.cluster.local/", f"https://{api_ip}/livez"],
            restartPolicy="Never",
        )
        try:
            # netcheck gives up by itself (30 tries of at most 6 s per URL): wait that out,
            # so a broken path fails with netcheck's own line saying what did not answer.
            done = wait_for(
                f"pod {client} finished",
                lambda: pod_phase(api, client, "Succeeded", "Failed"),
                max(timeout, NETCHECK_GIVES_UP_S + 60),
            )
        except AssertionError as e:
            raise AssertionError(f"{e}; {pod_story(api, client)}; {pod_story(api, server)}") from e
        message = str(done["status"]["containerStatuses"][0]["state"]["terminated"].get("message"))
        assert done["status"]["phase"] == "Succeeded", message
        assert f" 200 netcheck {server}" in message, message
        assert "/livez 200 ok" in message, message
        return running
    finally:
        for name in (server, client):
            api.delete(f"/api/v1/namespaces/default/pods/{name}?gracePeriodSeconds=0")
        api.delete(f"/api/v1/namespaces/default/services/{server}")
