"""Cluster DNS for the local cluster's machines: CoreDNS, as kubeadm installs it.

Every kubelet of a machine already points its pods at :data:`~gpufleet.local.joining.
CLUSTER_DNS` (``kube-system/kubelet-config``); with ``ClusterSpec.images`` the cluster
also runs what answers there: a CoreDNS Deployment in ``kube-system`` (the image built
from ``scripts/images/coredns``: CoreDNS's own ``coremain`` with the plugins a cluster
needs, nothing that reaches out of it) behind the ``kube-dns`` Service at that address.
It answers ``cluster.local`` (Services, StatefulSet pods by hostname and subdomain) and
reverse lookups; there is no upstream to forward other names to. On the machines only:
a KWOK node would report it Running without running it.
"""

from __future__ import annotations

from typing import Any

from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import machines
from gpufleet.local.joining import CLUSTER_DNS

Json = dict[str, Any]
NS = "kube-system"
NAME = "coredns"
PORT = 1053
"""CoreDNS listens above 1024 (no capability needed); the Service maps 53 to it."""
COREFILE = f"""\
.:{PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    loadbalance
}}
"""
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def objects(image: str, pool: str | None = None) -> list[tuple[str, Json]]:
    """(collection path, object) of everything CoreDNS needs, in creation order; on a
    machine of ``pool`` when given (the system machines: on a GPU node CoreDNS would be
    work that burn-in and the checks before a reboot refuse to run beside)."""
    on_machine = machines.service_node_terms(pool)
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": NAME, "namespace": NS, "labels": labels}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "pods", "namespaces"],
             "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["list", "watch"]},
        ],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:coredns"},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}],
    }  # fmt: skip
    container = {
        "name": "coredns",
        "image": image,
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": PORT, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": 8080},
            "periodSeconds": 30,
            "failureThreshold": 5,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": "system-cluster-critical",
                    # On a machine (a real kubelet), never on a KWOK node.
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": on_machine}]
                            }
                        }
                    },
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": NS, "labels": labels},
        "spec": {
            "clusterIP": CLUSTER_DNS,
            "selector": labels,
            "ports": [
                {"name": "dns", "port": 53, "targetPort": PORT, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "targetPort": PORT, "protocol": "TCP"},
            ],
        },
    }
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": NAME, "namespace": NS},
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"Corefile": COREFILE},
    }
    return [
        (f"/api/v1/namespaces/{NS}/serviceaccounts", account),
        (f"{RBAC}/clusterroles", role),
        (f"{RBAC}/clusterrolebindings", binding),
        (f"/api/v1/namespaces/{NS}/configmaps", config),
        (f"/apis/apps/v1/namespaces/{NS}/deployments", deployment),
        (f"/api/v1/namespaces/{NS}/services", service),
    ]


def install(api: SyncKube, image: str, pool: str | None = None) -> None:
    """Create every object (one that exists already is kept)."""
    for path, body in objects(image, pool):
        api.create(path, body)
