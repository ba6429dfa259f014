"""The Kubernetes side of the local cluster: etcd, control plane, KWOK GPU nodes.

A real control plane without kubelets: etcd, kube-apiserver (envtest-style
flags, static token auth, RBAC), kube-scheduler (so Pods bind) and
kube-controller-manager (Deployments, Jobs, garbage collection, taint-based
evictions, the default ServiceAccount), plus the KWOK controller, which plays
kubelet for fake nodes: it keeps their leases fresh and moves bound Pods to
Running. Everything binds to 127.0.0.1 on ports chosen at start.

Start-up reaches the apiserver through :class:`gpufleet.kubeapi.sync.SyncKube`
(bearer token and the cluster's own CA; no kubeconfig needed before the
apiserver has written its certificate): its ``/readyz``, the Namespaces and the
default ServiceAccount the other components need, creating the KWOK Nodes and
waiting for them to be Ready. Only the probes of processes that are not the
apiserver (etcd's plain-HTTP ``/health``, the scheduler's and the
controller-manager's self-signed ``/healthz``) use httpx directly.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpufleet.domain import well_known
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import pki as pki_mod
from gpufleet.local import vm
from gpufleet.local.binaries import Binaries
from gpufleet.local.processes import ComponentError, ManagedProcess

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
GPU_RESOURCE = "nvidia.com/gpu"
SERVICE_SUBNET = "10.0.0.0/24"
POD_SUBNET = "10.128.0.0/9"
"""Pods of real machines: each Node gets a /24 of it (the controller-manager's node IPAM,
only in a cluster machines join), room for 32,768 nodes; apart from the service range,
qemu's 10.0.2.0/24 and KWOK's fake pod addresses (10.0.0.0/16)."""
NODE_POD_MASK = 24
DRA_FEATURE_GATES = "--feature-gates=DRADeviceTaintRules=true"
"""DRA device taints (decision 0237): on Kubernetes 1.36 ``DRADeviceTaints`` (taints in
ResourceSlices, the scheduler's check, the controller-manager's eviction) is beta and on,
but ``DRADeviceTaintRules`` (the DeviceTaintRule API a quarantine is written with) is beta
and off. The apiserver, the scheduler and the controller-manager each need it."""
DRA_RUNTIME_CONFIG = "--runtime-config=resource.k8s.io/v1beta2/devicetaintrules=true"
"""DeviceTaintRule is served as ``resource.k8s.io/v1beta2`` only, off by default; only that
resource of the group version is turned on (the rest of DRA is served as v1)."""


@dataclass(frozen=True)
class NodeShape:
    """What every fake GPU node looks like; labels follow NVIDIA GPU feature discovery."""

    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    cpus: int = 64
    memory_gib: int = 512
    nodes_per_leaf: int = 4
    leaves_per_spine: int = 4
    kubelet_version: str = "v0.0.0-kwok"
    """Reported as the node's kubelet version; set to the control plane's version."""
    nvl72_domains: int = 0
    """The first ``nvl72_domains * trays_per_domain`` nodes are trays of simulated GB200
    NVL72 NVLink domains (:func:`nvl72_labels`); 0: none."""
    trays_per_domain: int = 4
    """Trays of each simulated NVLink domain (a real NVL72 has 18)."""


NVL72_UUID = "0b72c000-0000-4000-8000-{:012x}"
"""The simulated NVLink domains' cluster UUIDs (domain ``d``: ``d + 1``)."""
TOPOGRAPH_ACCELERATOR = "network.topology.nvidia.com/accelerator"
"""The label Topograph names a node's NVLink domain with (the per-domain budget's default)."""


def nvl72_labels(index: int, shape: NodeShape) -> dict[str, str]:
    """The labels of the ``index``-th node as a tray of a simulated NVL72 ({} for a node past
    the trays): what the agent publishes from its GPUs' fabric registration (the cluster
    UUID, the clique ``<uuid>.<clique id>``, decision 0093; health.fabric) and Topograph's
    label naming the same domain, so every reader places the tray in one NVLink domain."""
    if index >= shape.nvl72_domains * shape.trays_per_domain:
        return {}
    uuid = NVL72_UUID.format(index // shape.trays_per_domain + 1)
    return {
        well_known.LABEL_NVLINK_CLUSTER: uuid,
        well_known.LABEL_NVLINK_CLIQUE: f"{uuid}.1",
        TOPOGRAPH_ACCELERATOR: uuid,
    }


def node_manifest(name: str, index: int, shape: NodeShape) -> dict[str, Any]:
    """A KWOK-managed Node with GPU capacity and InfiniBand topology labels.

    Topology: ``nodes_per_leaf`` nodes share a leaf switch and
    ``leaves_per_spine`` leaves share a spine, using the
    ``network.topology.kubernetes.io/*`` keys topology-aware schedulers read.
    """
    leaf = index // shape.nodes_per_leaf
    spine = leaf // shape.leaves_per_spine
    resources = {
        "cpu": str(shape.cpus),
        "memory": f"{shape.memory_gib}Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(shape.gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                # What the node controller would add (one patch per Node at start-up).
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": shape.gpu_product,
                "nvidia.com/gpu.count": str(shape.gpus),
                "nvidia.com/gpu.memory": str(shape.gpu_memory_mib),
                "network.topology.kubernetes.io/spine": f"ib-spine-{spine:02d}",
                "network.topology.kubernetes.io/block": f"ib-leaf-{leaf:03d}",
                "feature.node.kubernetes.io/rdma.available": "true",
                **nvl72_labels(index, shape),
            },
        },
        # Registered not ready, as a kubelet registers (else the node controller adds the
        # taint in one patch per Node before it removes it in another).
        "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": shape.kubelet_version,
            },
        },
    }


@dataclass(frozen=True)
class KubeLayout:
    """Files and ports of one control plane under ``<run>/kube``."""

    root: Path
    logs: Path
    etcd_client_port: int
    etcd_peer_port: int
    apiserver_port: int
    scheduler_port: int
    controller_manager_port: int
    token: str
    joinable: bool = False
    """Ready for real ``kubeadm join`` (:mod:`gpufleet.local.joining`): the cluster's own
    CA (:mod:`gpufleet.local.pki`) serves the apiserver, signs kubelet certificates and
    is trusted for client certificates. Off: the apiserver's self-signed certificate."""
    fake_nodes: int = 0
    """KWOK nodes the cluster starts with: their lease duration grows with their number."""

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def cluster_pki(self) -> pki_mod.ClusterPki:
        return pki_mod.ClusterPki(self.pki / "cluster")

    @property
    def ca_file(self) -> Path:
        """The CA bundle that verifies the apiserver: the cluster CA when joinable, else
        the apiserver's self-signed serving cert followed by its CA."""
        if self.joinable:
            return self.cluster_pki.ca_cert
        return self.pki / "apiserver.crt"

    @property
    def sa_key(self) -> Path:
        return self.pki / "sa.key"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


def render_kubeconfig(layout: KubeLayout) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpufleet-local",
                "cluster": {
                    "server": layout.apiserver_url,
                    "certificate-authority": str(layout.ca_file),
                },
            }
        ],
        "users": [{"name": "admin", "user": {"token": layout.token}}],
        "contexts": [
            {
                "name": "gpufleet-local",
                "context": {"cluster": "gpufleet-local", "user": "admin", "namespace": "default"},
            }
        ],
        "current-context": "gpufleet-local",
    }
    return yaml.safe_dump(config, sort_keys=False)


def prepare(layout: KubeLayout) -> None:
    """Token file, service-account signing key and kubeconfig."""
    layout.pki.mkdir(parents=True, exist_ok=True)
    layout.pki.chmod(0o700)
    layout.logs.mkdir(parents=True, exist_ok=True)
    tokens = layout.root / "tokens.csv"
    tokens.write_text(f'{layout.token},admin,admin,"system:masters"\n')
    tokens.chmod(0o600)
    if not layout.sa_key.exists():
        # ECDSA: instant to generate, and the apiserver signs tokens with ES256.
        subprocess.run(
            [
                "openssl",
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                str(layout.sa_key),
            ],
            check=True,
            capture_output=True,
        )
    if layout.joinable:
        pki_mod.create(
            layout.cluster_pki,
            ips=["127.0.0.1", *pki_mod.GUEST_ADDRESSES, "10.0.0.1"],
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        )
    layout.kubeconfig.write_text(render_kubeconfig(layout))
    layout.kubeconfig.chmod(0o600)


def etcd(layout: KubeLayout, bins: Binaries) -> ManagedProcess:
    peer = f"http://127.0.0.1:{layout.etcd_peer_port}"
    return ManagedProcess(
        "etcd",
        [
            bins.etcd,
            "--name=gpufleet",
            f"--data-dir={layout.root / 'etcd'}",
            f"--listen-client-urls={layout.etcd_url}",
            f"--advertise-client-urls={layout.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=gpufleet={peer}",
            # Throwaway data: no fsync, and room for thousands of fake nodes.
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=8589934592",
            "--auto-compaction-retention=1",
            "--log-level=warn",
        ],
        layout.log("etcd"),
    )


def _advertise_address(layout: KubeLayout) -> str:
    """The address in the ``kubernetes`` Service's endpoints: what pods dial for the API.

    Pods run only on machines, which reach the apiserver at the forwarded
    :data:`~gpufleet.local.vm.CLUSTER_ADDRESS`; the apiserver listens on 127.0.0.1
    only either way. Without machines, 127.0.0.1 (the apiserver looks for a default
    route otherwise, and aborts offline).
    """
    return vm.CLUSTER_ADDRESS if layout.joinable else "127.0.0.1"


def _joinable_apiserver_flags(layout: KubeLayout) -> list[str]:
    if not layout.joinable:
        return []
    p = layout.cluster_pki
    return [
        f"--tls-cert-file={p.serving_cert}",
        f"--tls-private-key-file={p.serving_key}",
        # Kubelets authenticate with the certificates the controller-manager signs.
        f"--client-ca-file={p.ca_cert}",
    ]


def apiserver(layout: KubeLayout, bins: Binaries) -> ManagedProcess:
    return ManagedProcess(
        "kube-apiserver",
        [
            bins.kube_apiserver,
            f"--etcd-servers={layout.etcd_url}",
            "--bind-address=127.0.0.1",
            f"--advertise-address={_advertise_address(layout)}",
            f"--secure-port={layout.apiserver_port}",
            f"--cert-dir={layout.pki}",
            f"--service-cluster-ip-range={SERVICE_SUBNET}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={layout.sa_key}",
            f"--service-account-signing-key-file={layout.sa_key}",
            "--authorization-mode=Node,RBAC",
            f"--token-auth-file={layout.root / 'tokens.csv'}",
            # Real bootstrap tokens (kube-system Secrets) for Day-0 provisioning.
            "--enable-bootstrap-token-auth=true",
            "--allow-privileged=true",
            # One client and no tenants: skip flow control, as kwokctl does.
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            "--profiling=false",
            DRA_FEATURE_GATES,
            DRA_RUNTIME_CONFIG,
            *_joinable_apiserver_flags(layout),
        ],
        layout.log("kube-apiserver"),
    )


def _delegated_auth(layout: KubeLayout, port: int, component: str) -> list[str]:
    return [
        f"--kubeconfig={layout.kubeconfig}",
        f"--authentication-kubeconfig={layout.kubeconfig}",
        f"--authorization-kubeconfig={layout.kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={layout.pki / component}",
    ]


def scheduler(layout: KubeLayout, bins: Binaries) -> ManagedProcess:
    return ManagedProcess(
        "kube-scheduler",
        [
            bins.kube_scheduler,
            *_delegated_auth(layout, layout.scheduler_port, "kube-scheduler"),
            DRA_FEATURE_GATES,
        ],
        layout.log("kube-scheduler"),
    )


def _joinable_controller_flags(layout: KubeLayout) -> tuple[list[str], str]:
    """Signing kubelet CSRs with the cluster CA, the bootstrap signer (it signs
    ``kube-public/cluster-info`` with each bootstrap token, which ``kubeadm join``
    verifies before it trusts the CA), and a pod subnet per Node (a machine's CNI
    configuration is written from it: decision 0123)."""
    if not layout.joinable:
        return [], ""
    p = layout.cluster_pki
    return [
        f"--cluster-signing-cert-file={p.ca_cert}",
        f"--cluster-signing-key-file={p.ca_key}",
        # A machine that was power-cycled must read NotReady before it boots again:
        # kubeadm join refuses a name whose Node is still Ready. A boot under emulation
        # takes minutes, so a minute of grace is soon enough, and a kubelet on a loaded
        # emulated machine (its status every 10 s) is not read NotReady for a late update
        # (with 20 s the system machine flapped under the chart's start-up).
        "--node-monitor-grace-period=60s",
        "--allocate-node-cidrs=true",
        f"--cluster-cidr={POD_SUBNET}",
        f"--node-cidr-mask-size={NODE_POD_MASK}",
    ], "bootstrapsigner,"


def controller_manager(layout: KubeLayout, bins: Binaries) -> ManagedProcess:
    signing, extra = _joinable_controller_flags(layout)
    return ManagedProcess(
        "kube-controller-manager",
        [
            bins.kube_controller_manager,
            *_delegated_auth(layout, layout.controller_manager_port, "kube-controller-manager"),
            f"--service-account-private-key-file={layout.sa_key}",
            f"--root-ca-file={layout.ca_file}",
            "--use-service-account-credentials=false",
            DRA_FEATURE_GATES,
            *signing,
            *_node_monitor_flags(layout),
            # No cloud; the token cleaner deletes expired bootstrap tokens (off by default).
            # No TTL controller: it rewrites an annotation on every Node each time the
            # cluster's size crosses 100, 500, 1,000 and 2,000 nodes, minutes of churn
            # at start-up (the kubelet's cache TTL falls back to its default).
            f"--controllers=*,tokencleaner,{extra}-cloud-node-lifecycle-controller,"
            "-service-lb-controller,-node-route-controller,-ttl",
            # The one sweep left at start-up (each Node's not-ready taint removed once
            # Ready) takes 12,500 / 100 s, not 12,500 / 20 s.
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ],
        layout.log("kube-controller-manager"),
    )


LEASE_RENEWALS_PER_S = 50
"""What KWOK's lease renewals may cost the apiserver and etcd on a small machine."""
MIN_LEASE_S = 40
"""The kubelet's own lease duration; also every joinable cluster's."""


def node_lease_seconds(layout: KubeLayout) -> int:
    """The fake nodes' lease duration: the kubelet's 40 s up to 500 nodes, longer beyond.

    KWOK renews each lease every quarter of its duration, as the kubelet does: 12,500
    nodes at 40 s would be 1,250 writes a second, more than the apiserver and etcd on 2
    cores take (the cluster never got all its nodes Ready). A cluster machines join
    keeps 40 s: a power-cycled machine rejoins only once its Node reads NotReady.
    """
    if layout.joinable:
        return MIN_LEASE_S
    return max(MIN_LEASE_S, math.ceil(4 * layout.fake_nodes / LEASE_RENEWALS_PER_S))


def _node_monitor_flags(layout: KubeLayout) -> list[str]:
    """The controller-manager's grace for a silent node: the lease's duration plus 10 s,
    the kubelet's own ratio (40 s leases renewed every 10 s, 50 s of grace). A quarter of
    the lease plus 40 s was too thin: with 12,500 nodes on a loaded machine KWOK renewed
    late and thousands of nodes flapped NotReady."""
    lease = node_lease_seconds(layout)  # a joinable cluster's is MIN_LEASE_S
    if lease == MIN_LEASE_S:
        return []
    return [f"--node-monitor-grace-period={lease + 10}s"]


def kwok(layout: KubeLayout, bins: Binaries) -> ManagedProcess:
    return ManagedProcess(
        "kwok",
        [
            bins.kwok,
            f"--kubeconfig={layout.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--manage-nodes-with-label-selector=",
            "--manage-single-node=",
            # Room for 65k pod IPs (the default /24 runs out at 254).
            "--cidr=10.0.0.1/16",
            "--node-ip=127.0.0.1",
            f"--node-lease-duration-seconds={node_lease_seconds(layout)}",
            # v0.8.0 ships no built-in stages; these are its node/pod "fast" sets.
            f"--config={KWOK_STAGES}",
        ],
        layout.log("kwok"),
    )


def client(layout: KubeLayout) -> SyncKube:
    """The start-up client of this control plane (the admin token, the apiserver's CA)."""
    return SyncKube(layout.apiserver_url, layout.token, layout.ca_file)


def etcd_ok(layout: KubeLayout) -> bool:
    resp = httpx.get(f"{layout.etcd_url}/health", timeout=2)
    return resp.status_code == 200 and resp.json().get("health") == "true"


def apiserver_ok(layout: KubeLayout, api: SyncKube) -> bool:
    """``/readyz`` passes and the namespaces a cluster always has exist."""
    if not layout.ca_file.exists():
        return False
    if api.status("/readyz") != 200:
        return False
    return all(api.exists(f"/api/v1/namespaces/{ns}") for ns in ("default", "kube-system"))


def healthz_ok(port: int) -> bool:
    """kube-scheduler / kube-controller-manager ``/healthz`` (open to anyone by default)."""
    resp = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2)
    return resp.status_code == 200


def default_service_account_ok(api: SyncKube) -> bool:
    """The controller-manager has created ``default/default``; Pods need it to be admitted."""
    return api.exists("/api/v1/namespaces/default/serviceaccounts/default")


def server_version(api: SyncKube) -> str:
    """The apiserver's gitVersion, e.g. ``v1.36.3``."""
    return str(api.get("/version")["gitVersion"])


def create_nodes(api: SyncKube, names: Sequence[str], shape: NodeShape) -> None:
    """Create the KWOK Nodes; one that exists already (a restarted start-up) is kept."""
    for i, name in enumerate(names):
        api.create("/api/v1/nodes", node_manifest(name, i, shape))


def ready_nodes(api: SyncKube, names: Sequence[str]) -> set[str]:
    listed = api.get(
        "/api/v1/nodes",
        params={"labelSelector": "type=kwok", "limit": str(max(len(names), 1) * 2)},
    )
    ready: set[str] = set()
    for item in listed.get("items", []):
        for cond in item.get("status", {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready.add(item["metadata"]["name"])
    return ready & set(names)


def wait_nodes_ready(
    api: SyncKube, proc: ManagedProcess, names: Sequence[str], timeout: float
) -> None:
    """Wait until KWOK reports every node Ready; name the missing ones."""
    deadline = time.monotonic() + timeout
    ready: set[str] = set()
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise ComponentError(
                proc.name, proc.log, f"exited with code {code} before the nodes were Ready"
            )
        ready = ready_nodes(api, names)
        if len(ready) == len(names):
            return
        time.sleep(0.1)
    missing = sorted(set(names) - ready)
    raise ComponentError(
        proc.name, proc.log, f"nodes not Ready after {timeout:.0f} s: {', '.join(missing[:10])}"
    )
