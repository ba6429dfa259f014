"""Issue 33, item 11 ("Smaller"), each broken on purpose on the local cluster.

Real apiserver (with the chart's RBAC and admission policies where the case is about who may
do what: only the objects this module needs, under a release of its own), real Slurm
(slurmctld, slurmd, slurmrestd), the real controller process, agent, syncer and
SlurmCluster operator:

1. a MaintenancePlan's command installed as a symbolic link is refused unrun (agent);
2. an agent's Events about another Node are refused by admission, and an Event forged for
   a node is not in that node's RMA evidence (controller);
3. a taint someone adds while the syncer's view is one version behind survives the
   syncer's own taint write (resourceVersion, 409, read again);
4. the syncer, under the chart's RBAC narrowed to one namespace, locks no node for a Pod
   elsewhere, and binds nothing on a lock forged for a Pod it is not entitled to;
5. a fleet-wide budget holds a fault in a pool whose own budget has room;
6. a SlurmCluster partition naming a badly formed or undefined pool is refused by the
   apiserver, and one whose nodes are gone keeps the last config and says so;
7. a FleetPolicy or policy file with an infinite or absurd number is refused, by the
   apiserver and by ``gpufleet policy validate``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controller_harness import (
    GV,
    SYSTEM_NS,
    Api,
    RunningAgent,
    create_kwok_nodes,
    install,
    maintenance_cli,
    plan_status,
    policy_spec,
    put_policy,
    reset_node,
    running,
)
from slurm_support import Kube, RunningSyncer, Slurm
from test_rma_ticket import Receiver, _agent_event, _controller_args, _fault
from test_security_rbac import Client, render
from waiting import wait_for

from gpufleet.api import slurmcluster as sc
from gpufleet.domain import well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.health.agent import AgentSettings
from gpufleet.kubeapi import KubeApi
from gpufleet.kubeapi.events import event_body
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm import nodes as kn
from gpufleet.slurm.operator import ClusterOperator, OperatorSettings
from gpufleet.slurm.restapi import RestConfig, SlurmRest
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

REL = "smaller"
FULL = f"{REL}-gpufleet"
NS = "gpufleet-smaller"
LEND_NS = "smaller-lend"
AGENT_SA = f"system:serviceaccount:{NS}:{FULL}-agent"
THRESHOLD = 1_000_000
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
WANTED = {
    # The accounts, their rules, and the two admission policies about the agent.
    ("ServiceAccount", f"{FULL}-agent"),
    ("ServiceAccount", f"{FULL}-slurm-syncer"),
    ("ClusterRole", f"{FULL}-agent"),
    ("ClusterRoleBinding", f"{FULL}-agent"),
    ("ClusterRole", f"{FULL}-slurm-syncer"),
    ("ClusterRoleBinding", f"{FULL}-slurm-syncer"),
    ("Role", f"{FULL}-slurm-lending"),
    ("RoleBinding", f"{FULL}-slurm-lending"),
    *((kind, f"{FULL}-agent-events") for kind in POLICY_KINDS),
    *((kind, f"{FULL}-agent-own-node") for kind in POLICY_KINDS),
}


@pytest.fixture(scope="module")
def api(local_cluster: ClusterInfo) -> Api:
    api = Api(local_cluster)
    install(api)
    return api


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smaller-logs")


@pytest.fixture(scope="module")
def chart(local_cluster: ClusterInfo, api: Api) -> Iterator[list[dict[str, Any]]]:
    """The chart's agent and syncer accounts, rules and agent admission policies, applied,
    with lending narrowed to ``LEND_NS`` (syncer.lendNamespaces)."""
    docs = render(NS, REL, "--set", f"syncer.lendNamespaces={{{LEND_NS}}}")
    objs = [d for d in docs if (d["kind"], d["metadata"]["name"]) in WANTED]
    assert {(d["kind"], d["metadata"]["name"]) for d in objs} == WANTED
    for ns in (NS, LEND_NS):
        api.post("/api/v1/namespaces", {"metadata": {"name": ns}}, ok=(201, 409))
    kubectl, env = str(local_cluster.kubectl), local_cluster.kube_env()
    subprocess.run(
        [kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(objs), env=env,
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    try:
        yield objs
    finally:
        subprocess.run(
            [kubectl, "delete", "--ignore-not-found", "-f", "-"],
            input=yaml.safe_dump_all(objs), env=env, capture_output=True, text=True,
        )  # fmt: skip
        for ns in (NS, LEND_NS):
            api.delete(f"/api/v1/namespaces/{ns}")


def token_for(api: Api, account: str, *, pod_on: str | None = None) -> str:
    """A token of ``account`` in ``NS``; bound to a pod on ``pod_on`` when given (then it
    carries the node's name, as the kubelet's token of a DaemonSet pod does)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod_on is not None:
        name = f"probe-{pod_on}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "serviceAccountName": account,
                "nodeName": pod_on,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "probe", "image": "gpufleet:test"}],
            },
        }
        r = api.http.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
        if r.status_code == 409:
            r = api.http.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        uid = r.json()["metadata"]["uid"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
    r = api.post(
        f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(r.json()["status"]["token"])


def eventually(check: Any, what: str, timeout: float = 30) -> None:
    """Admission policies take effect a moment after they are created."""
    wait_for(what, check, timeout=timeout)


# -- 2. Events about a node, and its RMA evidence ----------------------------------------

EVIDENCE_NODES = ["smaller-ev-0", "smaller-ev-1"]
GENUINE = "NVRM: Xid (PCI:0000:1b:00): 45, pid=4242, name=python, Ch 00000010"
FORGED = "NVRM: Xid (PCI:0000:1b:00): 48, pid=1, name=forged, DBE (double bit error)"


def _event(node: str, *, about: str, component: str = well_known.AGENT, msg: str = FORGED) -> Any:
    now = time.time()
    return event_body(
        involved={"apiVersion": "v1", "kind": "Node", "name": about},
        type_="Warning",
        reason="Xid48",
        message=msg,
        component=component,
        instance=node,
        namespace="default",
        first=rfc3339(now),
        name=f"{about}.{node}.{int(now * 1e6):x}",
        host=node,
    )


def test_rma_evidence_takes_only_the_nodes_own_agents_events(
    local_cluster: ClusterInfo, api: Api, logs: Path
) -> None:
    """Before the admission policy is in place (this test runs first): Warning Events
    "seen" on node 0 posted as another node's agent and with no reporting instance are not
    in node 0's evidence bundle; the Event of node 0's own agent is."""
    node, other = EVIDENCE_NODES
    for i, name in enumerate(EVIDENCE_NODES):
        create_kwok_nodes(api, [name], pool=f"smaller-ev-{i}")
    spec = policy_spec()
    for rule in spec["rules"]:
        if rule["match"].get("xid") == 79:
            rule["action"] = "triage"
    spec["drain"]["slurm"] = "never"  # these KWOK nodes are no Slurm nodes
    put_policy(api, "smaller-evidence", spec)
    receiver = Receiver()
    receiver.thread.start()
    try:
        with running(
            local_cluster, logs, policy="smaller-evidence",
            extra_args=_controller_args(receiver, logs),
        ):  # fmt: skip
            wait_for("adopted", lambda: api.state(node) == "production")
            _agent_event(api, node, f"GPU 3: {GENUINE}")
            api.post("/api/v1/namespaces/default/events", _event(other, about=node))
            bare = _event(node, about=node)
            del bare["reportingInstance"]
            api.post("/api/v1/namespaces/default/events", bare)
            _fault(api, node)
            wait_for("triage", lambda: api.state(node) == "triage", timeout=30)
            opened = wait_for("ticket opened", lambda: receiver.calls(node, "opened"), timeout=30)
            bundle = opened[-1][1]["bundle"]
            lines = bundle["kernelLog"]
            assert any(GENUINE in line for line in lines), lines
            assert not any(FORGED in line for line in lines), lines
    finally:
        receiver.server.shutdown()
        for name in EVIDENCE_NODES:
            reset_node(api, name)
            api.delete(f"/api/v1/nodes/{name}")
        api.delete(f"{GV}/fleetpolicies/smaller-evidence")
        api.http.delete(
            f"/api/v1/namespaces/{SYSTEM_NS}/configmaps",
            params={"labelSelector": f"{well_known.LABEL_EVIDENCE}=rma"},
        )


# -- 5. the fleet-wide budget ------------------------------------------------------------

BUDGET_NODES = ["smaller-fb-0", "smaller-fb-1", "smaller-fb-2"]


def test_the_fleet_budget_holds_a_fault_its_pool_has_room_for(
    local_cluster: ClusterInfo, api: Api, logs: Path
) -> None:
    """Three pools of one node each (each pool's budget: 1). With fleetMaxNodes 1, a second
    fault in another pool is held while the first node is out; raised to 2, it proceeds."""
    for i, name in enumerate(BUDGET_NODES):
        create_kwok_nodes(api, [name], pool=f"smaller-fb-{i}")
    spec = policy_spec()
    # The first node stays draining: it waits for Slurm's word, which a node Slurm does
    # not know never gets (fail closed), so it keeps counting against the budget.
    spec["drain"]["slurm"] = "always"
    spec["safety"]["budget"] = {"maxNodes": 1, "maxPercent": 100, "minNodes": 1,
                                "fleetMaxNodes": 1}  # fmt: skip
    put_policy(api, "smaller-budget", spec)
    first, second = BUDGET_NODES[:2]
    try:
        with running(local_cluster, logs, policy="smaller-budget"):
            wait_for("adopted", lambda: all(api.state(n) == "production" for n in BUDGET_NODES))
            _fault(api, first)
            wait_for("first out", lambda: api.state(first) == "draining", timeout=30)
            _fault(api, second)
            wait_for(
                "the second fault held",
                lambda: (r := api.record(second)) is not None and r.pending is not None,
                timeout=30,
            )
            assert api.state(second) == "production"
            assert not api.node(second)["spec"].get("unschedulable")
            # The Event is posted in the background after the record write (events.py).
            withheld = wait_for(
                "the ActionWithheld Event",
                lambda: [e for e in api.events(second) if e["reason"] == "ActionWithheld"],
                timeout=30,
            )
            assert withheld[-1]["message"].startswith("budget-exhausted"), withheld

            def fleet_status() -> dict[str, Any]:
                status = api.get(f"{GV}/fleetpolicies/smaller-budget").get("status") or {}
                return dict(status.get("fleetBudget") or {})

            wait_for(
                "status.fleetBudget",
                lambda: (
                    fleet_status().get("waiting") == 1 and fleet_status().get("outOfService") == 1
                ),
                timeout=30,
            )
            assert fleet_status()["allowed"] == 1
            # The pool of the held node has room: only the fleet's budget holds it.
            assert api.get(f"{GV}/fleetpolicies/smaller-budget")["status"]["budget"][
                "smaller-fb-1"
            ] == {"size": 1, "outOfService": 0, "allowed": 1, "waiting": 1}
            api.patch(
                f"{GV}/fleetpolicies/smaller-budget",
                {"spec": {"safety": {"budget": {"fleetMaxNodes": 2}}}},
            )
            wait_for("released", lambda: api.state(second) == "draining", timeout=30)
    finally:
        for name in BUDGET_NODES:
            reset_node(api, name)
            api.delete(f"/api/v1/nodes/{name}")
        api.delete(f"{GV}/fleetpolicies/smaller-budget")


# -- 6. SlurmCluster partitions ----------------------------------------------------------

SC_NS = "smaller-slurm"
OLD_NODE = "smaller-old-0"


def _cluster(pools: list[str], partitions: list[dict[str, Any]]) -> dict[str, Any]:
    selectors = {
        "h100": {"nvidia.com/gpu.present": "true"},
        "old": {"example.com/smaller-pool": "old"},
    }
    return {
        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
        "kind": sc.KIND,
        "metadata": {"name": "research", "namespace": SC_NS},
        "spec": {
            "nodePools": [{"name": p, "nodeSelector": selectors.get(p, {})} for p in pools],
            "partitions": partitions,
        },
    }


def test_a_partition_without_nodes_keeps_the_last_config_and_says_so(
    local_cluster: ClusterInfo, api: Api
) -> None:
    base = f"/apis/{well_known.GROUP}/{well_known.VERSION}/namespaces/{SC_NS}/{sc.PLURAL}"
    api.post("/api/v1/namespaces", {"metadata": {"name": SC_NS}}, ok=(201, 409))
    create_kwok_nodes(api, [OLD_NODE], pool="smaller-old")
    api.patch(
        f"/api/v1/nodes/{OLD_NODE}", {"metadata": {"labels": {"example.com/smaller-pool": "old"}}}
    )
    try:
        # The apiserver refuses a pool name with a line break, and a pool no nodePool defines.
        bad = _cluster(["h100"], [{"name": "batch", "pools": ["h100\nPrologSlurmctld=/tmp/x"]}])
        r = api.http.post(base, json=bad)
        assert r.status_code == 422 and "spec.partitions[0].pools[0]" in r.text, r.text
        bad = _cluster(["h100"], [{"name": "batch", "pools": ["h100", "b200"]}])
        r = api.http.post(base, json=bad)
        assert r.status_code == 422, r.text
        assert "every pool a partition names must be one of spec.nodePools" in r.text

        good = _cluster(
            ["old", "h100"],  # a Node matching both joins the first: old first
            [{"name": "batch", "pools": ["h100"], "default": True},
             {"name": "legacy", "pools": ["old"]}],
        )  # fmt: skip
        api.post(base, good)
        first, second = asyncio.run(_two_reconciles(local_cluster, api))
        cm_path = f"/api/v1/namespaces/{SC_NS}/configmaps/research-slurm-config"
        assert first["configHash"]
        conf = api.get(cm_path)["data"]["slurm.conf"]
        assert f"PartitionName=legacy Nodes={OLD_NODE} " in conf

        ready = second["conditions"][0]
        assert (ready["status"], ready["reason"]) == ("False", "PartitionWithoutNodes"), ready
        assert "partition 'legacy' would have no nodes" in ready["message"]
        assert f"keeps its last config ({first['configHash']})" in ready["message"]
        assert api.get(cm_path)["data"]["slurm.conf"] == conf  # nothing applied
        stored = api.get(f"{base}/research")["status"]
        assert stored["configHash"] == first["configHash"]
        assert stored["conditions"][0]["reason"] == "PartitionWithoutNodes"
    finally:
        api.delete(f"/api/v1/namespaces/{SC_NS}")
        api.delete(f"/api/v1/nodes/{OLD_NODE}")
        for name in local_cluster.node_names:
            api.patch(
                f"/api/v1/nodes/{name}",
                {"metadata": {"labels": {well_known.LABEL_SLURM_CLUSTER: None}}},
            )


async def _two_reconciles(info: ClusterInfo, api: Api) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reconcile with every pool's nodes there; then with the old pool's only Node gone."""
    kube = await KubeApi.connect(str(info.kubeconfig))
    assert info.slurmrestd_url and info.slurm_jwt
    rest = SlurmRest(RestConfig(info.slurmrestd_url, "root", info.slurm_jwt))
    op = ClusterOperator(
        kube=kube, scontrol=None, rest=rest, settings=OperatorSettings(reconfigure=False)
    )
    try:
        first = await op.reconcile(SC_NS, "research")
        api.patch(
            f"/api/v1/nodes/{OLD_NODE}",
            {"metadata": {"labels": {"example.com/smaller-pool": None}}},
        )
        second = await op.reconcile(SC_NS, "research")
    finally:
        await rest.aclose()
    assert first is not None and second is not None
    return first, second


# -- 7. bounded policy numbers -----------------------------------------------------------


def test_unbounded_policy_numbers_are_refused_by_the_apiserver_and_validate(
    local_cluster: ClusterInfo, api: Api, tmp_path: Path
) -> None:
    spec = policy_spec()
    spec["safety"]["budget"]["maxNodes"] = 10**30
    spec["ladder"][0]["timeoutSeconds"] = 1e12
    body = {
        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
        "kind": "FleetPolicy",
        "metadata": {"name": "smaller-unbounded"},
        "spec": spec,
    }
    r = api.http.post(f"{GV}/fleetpolicies?dryRun=All", json=body)
    assert r.status_code == 422, r.text
    assert "spec.safety.budget.maxNodes" in r.text and "spec.ladder[0].timeoutSeconds" in r.text
    spec["safety"]["budget"]["maxNodes"] = 50
    spec["ladder"][0]["timeoutSeconds"] = 120
    r = api.http.post(f"{GV}/fleetpolicies?dryRun=All", json=body)
    assert r.status_code == 201, r.text

    broken = policy_spec()
    broken["ladder"][0]["timeoutSeconds"] = float("inf")  # written .inf
    broken["safety"]["breaker"]["windowSeconds"] = float("nan")  # written .nan
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert ".inf" in path.read_text() and ".nan" in path.read_text()
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "policy", "validate", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ladder[0].timeoutSeconds: Input should be a finite number" in (out.stdout + out.stderr)
    assert "safety.breaker.windowSeconds: Input should be a finite number" in (
        out.stdout + out.stderr
    )
    assert "Traceback" not in out.stderr


# -- 1. maintenance commands ------------------------------------------------------------

CMD_NODE = "smaller-cmd-0"


def test_a_maintenance_command_installed_as_a_link_is_refused_unrun(
    local_cluster: ClusterInfo, api: Api, logs: Path, tmp_path: Path
) -> None:
    """The commands directory holds ``flash-fw`` as a symbolic link to a script anyone may
    edit: the agent refuses it without running it, and the node goes to triage."""
    create_kwok_nodes(api, [CMD_NODE], pool="smaller-cmd")
    api.patch(f"/api/v1/nodes/{CMD_NODE}", {"metadata": {"labels": {"example.com/fw": "yes"}}})
    commands = tmp_path / "maintenance.d"
    commands.mkdir()
    commands.chmod(0o755)
    writable = tmp_path / "shared"
    writable.mkdir()
    writable.chmod(0o777)
    marker = tmp_path / "ran"
    target = writable / "flash-fw"
    target.write_text(f"#!/bin/sh\ntouch {marker}\n")
    target.chmod(0o755)  # root's, not writable by others: only the directory is open
    (commands / "flash-fw").symlink_to(target)
    spec = policy_spec()
    spec["safety"]["budget"] = {"maxNodes": 1, "maxPercent": 100, "minNodes": 1}
    spec["drain"]["slurm"] = "never"
    put_policy(api, "smaller-cmd", spec)
    settings = AgentSettings(interval_s=0.2, request_retry_s=1.0, maintenance_commands=commands)
    try:
        with (
            RunningAgent(local_cluster, CMD_NODE, settings).started(),
            running(local_cluster, logs, policy="smaller-cmd"),
        ):
            wait_for("burn-in passed", lambda: api.state(CMD_NODE) == "production", timeout=120)
            maintenance_cli(local_cluster, "create", "smaller-fw", "--action", "command",
                            "--command", "flash-fw", "-l", "example.com/fw=yes")  # fmt: skip
            wait_for(
                "plan stopped or done",
                lambda: plan_status(api, "smaller-fw").get("phase") in ("Completed", "Stopped"),
                timeout=180,
            )
            assert api.state(CMD_NODE) == "triage"
            record = api.record(CMD_NODE)
            assert record is not None
            assert "flash-fw is a symbolic link: refused" in record.reason, record.reason
            assert not marker.exists(), "the linked script ran"
    finally:
        api.delete(f"{GV}/maintenanceplans/smaller-fw")
        api.delete(f"{GV}/fleetpolicies/smaller-cmd")
        reset_node(api, CMD_NODE)
        api.delete(f"/api/v1/nodes/{CMD_NODE}")


# -- 3. the syncer's taint over a taint added meanwhile ----------------------------------

FOREIGN = {"key": "example.com/firmware-check", "value": "running", "effect": "NoSchedule"}


def test_a_taint_added_while_the_syncer_looks_away_survives_its_write(
    local_cluster: ClusterInfo, caplog: pytest.LogCaptureFixture
) -> None:
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    node = local_cluster.node_names[2]
    kube.reset_node(node)
    before = kube.node(node)["spec"].get("taints") or None
    kube.set_state(node, "production")
    syncer = RunningSyncer(local_cluster, SyncSettings(poll_interval_s=0.5, hold_taint=True))
    syncer.start()
    try:
        assert syncer.syncer is not None
        s = syncer.syncer
        wait_for("held taint", lambda: kn.slurm_taint_value(kube.node(node)) == kn.HELD, 10)
        syncer.passed(kube, node)

        async def stale_write() -> None:
            # The syncer's view, one version behind: the taint list before anyone's change.
            stale = copy.deepcopy(s.nodes[node])
            stale["spec"]["taints"] = [
                t for t in stale["spec"].get("taints", []) if t["key"] != well_known.TAINT_SLURM
            ]
            # Meanwhile someone else sets the list to theirs (ours gone, theirs in): the
            # watch has not delivered it yet when the syncer writes from its view.
            kube.patch_node(node, {"spec": {"taints": [FOREIGN]}})
            s.nodes[node] = stale
            await s._keep_taint(node)

        with caplog.at_level(logging.INFO, logger="gpufleet.slurm.syncer"):
            syncer.call(stale_write())
        taints = kube.node(node)["spec"].get("taints", [])
        keys = sorted(t["key"] for t in taints)
        assert keys == sorted([FOREIGN["key"], well_known.TAINT_SLURM]), taints
        assert any("changed before our taint was written" in r.message for r in caplog.records)
    finally:
        syncer.stop()
        slurm.undrain_all()
        kube.patch_node(node, {"spec": {"taints": before}})
        kube.reset_node(node)


# -- 2. (with the chart's admission policies from here on)


def test_an_agent_may_post_events_only_about_its_own_node(
    local_cluster: ClusterInfo, api: Api, chart: list[dict[str, Any]]
) -> None:
    own, other = local_cluster.node_names[:2]
    agent = Client(local_cluster, token=token_for(api, f"{FULL}-agent", pod_on=own))
    admin = Client(local_cluster)
    base = "/api/v1/namespaces/default/events"

    def about_other_refused() -> bool:
        r = agent.request("POST", base, _event(own, about=other))
        return r.status_code == 403 and "only about the Node it runs on" in r.text

    eventually(about_other_refused, "the agent-events admission policy")
    # Another node's name as its own reporting instance: refused too.
    r = agent.request("POST", base, _event(other, about=own))
    assert r.status_code == 403 and "only about the Node it runs on" in r.text, r.text
    # Its own node, as itself: what the agent posts.
    r = agent.request("POST", base, _event(own, about=own, msg=GENUINE))
    assert r.status_code == 201, r.text
    # Anyone else claiming to be the agent: refused, through either Events API.
    r = admin.request("POST", base, _event(own, about=own))
    assert r.status_code == 403 and "only the gpufleet agent may post" in r.text, r.text
    modern = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{own}.forged-modern", "namespace": "default"},
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": own},
        "type": "Warning",
        "reason": "Xid48",
        "note": FORGED,
        "action": "Observed",
        "reportingController": well_known.AGENT,
        "reportingInstance": own,
        "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
    }
    r = admin.request("POST", "/apis/events.k8s.io/v1/namespaces/default/events", modern)
    assert r.status_code == 403 and "only the gpufleet agent may post" in r.text, r.text
    # Every other Event is left alone (the policy matches only the agent's).
    r = admin.request("POST", base, _event(own, about=own, component="smaller-test"))
    assert r.status_code == 201, r.text


# -- 4. the syncer binds only what it is entitled to -------------------------------------


def _gpu_pod(name: str, namespace: str, priority_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "priorityClassName": priority_class,
            "containers": [
                {
                    "name": "infer",
                    "image": "example.invalid/inference:1",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }


def _unschedulable(api: Api, namespace: str, name: str) -> bool:
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return kn.pod_unschedulable(pod)


@pytest.fixture
def syncer_as_its_account(
    local_cluster: ClusterInfo, api: Api, chart: list[dict[str, Any]], logs: Path
) -> Iterator[tuple[RunningSyncer, Kube]]:
    """The real syncer with lending on, holding the chart syncer account's token."""
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    for n in local_cluster.node_names:
        kube.reset_node(n)
        kube.set_state(n, "production")
    for name, value in (("smaller-high", 2 * THRESHOLD), ("smaller-low", 10)):
        api.post(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"metadata": {"name": name}, "value": value},
            ok=(201, 409),
        )
    config = yaml.safe_load(local_cluster.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token_for(api, f"{FULL}-slurm-syncer")}
    kubeconfig = logs / "syncer-kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    syncer = RunningSyncer(
        local_cluster,
        SyncSettings(poll_interval_s=0.5, hold_taint=True, preempt_priority=THRESHOLD),
    )
    syncer.endpoints = dataclasses.replace(syncer.endpoints, kubeconfig=kubeconfig)
    syncer.start()
    try:
        yield syncer, kube
    finally:
        syncer.stop()
        for ns in (LEND_NS, "default"):
            api.http.delete(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": "smaller"})
        for name in ("smaller-high", "smaller-low"):
            api.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        slurm.cancel_all()
        slurm.undrain_all()
        for n in local_cluster.node_names:
            kube.reset_node(n)


def test_the_syncer_binds_only_the_pods_it_is_entitled_to(
    local_cluster: ClusterInfo, api: Api, syncer_as_its_account: tuple[RunningSyncer, Kube]
) -> None:
    syncer, kube = syncer_as_its_account
    assert syncer.syncer is not None
    s = syncer.syncer
    names = local_cluster.node_names
    wait_for(
        "held taints",
        lambda: all(kn.slurm_taint_value(kube.node(n)) == kn.HELD for n in names),
        15,
    )
    # (a) A high-priority GPU Pod in a namespace the chart did not name: the syncer's
    # account may not bind there, so no node is taken from Slurm for it.
    elsewhere = _gpu_pod("smaller-infer", "default", "smaller-high")
    elsewhere["metadata"]["labels"] = {"smaller": "yes"}
    api.post("/api/v1/namespaces/default/pods", elsewhere)
    wait_for("unschedulable", lambda: _unschedulable(api, "default", "smaller-infer"), 30)
    start = s.stats.passes
    wait_for("five syncer passes", lambda: s.stats.passes >= start + 5, 30)
    assert not any(kn.lent_to(kube.node(n)) for n in names)
    assert s.lender is not None and s.lender.stats.lent == 0

    # (b) A lock forged for a low-priority Pod of the lending namespace (someone with
    # patch on Nodes wrote the syncer's marks): the syncer drains the node for it, then
    # refuses to bind the Pod and gives the node back.
    low = _gpu_pod("smaller-batch", LEND_NS, "smaller-low")
    low["metadata"]["labels"] = {"smaller": "yes"}
    api.post(f"/api/v1/namespaces/{LEND_NS}/pods", low)
    wait_for("unschedulable", lambda: _unschedulable(api, LEND_NS, "smaller-batch"), 30)
    victim = names[1]
    node = kube.node(victim)
    taints = [t for t in node["spec"].get("taints", []) if t["key"] != well_known.TAINT_SLURM]
    taints.append({"key": well_known.TAINT_SLURM, "value": kn.LENT, "effect": "NoSchedule"})
    kube.patch(
        f"/api/v1/nodes/{victim}",
        {
            "metadata": {
                "annotations": {well_known.ANNOTATION_LENT_TO: f"{LEND_NS}/smaller-batch"}
            },
            "spec": {"taints": taints},
        },
        kind="merge-patch",
    )
    wait_for(
        "the forged lock refused and the node returned",
        lambda: (
            kn.lent_to(kube.node(victim)) is None
            and kn.slurm_taint_value(kube.node(victim)) == kn.HELD
        ),
        60,
    )
    pod = api.get(f"/api/v1/namespaces/{LEND_NS}/pods/smaller-batch")
    assert not pod["spec"].get("nodeName"), "the syncer bound a pod it was not entitled to"
    assert s.metrics.bind_refusals._value.get() >= 1

    # (c) The Pod it is entitled to, in the lending namespace: lent and bound, under the
    # chart's RBAC for the syncer's account.
    high = _gpu_pod("smaller-serve", LEND_NS, "smaller-high")
    high["metadata"]["labels"] = {"smaller": "yes"}
    api.post(f"/api/v1/namespaces/{LEND_NS}/pods", high)
    wait_for(
        "bound to a lent node",
        lambda: api.get(f"/api/v1/namespaces/{LEND_NS}/pods/smaller-serve")["spec"].get("nodeName"),
        90,
    )
    bound = api.get(f"/api/v1/namespaces/{LEND_NS}/pods/smaller-serve")["spec"]["nodeName"]
    assert kn.lent_to(kube.node(bound)) == f"{LEND_NS}/smaller-serve"
    assert not api.get("/api/v1/namespaces/default/pods/smaller-infer")["spec"].get("nodeName")


def _binding_rules(*values: str) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every role of the release that grants pods/binding."""
    docs = render(NS, REL, *(x for v in values for x in ("--set", v)))
    return sorted(
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        and any("pods/binding" in r.get("resources", []) for r in d.get("rules", []))
    )


def test_the_chart_grants_pods_binding_only_where_lending_may_bind() -> None:
    assert _binding_rules() == [("ClusterRole", "", f"{FULL}-slurm-syncer")]
    assert _binding_rules("syncer.lendNamespaces={a,b}") == [
        ("Role", "a", f"{FULL}-slurm-lending"),
        ("Role", "b", f"{FULL}-slurm-lending"),
    ]
    assert _binding_rules("syncer.preemptPriority=null") == []
    assert _binding_rules("syncer.preemptPriority=null", "syncer.lendNamespaces={a}") == []
