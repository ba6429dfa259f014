"""The local cluster's DNS: CoreDNS behind the address every machine's kubelet hands its
pods, on a machine, confined, built from the CoreDNS release the image names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpufleet.local import dns, images, joining

ROOT = Path(__file__).parents[3]


def _by_kind(image: str) -> dict[str, dict[str, object]]:
    return _by_kind_in(image, None)


def _by_kind_in(image: str, pool: str | None) -> dict[str, Any]:
    return {str(body["kind"]): body for _, body in dns.objects(image, pool)}


def test_the_service_is_where_the_kubelets_send_pods_and_maps_53_to_coredns() -> None:
    service = _by_kind("gpufleet.local/coredns:1")["Service"]
    spec = service["spec"]
    assert isinstance(spec, dict)
    assert spec["clusterIP"] == joining.CLUSTER_DNS
    assert {(p["port"], p["targetPort"], p["protocol"]) for p in spec["ports"]} == {
        (53, dns.PORT, "UDP"),
        (53, dns.PORT, "TCP"),
    }
    kubelet = yaml.safe_load(joining.kubelet_configuration())
    assert kubelet["clusterDNS"] == [joining.CLUSTER_DNS]


def test_coredns_answers_the_cluster_domain_and_runs_on_a_machine_unprivileged() -> None:
    objects = _by_kind("gpufleet.local/coredns:1")
    corefile = objects["ConfigMap"]["data"]["Corefile"]  # type: ignore[index]
    assert f".:{dns.PORT} " in corefile and "kubernetes cluster.local" in corefile
    assert "forward" not in corefile  # nothing outside the cluster is asked
    pod = objects["Deployment"]["spec"]["template"]["spec"]  # type: ignore[index]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "gpufleet.io/machine", "operator": "Exists"}
    ]
    # Given a system pool, only there: on a GPU node it would be work that burn-in refuses.
    # The pool alone: the host node is a system node but not a Machine (no machine label).
    pinned = _by_kind_in("gpufleet.local/coredns:1", "system")["Deployment"]["spec"]["template"]
    expressions = pinned["spec"]["affinity"]["nodeAffinity"][  # type: ignore[index]
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert expressions == [{"key": "gpufleet.io/pool", "operator": "In", "values": ["system"]}]
    (container,) = pod["containers"]
    assert container["image"] == "gpufleet.local/coredns:1"
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_image_tag_names_the_coredns_release_the_build_requires() -> None:
    go_mod = (ROOT / "scripts/images/coredns/go.mod").read_text()
    m = re.search(r"^require github.com/coredns/coredns v(\S+)$", go_mod, re.MULTILINE)
    assert m is not None
    assert m.group(1) == images.COREDNS_VERSION


def test_storage_binds_where_the_claim_s_pod_runs_on_a_system_machine() -> None:
    from gpufleet.local import storage

    kinds = [body["kind"] for _, body in storage.objects("system")]
    assert kinds == ["StorageClass"] + ["PersistentVolume"] * storage.VOLUMES
    sc = storage.objects("system")[0][1]
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"  # bound once the pod is placed
    for _, pv in storage.objects("system")[1:]:
        spec = pv["spec"]
        assert spec["storageClassName"] == storage.CLASS
        assert spec["capacity"]["storage"] == storage.SIZE
        terms = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"]
        assert terms == [{"key": "gpufleet.io/pool", "operator": "In", "values": ["system"]}]
