"""One bad GPU, not eight, in Kubernetes DRA, on real components: the apiserver,
kube-scheduler and kube-controller-manager with DRA device taints (decision 0237), a KWOK
Node of the test's own.

The agent's publisher writes the node's three simulated GPUs as a ResourceSlice; two pods
each hold a ResourceClaim for one GPU of the DeviceClass ``gpu.gpufleet.io``, so the
scheduler places both on that node. The controller's DeviceTaints collaborator is then
handed a record that quarantines the GPU of pod A (GQ's record field
``quarantined_gpus``): it writes one DeviceTaintRule, kube-controller-manager's device
taint eviction controller deletes exactly pod A, and pod B keeps running. A new claim is
allocated the one healthy free GPU; a claim after it, for which only the tainted GPU is
left, stays unschedulable until the quarantine is released (the rule deleted), and then
gets it.

The chart's admission policy holds the agent to its own node's slice: with a token bound to
an agent pod on a node, it may create that node's slice and no other node's, nor one of
another driver.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import yaml
from controller_harness import Api, create_kwok_nodes, reset_node
from test_security_rbac import Client, render
from waiting import wait_for

from gpufleet.api import dra as codec
from gpufleet.clock import SYSTEM_CLOCK
from gpufleet.domain import dra
from gpufleet.domain.records import NodeRecord, QuarantinedGpu
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.resource_slices import SlicePublisher
from gpufleet.kubeapi import KubeApi, KubePort
from gpufleet.kubeapi.events import EventRecorder
from gpufleet.lifecycle.device_taints import DeviceTaints
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.tasks import TaskGroup
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

NODE = "dra-node-0"
NS = "dra-taints"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
PODS = f"/api/v1/namespaces/{NS}/pods"


class Loop:
    """One event loop for the test's async parts (the API client lives on it)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def api(local_cluster: ClusterInfo) -> Iterator[Api]:
    api = Api(local_cluster)
    create_kwok_nodes(api, [NODE], pool="dra")
    api.post("/api/v1/namespaces", {"metadata": {"name": NS}}, ok=(201, 409))
    api.post("/apis/resource.k8s.io/v1/deviceclasses", codec.device_class(), ok=(201, 409))
    try:
        yield api
    finally:
        api.delete(f"/api/v1/namespaces/{NS}")
        for i in range(3):
            api.delete(f"{RULES}/{dra.rule_name(NODE, i)}")
        api.delete(f"/apis/resource.k8s.io/v1/resourceslices/{dra.slice_name(NODE)}")
        api.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{dra.DEVICE_CLASS}")
        reset_node(api, NODE)
        api.delete(f"/api/v1/nodes/{NODE}")


def claim_and_pod(api: Api, name: str) -> None:
    """A ResourceClaim for one GPU of gpufleet's class, and a pod holding it."""
    api.post(
        CLAIMS,
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]
                }
            },
        },
    )
    api.post(
        PODS,
        {
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "c",
                        "image": "example.invalid/train:1",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )


def device_of(api: Api, claim: str) -> str | None:
    results = (
        ((api.get(f"{CLAIMS}/{claim}").get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results")
    )
    return results[0]["device"] if results else None


def pod(api: Api, name: str) -> dict[str, Any] | None:
    r = api.http.get(f"{PODS}/{name}")
    return None if r.status_code == 404 else r.json()


def running(api: Api, name: str) -> bool:
    p = pod(api, name)
    return bool(
        p
        and p["status"].get("phase") == "Running"
        and p["spec"].get("nodeName") == NODE
        and not p["metadata"].get("deletionTimestamp")
    )


def unschedulable(api: Api, name: str) -> bool:
    p = pod(api, name) or {}
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in (p.get("status") or {}).get("conditions", [])
    )


def test_a_quarantined_gpu_evicts_only_its_pod_and_is_never_allocated_again(
    api: Api, local_cluster: ClusterInfo
) -> None:
    loop = Loop()
    client: KubePort = loop.run(KubeApi.connect(str(local_cluster.kubeconfig)))

    async def connect() -> KubePort:
        return client

    # The agent's publisher: the node's 3 simulated GPUs as one ResourceSlice.
    hw = SimulatedHardware(node=NODE, gpus=3)
    assert loop.run(SlicePublisher(hw, NODE, connect).publish())
    published = api.get(f"/apis/resource.k8s.io/v1/resourceslices/{dra.slice_name(NODE)}")
    assert [d["name"] for d in published["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]

    claim_and_pod(api, "pod-a")
    claim_and_pod(api, "pod-b")
    wait_for(
        "pods a and b running on the DRA node",
        lambda: running(api, "pod-a") and running(api, "pod-b"),
        timeout=30,
    )
    bad, good = device_of(api, "pod-a"), device_of(api, "pod-b")
    assert bad and good and bad != good
    index = int(bad.removeprefix("gpu-"))

    # The controller's side, handed the record GQ's decision writes.
    tasks = TaskGroup()
    fleet, book = Fleet(), NodeBook()
    book.put(NODE, api.node(NODE))
    taints = DeviceTaints(
        client,
        fleet=fleet,
        book=book,
        policy=_acting_policy,
        events=EventSink(EventRecorder(client), tasks, namespace="default", clock=SYSTEM_CLOCK),
        clock=SYSTEM_CLOCK,
    )
    record = NodeRecord.new(NODE, at=SYSTEM_CLOCK.now())
    gpu = QuarantinedGpu(index, f"GPU-{index}", "xid-94", SYSTEM_CLOCK.now())
    fleet.put(replace(record, quarantined_gpus=(gpu,)))
    loop.run(sync(taints, tasks))
    rules = api.get(f"{RULES}?labelSelector={codec.RULE_SELECTOR}")["items"]
    assert [r["spec"]["deviceSelector"] for r in rules] == [
        {"driver": dra.DRIVER, "pool": NODE, "device": bad}
    ]

    wait_for("pod a evicted for its tainted GPU", lambda: not running(api, "pod-a"), timeout=30)
    assert running(api, "pod-b"), "pod b, on a healthy GPU of the same node, must keep running"
    api.delete(f"{CLAIMS}/pod-a")  # its allocation goes with it

    # A new claim gets the healthy free GPU; the next one has only the tainted one left.
    claim_and_pod(api, "pod-c")
    wait_for("pod c running", lambda: running(api, "pod-c"), timeout=30)
    assert device_of(api, "pod-c") not in (bad, good)
    claim_and_pod(api, "pod-d")
    wait_for("pod d unschedulable", lambda: unschedulable(api, "pod-d"), timeout=30)
    assert device_of(api, "pod-d") is None
    assert running(api, "pod-b")

    # Released: the rule goes, and the GPU is allocated again.
    fleet.put(replace(record, quarantined_gpus=()))
    loop.run(sync(taints, tasks))
    assert api.get(f"{RULES}?labelSelector={codec.RULE_SELECTOR}")["items"] == []
    wait_for("pod d running on the released GPU", lambda: running(api, "pod-d"), timeout=30)
    assert device_of(api, "pod-d") == bad

    def reasons() -> dict[str, str]:
        events = api.get(
            f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{NODE}"
        )["items"]
        return {e["reason"]: e["message"] for e in events}

    said = wait_for(
        "both Events", lambda: {"GpuTainted", "GpuUntainted"} <= set(reasons()) and reasons()
    )
    assert f"GPU {index} (GPU-{index})" in said["GpuTainted"]
    loop.run(tasks.close())
    loop.loop.close()


REL = "dratest"
RBAC_NS = "gpufleet-dra-rbac"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DRA_POLICY_KINDS = ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding")  # fmt: skip


def probe_slice(name: str, node: str, driver: str = dra.DRIVER) -> dict[str, Any]:
    body = codec.resource_slice(node, [dra.GpuDevice(0, "GPU-probe", "probe")], generation=1)
    body["metadata"]["name"] = name
    body["spec"]["driver"] = driver
    return body


def test_the_agent_may_write_only_its_own_nodes_slice(api: Api, local_cluster: ClusterInfo) -> None:
    kubectl, env = str(local_cluster.kubectl), local_cluster.kube_env()
    docs = render(RBAC_NS, REL, "--set", "dra.enabled=true")
    agent_sa = f"{REL}-gpufleet-agent"
    objs = [
        d
        for d in docs
        if (
            d["kind"] in DRA_POLICY_KINDS
            and d["metadata"]["name"].endswith(("-agent-dra", "-agent-own-slice"))
        )
        or (d["kind"] == "ServiceAccount" and d["metadata"]["name"] == agent_sa)
    ]
    assert len(objs) == 5, [d["metadata"]["name"] for d in objs]
    subprocess.run([kubectl, "create", "namespace", RBAC_NS], env=env, capture_output=True)
    applied = subprocess.run(
        [kubectl, "apply", "-f", "-"],
        env=env,
        input=yaml.safe_dump_all(objs),
        capture_output=True,
        text=True,
    )
    assert applied.returncode == 0, applied.stderr
    # A session node of its own (the DRA node's pool is the other test's), and another one.
    own, other = local_cluster.node_names[1], local_cluster.node_names[0]
    try:
        pod = api.post(
            f"/api/v1/namespaces/{RBAC_NS}/pods",
            {
                "metadata": {"name": "agent-probe"},
                "spec": {
                    "serviceAccountName": agent_sa,
                    "nodeName": own,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "gpufleet:test"}],
                },
            },
        ).json()
        token = api.post(
            f"/api/v1/namespaces/{RBAC_NS}/serviceaccounts/{agent_sa}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "agent-probe",
                        "uid": pod["metadata"]["uid"],
                    },
                },
            },
        ).json()["status"]["token"]
        agent = Client(local_cluster, token=token)
        api.post(SLICES, probe_slice("dra-probe-other", other))  # another node's, by the admin

        def refused_elsewhere() -> bool:
            r = agent.request("POST", SLICES, probe_slice("dra-probe-mine-elsewhere", other))
            return (
                r.status_code == 403 and "only the ResourceSlice of the Node it runs on" in r.text
            )

        wait_for("the agent's own-slice admission policy", refused_elsewhere)
        r = agent.request("POST", SLICES, probe_slice("dra-probe-own", own))
        assert r.status_code == 201, r.text
        r = agent.request("POST", SLICES, probe_slice("dra-probe-vendor", own, "gpu.nvidia.com"))
        assert r.status_code == 403, r.text
        r = agent.request(
            "PATCH",
            f"{SLICES}/dra-probe-other",
            {"metadata": {"labels": {"taken": "over"}}},
            kind="merge",
        )
        assert r.status_code == 403, r.text
        r = agent.request("DELETE", f"{SLICES}/dra-probe-other")
        assert r.status_code == 403, r.text  # RBAC: the agent deletes no slice at all
    finally:
        # The probe pod goes at once and is waited for: it sits on a session node, and a
        # later module's `kubectl drain` of that node refuses a pod with no controller.
        probe = f"/api/v1/namespaces/{RBAC_NS}/pods/agent-probe"
        api.delete(f"{probe}?gracePeriodSeconds=0")
        wait_for("the probe pod gone", lambda: api.http.get(probe).status_code == 404, 60)
        for name in (
            "dra-probe-other",
            "dra-probe-own",
            "dra-probe-mine-elsewhere",
            "dra-probe-vendor",
        ):
            api.delete(f"{SLICES}/{name}")
        cluster_scoped = [d for d in objs if d["kind"] in DRA_POLICY_KINDS]
        subprocess.run(
            [kubectl, "delete", "--ignore-not-found", "-f", "-"],
            env=env, input=yaml.safe_dump_all(cluster_scoped), capture_output=True, text=True,
        )  # fmt: skip
        subprocess.run(
            [kubectl, "delete", "namespace", RBAC_NS, "--wait=false"], env=env, capture_output=True
        )


async def sync(taints: DeviceTaints, tasks: TaskGroup) -> None:
    """One pass, and the Events it posts in the background."""
    await taints.sync()
    await asyncio.gather(*tasks.pending, return_exceptions=True)


def _acting_policy() -> Any:
    from gpufleet.domain.policy import default_policy

    return default_policy()
