"""The host node: the node image's kubelet, containerd and kube-proxy run natively on the
host in namespaces of their own (:mod:`gpufleet.local.host_node`), tried for real.

One cluster with the chart's ground (``images``: registry, fabric, CoreDNS, storage) and
the host node; its machine is never powered on (the machines test boots one beside a host
node). Checked: the kubelet joins by TLS bootstrap with its bootstrap token; pods run
there with addresses of its pod subnet, pull from the cluster's registry, reach the API
through the ``kubernetes`` Service and each other by name through CoreDNS (on the host
node too); a hostPath volume is written in the run directory, never in the host's
``/var``; the host's ``/etc`` is untouched. Then the breakage an operator's laptop would
see: the runner killed with SIGKILL takes every process of the node with it (the kernel
ends a PID namespace with its first process), and the cluster's stop removes the pods'
cgroups the runner could not.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import Api
from machines_harness import assert_reached_by_name, node_ready, pod_phase, wait_for

from gpufleet.domain import well_known
from gpufleet.local import host_node, processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.steps, pytest.mark.timeout(900)]

NODE = host_node.NAME


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[ClusterInfo, Api, LocalCluster]]:
    spec = ClusterSpec(
        nodes=1,
        slurm=False,
        machines=1,
        images=True,
        host_node=True,
        machine_power_on=False,
        machine_agent=False,
    )
    with processes.terminate_on_signals():
        local = LocalCluster(spec)
        info = local.start()
        try:
            yield info, Api(info), local
        finally:
            local.stop()


def node_processes(info: ClusterInfo) -> list[int]:
    """Pids of processes still running from the host node's files (kubelet, containerd,
    kube-proxy) or in its containers' cgroups."""
    files = str(host_node.HostNodeConfig.load(info.run_dir / "host-node/host-node.json").files)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            cgroups = (entry / "cgroup").read_text()
        except OSError:
            continue
        if exe.startswith(files) or host_node.cgroup_root_of(info.run_dir) in cgroups:
            found.append(int(entry.name))
    return found


def cgroups_left(info: ClusterInfo) -> list[Path]:
    top = host_node.cgroup_root_of(info.run_dir).lstrip("/")
    return [h / top for h in Path("/sys/fs/cgroup").iterdir() if (h / top).exists()]


def test_the_host_node_joins_by_tls_bootstrap(cluster: Any) -> None:
    info, api, _ = cluster
    node = wait_for("the host node Ready", lambda: node_ready(api, NODE), 180)
    labels = node["metadata"]["labels"]
    assert labels[well_known.LABEL_POOL] == host_node.POOL
    assert well_known.LABEL_MACHINE not in labels, "it is not a Machine"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == host_node.ADDRESS
    assert node["spec"]["podCIDR"]
    # Its client certificate came from a CSR its bootstrap token made, approved and signed
    # by the controller-manager, as a machine's kubeadm join does.
    csrs = api.get("/apis/certificates.k8s.io/v1/certificatesigningrequests")["items"]
    ours = [c for c in csrs if c["spec"]["username"].startswith("system:bootstrap:")]
    assert ours, csrs
    assert all(c["status"].get("certificate") for c in ours)
    # The host's own /etc has no Kubernetes files: they are in the node's overlay.
    assert not Path("/etc/kubernetes").exists()
    assert (info.run_dir / "host-node/etc.upper/kubernetes/kubelet.conf").exists()


def test_pods_on_the_host_node_reach_the_api_and_each_other_by_name(cluster: Any) -> None:
    _, api, _ = cluster
    wait_for(
        "CoreDNS Ready on the host node",
        lambda: any(
            p["spec"].get("nodeName") == NODE
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions") or []
            )
            for p in api.get(
                "/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dkube-dns"
            )["items"]
        ),
        300,
    )
    assert_reached_by_name(api, "host", NODE, NODE, 120)


def test_an_image_from_the_registry_writes_a_host_path_in_the_run_directory(
    cluster: Any,
) -> None:
    """The Slurm image, pulled from the cluster's registry through the node's forwarded
    port, writes a hostPath volume (as slurmctld's local volume does): the file lands in
    the node's ``/var`` overlay in the run directory, not in the host's ``/var``."""
    info, api, _ = cluster
    name, mark = "host-volume", f"written-{time.time_ns()}"
    path = "/var/lib/gpufleet/volumes/probe"
    api.post(
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "write",
                        "image": info.images["slurm"],
                        "command": ["sh", "-c", f"echo {mark} >/data/mark"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
                "volumes": [
                    {"name": "data", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
                ],
            },
        },
    )
    try:
        done = wait_for(
            f"pod {name} finished", lambda: pod_phase(api, name, "Succeeded", "Failed"), 300
        )
        assert done["status"]["phase"] == "Succeeded", done["status"]
        written = info.run_dir / "host-node/var.upper" / path.removeprefix("/var/") / "mark"
        assert written.read_text().strip() == mark
        assert not Path(path).exists()
        assert "GET /v2/slurm/manifests/" in (info.logs_dir / "registry.log").read_text()
    finally:
        api.delete(f"/api/v1/namespaces/default/pods/{name}?gracePeriodSeconds=0")


def test_a_killed_runner_takes_the_node_with_it_and_stop_leaves_nothing(cluster: Any) -> None:
    info, _, local = cluster
    assert node_processes(info), "the node runs before the kill"
    runner = next(r for r in info.processes if r.name == "host-node")
    os.kill(runner.pid, signal.SIGKILL)
    wait_for("every process of the node gone", lambda: not node_processes(info), 60)
    local.stop()
    assert not cgroups_left(info)
    mounts = Path("/proc/mounts").read_text()
    assert str(info.run_dir) not in mounts
