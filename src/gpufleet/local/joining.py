"""What ``kubeadm join`` reads from a control plane that ``kubeadm init`` did not make.

``kubeadm init`` leaves a handful of objects that a joining node depends on; the
local cluster's control plane is started without kubeadm, so it writes the same
objects itself (decision 0088 says why not ``kubeadm init phase ...``):

- ``kube-public/cluster-info``: a kubeconfig with the apiserver's address *as the
  machines see it* and the CA; the controller-manager's bootstrap signer adds a
  JWS signature per bootstrap token, which the join checks before trusting the CA.
  Anonymous users may read it (the join has no credentials yet).
- ``kube-system/kubeadm-config`` (the ClusterConfiguration) and
  ``kube-system/kubelet-config`` (the KubeletConfiguration the join writes to
  ``/var/lib/kubelet/config.yaml``), readable by bootstrap tokens and nodes.
- The RBAC of kubeadm's bootstrap-token phase: bootstrap tokens may create CSRs
  and have them approved automatically (``nodeclient``), nodes may renew their
  own certificates (``selfnodeclient``), and the join may look up an existing
  Node of its name.
- kube-proxy's permissions (``system:node-proxier``) for the nodes themselves:
  the node image runs kube-proxy with the kubelet's credentials (decision 0123),
  where kubeadm runs it as a DaemonSet with a ServiceAccount of its own.

Names, groups and roles are kubeadm's own, so a cluster made by kubeadm and this
one look the same to a joining node.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.domain import enrollment
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local.kube import POD_SUBNET, SERVICE_SUBNET

Json = dict[str, Any]
BOOTSTRAP_GROUP = enrollment.EXTRA_GROUPS
NODES_GROUP = "system:nodes"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
CLUSTER_NAME = "gpufleet-local"
CLUSTER_DNS = "10.0.0.10"


def cluster_info_kubeconfig(server: str, ca_pem: bytes) -> str:
    """The kubeconfig in ``cluster-info`` (kubeadm's shape: one unnamed cluster)."""
    import base64

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "",
                    "cluster": {
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                        "server": server,
                    },
                }
            ],
            "contexts": [],
            "current-context": "",
            "preferences": {},
            "users": [],
        },
        sort_keys=False,
    )


def cluster_configuration(endpoint: str, version: str) -> str:
    """kubeadm's ClusterConfiguration for this control plane (``kubeadm-config``)."""
    return yaml.safe_dump(
        {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "ClusterConfiguration",
            "clusterName": CLUSTER_NAME,
            "kubernetesVersion": version,
            "controlPlaneEndpoint": endpoint,
            "certificatesDir": "/etc/kubernetes/pki",
            "imageRepository": "registry.k8s.io",
            "networking": {
                "dnsDomain": "cluster.local",
                "serviceSubnet": SERVICE_SUBNET,
                "podSubnet": POD_SUBNET,
            },
        },
        sort_keys=False,
    )


def kubelet_configuration() -> str:
    """The KubeletConfiguration every joining node gets (``kubelet-config``).

    Client certificates signed by the cluster CA, API authentication and
    authorization through the apiserver (as kubeadm sets them), the systemd cgroup
    driver (the node image's containerd uses it too), certificate rotation.
    """
    return yaml.safe_dump(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True, "cacheTTL": "0s"},
                "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "systemd",
            "clusterDNS": [CLUSTER_DNS],
            "clusterDomain": "cluster.local",
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "rotateCertificates": True,
            "staticPodPath": "/etc/kubernetes/manifests",
            # A node of the local cluster has 1-2 GiB and no disk: do not evict
            # for pressure the emulation itself causes.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            # No image garbage collection: a node's images were loaded at boot (pause,
            # netcheck) or pulled from a registry it may no longer reach, and none can be
            # fetched again. The host node's image store is on the host's disk (83 % full
            # here before a run); past the default 85 % the kubelet deleted the netcheck
            # image between two tests and the next pod failed with ErrImageNeverPull.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "failSwapOn": False,
            # containerd's answers, not 2 minutes: an emulated machine starting seven pods
            # took longer to create a container, the kubelet gave up ("context deadline
            # exceeded"), retried, and each retry loaded the machine further (decision 0136).
            # Pulls stay one at a time: side by side, the system machine's took longer.
            "runtimeRequestTimeout": "10m",
        },
        sort_keys=False,
    )


def _configmap(namespace: str, name: str, data: dict[str, str]) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def _role(namespace: str, name: str, resource: str, names: list[str]) -> Json:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": [resource], "resourceNames": names, "verbs": ["get"]}
        ],
    }


def _binding(
    kind: str, name: str, role_kind: str, role: str, subjects: list[Json], ns: str = ""
) -> Json:
    meta: Json = {"name": name}
    if ns:
        meta["namespace"] = ns
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": subjects,
    }


def _group(name: str) -> Json:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name}


def objects(*, server: str, ca_pem: bytes, version: str) -> list[tuple[str, Json]]:
    """``(collection path, object)`` for everything a join reads; ``server`` is the
    apiserver URL as machines reach it, e.g. ``https://10.0.2.2:6443``."""
    endpoint = server.removeprefix("https://")
    joiners = [_group(BOOTSTRAP_GROUP), _group(NODES_GROUP)]
    return [
        (
            "/api/v1/namespaces/kube-public/configmaps",
            _configmap(
                "kube-public",
                "cluster-info",
                {"kubeconfig": cluster_info_kubeconfig(server, ca_pem)},
            ),
        ),
        (
            f"{RBAC}/namespaces/kube-public/roles",
            _role(
                "kube-public",
                "kubeadm:bootstrap-signer-clusterinfo",
                "configmaps",
                ["cluster-info"],
            ),
        ),
        (
            f"{RBAC}/namespaces/kube-public/rolebindings",
            _binding(
                "RoleBinding",
                "kubeadm:bootstrap-signer-clusterinfo",
                "Role",
                "kubeadm:bootstrap-signer-clusterinfo",
                [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": "system:anonymous",
                    }
                ],
                "kube-public",
            ),
        ),
        (
            "/api/v1/namespaces/kube-system/configmaps",
            _configmap(
                "kube-system",
                "kubeadm-config",
                {"ClusterConfiguration": cluster_configuration(endpoint, version)},
            ),
        ),
        (
            f"{RBAC}/namespaces/kube-system/roles",
            _role("kube-system", "kubeadm:nodes-kubeadm-config", "configmaps", ["kubeadm-config"]),
        ),
        (
            f"{RBAC}/namespaces/kube-system/rolebindings",
            _binding(
                "RoleBinding",
                "kubeadm:nodes-kubeadm-config",
                "Role",
                "kubeadm:nodes-kubeadm-config",
                joiners,
                "kube-system",
            ),
        ),
        (
            "/api/v1/namespaces/kube-system/configmaps",
            _configmap("kube-system", "kubelet-config", {"kubelet": kubelet_configuration()}),
        ),
        (
            f"{RBAC}/namespaces/kube-system/roles",
            _role("kube-system", "kubeadm:kubelet-config", "configmaps", ["kubelet-config"]),
        ),
        (
            f"{RBAC}/namespaces/kube-system/rolebindings",
            _binding(
                "RoleBinding",
                "kubeadm:kubelet-config",
                "Role",
                "kubeadm:kubelet-config",
                joiners,
                "kube-system",
            ),
        ),
        (
            f"{RBAC}/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "kubeadm:get-nodes"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
            },
        ),
        (
            f"{RBAC}/clusterrolebindings",
            _binding(
                "ClusterRoleBinding",
                "kubeadm:get-nodes",
                "ClusterRole",
                "kubeadm:get-nodes",
                [_group(BOOTSTRAP_GROUP)],
            ),
        ),
        (
            f"{RBAC}/clusterrolebindings",
            _binding(
                "ClusterRoleBinding",
                "kubeadm:kubelet-bootstrap",
                "ClusterRole",
                "system:node-bootstrapper",
                [_group(BOOTSTRAP_GROUP)],
            ),
        ),
        (
            f"{RBAC}/clusterrolebindings",
            _binding(
                "ClusterRoleBinding",
                "kubeadm:node-autoapprove-bootstrap",
                "ClusterRole",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                [_group(BOOTSTRAP_GROUP)],
            ),
        ),
        (
            f"{RBAC}/clusterrolebindings",
            _binding(
                "ClusterRoleBinding",
                "kubeadm:node-autoapprove-certificate-rotation",
                "ClusterRole",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                [_group(NODES_GROUP)],
            ),
        ),
        (
            f"{RBAC}/clusterrolebindings",
            _binding(
                "ClusterRoleBinding",
                "gpufleet:node-proxier",
                "ClusterRole",
                "system:node-proxier",
                [_group(NODES_GROUP)],
            ),
        ),
        # The machines' agents run as a host service with the kubelet's credentials and
        # judge faults with the FleetPolicy the controller obeys (gpufleet agent
        # --policy-name): nodes may read FleetPolicies, nothing more.
        (
            f"{RBAC}/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "gpufleet:node-agent-policy"},
                "rules": [
                    {
                        "apiGroups": ["gpufleet.io"],
                        "resources": ["fleetpolicies"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            },
        ),
        (
            f"{RBAC}/clusterrolebindings",
            _binding(
                "ClusterRoleBinding",
                "gpufleet:node-agent-policy",
                "ClusterRole",
                "gpufleet:node-agent-policy",
                [_group(NODES_GROUP)],
            ),
        ),
    ]


def install(api: SyncKube, *, server: str, ca_pem: bytes, version: str) -> None:
    """Create every object (one that exists already is kept)."""
    for path, body in objects(server=server, ca_pem=ca_pem, version=version):
        api.create(path, body)
