"""The syncer against real Slurm 24.11 daemons (slurmrestd v0.0.40-v0.0.42).

A cluster of its own (2 KWOK nodes, Slurm 24.11 from the Debian 13 root that
``scripts/bootstrap-system.sh`` builds with ``gpufleet local slurm-image build``):
the syncer negotiates v0.0.42, drains through ``POST /slurm/v0.0.42/node/{name}``
on our cordon and on a fault (requeueing the running job with the 24.11 scontrol),
and resumes through the API. Slurm's side is read with ``sinfo`` / ``squeue`` text
output, not through the decoder under test. The SlurmCluster operator's block topology,
rendered from the Nodes' labels, is read by this slurmctld (``scontrol show topology``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from slurm_support import Kube, RunningSyncer, wait_for
from test_slurm_chart import CHART, helm_binary

from gpufleet.domain import well_known
from gpufleet.domain.records import NodeRecord, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

NODE = "gpu-node-0000"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    spec = ClusterSpec(nodes=2, redfish=False, slurm_version="24.11")
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        yield info
    assert not processes.processes_using(info.run_dir)


def run(info: ClusterInfo, *args: str) -> str:
    r = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    return r.stdout.strip()


def node_state(info: ClusterInfo, node: str) -> tuple[str, str]:
    """(long state, reason) as ``sinfo`` prints them: ``drained``, ``draining``, ``idle``..."""
    out = run(info, "sinfo", "-h", "-N", "-n", node, "-p", "batch", "-o", "%T|%E")
    state, _, reason = out.partition("|")
    return state, reason


def drained(info: ClusterInfo, node: str) -> str | None:
    state, reason = node_state(info, node)
    return reason if state.startswith(("drain", "draining")) else None


def restarts(info: ClusterInfo, job: int) -> int:
    out = run(info, "scontrol", "show", "job", str(job))
    return int(out.split("Restarts=", 1)[1].split()[0])


def test_the_release_and_its_api(cluster: ClusterInfo) -> None:
    assert cluster.slurm_version == "24.11" and cluster.slurm_api_version == "v0.0.42"
    assert run(cluster, "sinfo", "-V").startswith("slurm-wlm 24.11")


def test_syncer_drains_requeues_and_resumes_through_the_api(cluster: ClusterInfo) -> None:
    kube = Kube(cluster)
    for n in cluster.node_names:
        kube.set_state(n, "production")
    syncer = RunningSyncer(cluster, SyncSettings(poll_interval_s=0.5, hold_taint=False))
    syncer.start()
    try:
        assert syncer.rest is not None and syncer.writes is not None
        assert syncer.rest.version == "v0.0.42" and syncer.writes.by_rest

        # Our cordon: drained with our reason, returned when uncordoned.
        kube.patch_node(NODE, {"spec": {"unschedulable": True}})
        wait_for("cordon drain", lambda: drained(cluster, NODE) == "gpufleet: cordoned", 10)
        kube.patch_node(NODE, {"spec": {"unschedulable": None}})
        wait_for("resume", lambda: drained(cluster, NODE) is None, 10)

        # A fault under a running requeueable job: drain, then the job is requeued.
        job = int(
            run(
                cluster, "sbatch", "--parsable", "--requeue", "-w", NODE, "--gres=gpu:8",
                "--wrap", "sleep 600",
            )
        )  # fmt: skip
        wait_for(
            "job running",
            lambda: run(cluster, "squeue", "-h", "-j", str(job), "-o", "%T") == "RUNNING",
            20,
        )
        kube.set_condition(NODE, "GpuProblem", "True", "Xid79")
        wait_for("fault drain", lambda: drained(cluster, NODE) == "gpufleet: GpuProblem Xid79", 10)
        wait_for("requeue", lambda: restarts(cluster, job) >= 1, 20)
        # By the syncer: its count goes up once scontrol's answer is back, a moment after
        # slurmctld shows the restart.
        stats = syncer.syncer.stats if syncer.syncer is not None else None
        assert stats is not None
        wait_for("the syncer's requeue counted", lambda: stats.requeues >= 1, 10)
        kube.set_condition(NODE, "GpuProblem", "False", "Healthy")
        wait_for("resume after the fault", lambda: drained(cluster, NODE) is None, 10)
        wait_for(
            "the syncer's drains and resumes counted",
            lambda: stats.drains >= 2 and stats.resumes >= 2,
            10,
        )
        run(cluster, "scancel", str(job))
    finally:
        syncer.stop()
    assert syncer.syncer is not None
    assert syncer.syncer.stats.drains >= 2 and syncer.syncer.stats.resumes >= 2


def test_maintenance_reservations_through_the_24_11_scontrol(cluster: ClusterInfo) -> None:
    """What the syncer's maintenance reservations do (gpufleet.slurm.reservations), with
    24.11's scontrol: create from a future start, read back, shrink, move, delete."""
    import asyncio
    import time

    from gpufleet.domain.maintenance import Reservation
    from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig

    scontrol = Scontrol(
        ScontrolConfig(
            scontrol=str(cluster.slurm_bin_dir / "scontrol"),
            env={"SLURM_CONF": str(cluster.slurm_conf)},
        )
    )
    start = float(int(time.time()) + 7200)
    both = frozenset(cluster.node_names[:2])
    name = "gpufleet-maint-v2411"

    async def go() -> list[list[Reservation]]:
        seen = []
        await scontrol.create_reservation(Reservation(name, start, both))
        seen.append(await scontrol.reservations())
        raw = run(cluster, "scontrol", "-o", "show", "reservation", name)
        assert "Flags=MAINT,IGNORE_JOBS" in raw or ("MAINT" in raw and "IGNORE_JOBS" in raw)
        one = Reservation(name, start + 600, frozenset(cluster.node_names[:1]))
        await scontrol.update_reservation(one, move_start=True)
        seen.append(await scontrol.reservations())
        await scontrol.delete_reservation(name)
        seen.append(await scontrol.reservations())
        return seen

    created, updated, deleted = asyncio.run(go())
    assert [r for r in created if r.name == name] == [Reservation(name, start, both)]
    assert [r for r in updated if r.name == name] == [
        Reservation(name, start + 600, frozenset(cluster.node_names[:1]))
    ]
    assert not [r for r in deleted if r.name == name]


def test_cleanup_lifts_our_drain_on_a_released_node_only(cluster: ClusterInfo) -> None:
    """``gpufleet cleanup --slurmrestd-url`` (the chart's uninstall hook): gpufleet's drain on a
    Node it releases is lifted through the API; its drain on a Node it keeps (held for a
    fault), and a person's drain, stay."""
    import json
    import sys

    kube = Kube(cluster)
    released, held = cluster.node_names[:2]
    kube.set_state(released, "production")
    kube.set_state(held, "remediating")
    remediating = NodeRecord.new(held, at=1.0, state=NodeState.REMEDIATING, reason="Xid79")
    record = record_to_json(remediating)
    kube.patch_node(held, {"metadata": {"annotations": {well_known.ANNOTATION_RECORD: record}}})
    run(
        cluster,
        "scontrol",
        "update",
        f"nodename={released}",
        "state=drain",
        "reason=gpufleet: cordoned",
    )
    run(
        cluster,
        "scontrol",
        "update",
        f"nodename={held}",
        "state=drain",
        "reason=gpufleet: GpuProblem Xid79",
    )
    token = cluster.run_dir / "cleanup-token"
    token.write_text(cluster.slurm_jwt or "")
    try:
        r = subprocess.run(
            [
                sys.executable, "-m", "gpufleet.cli.main", "cleanup",
                "--kubeconfig", str(cluster.kubeconfig),
                "--slurmrestd-url", str(cluster.slurmrestd_url), "--token-file", str(token),
                "-o", "json",
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["slurmUndrained"] == [released]
        assert report["slurmKept"] == {held: "state remediating"}
        assert drained(cluster, released) is None
        assert drained(cluster, held) == "gpufleet: GpuProblem Xid79"
        # A person's drain is never ours to lift, on any node.
        run(cluster, "scontrol", "update", f"nodename={released}", "state=drain", "reason=bad dimm")
        again = subprocess.run(
            [
                sys.executable, "-m", "gpufleet.cli.main", "cleanup",
                "--kubeconfig", str(cluster.kubeconfig),
                "--slurmrestd-url", str(cluster.slurmrestd_url), "--token-file", str(token),
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert drained(cluster, released) == "bad dimm"
    finally:
        for node in (released, held):
            subprocess.run(  # fails on a node that is not drained: fine
                ["scontrol", "update", f"nodename={node}", "state=resume"],
                env=cluster.slurm_env(), capture_output=True, timeout=30,
            )  # fmt: skip
            kube.set_state(node, None)
        kube.patch_node(held, {"metadata": {"annotations": {well_known.ANNOTATION_RECORD: None}}})


def chart_scripts() -> tuple[str, str]:
    """The chart's slurmctld pod as helm renders it: its slurmctld container's start (the
    hash of the files it reads) and its reconfigure container's loop."""
    helm = helm_binary()
    assert helm, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    out = subprocess.run(
        [helm, "template", "t", str(CHART), "--show-only", "templates/slurmctld.yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    (sts,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "StatefulSet"]
    by_name = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}
    start, loop = by_name["slurmctld"]["command"][2], by_name["reconfigure"]["command"][2]
    assert start.rstrip().endswith("exec slurmctld -D"), start
    # The whole script parses: the shell reads a compound command only when it reaches it,
    # so text after the endless loop would never be checked by running it.
    for script in (start, loop):
        parsed = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
        assert parsed.returncode == 0, parsed.stderr
    return start.rstrip().removesuffix("exec slurmctld -D"), loop


def boot_time(info: ClusterInfo) -> str:
    return run(info, "scontrol", "show", "config").split("BOOT_TIME", 1)[1].split()[1]


def test_the_charts_slurmctld_reloads_when_its_files_change(
    cluster: ClusterInfo, tmp_path: Path
) -> None:
    """The chart's reconfigure container (its script as rendered, on this host's 24.11
    slurmctld and its config directory): nothing while the files are those slurmctld
    started with; a partition added to slurm.conf (the operator's new ConfigMap reaching
    the pod's volume) is reconfigured once, slurmctld restarts with it (24.11) and the
    new hash is recorded."""
    assert cluster.slurm_conf is not None
    conf = cluster.slurm_conf
    original = conf.read_text()
    env = {**cluster.slurm_env(), "CONF_DIR": str(conf.parent), "RUN_DIR": str(tmp_path),
           "INTERVAL": "1"}  # fmt: skip
    start, loop = chart_scripts()
    subprocess.run(["sh", "-c", start], env=env, check=True, timeout=30)
    started_with = (tmp_path / "config.sha256").read_text()
    log = (tmp_path / "reconfigure.log").open("w")
    watcher = subprocess.Popen(["sh", "-c", loop], env=env, stdout=log, stderr=log,
                               start_new_session=True)  # fmt: skip
    try:
        booted = boot_time(cluster)
        wait_for("a few turns of its loop", lambda: (tmp_path / "reconfigure.alive").exists(), 30)
        time.sleep(3)
        assert boot_time(cluster) == booted, "reconfigured with nothing changed"
        conf.write_text(original + "PartitionName=late Nodes=ALL Default=NO\n")
        wait_for(
            "partition late in slurmctld",
            lambda: subprocess.run(
                ["scontrol", "show", "partition", "late"], env=cluster.slurm_env(),
                capture_output=True, timeout=30,
            ).returncode == 0,
            90,
        )  # fmt: skip
        assert boot_time(cluster) != booted, "24.11 restarts slurmctld on a reconfigure"
        wait_for(
            "the new hash recorded",
            lambda: (tmp_path / "config.sha256").read_text() != started_with,
            30,
        )
        time.sleep(3)
        assert (tmp_path / "reconfigure.log").read_text().count("scontrol reconfigure") == 1
    finally:
        os.killpg(watcher.pid, signal.SIGTERM)
        watcher.wait(timeout=30)
        log.close()
        conf.write_text(original)
        run(cluster, "scontrol", "reconfigure")
        wait_for(
            "slurmctld back without partition late",
            lambda: (
                subprocess.run(
                    ["scontrol", "ping"], env=cluster.slurm_env(), capture_output=True, timeout=30
                ).returncode
                == 0
            ),
            60,
        )


UUID_A = "5d2c8a41-7b3e-4f19-a6d0-2e8b9c1f4a70"
UUID_B = "c81e0f3a-92d4-4b6c-8e15-7a3f0d2b6c94"
LEAF_KEY = "network.topology.kubernetes.io/block"


def test_block_topology_from_node_labels_is_read_by_slurmctld(
    cluster: ClusterInfo, tmp_path: Path
) -> None:
    """Fabric topology as data (gpufleet.domain.topology) through the SlurmCluster operator
    to 24.11's topology/block and to the scheduler labels: each KWOK Node carries the
    NVLink clique its agent reports, the operator renders ``BlockName=`` lines from the
    Nodes the apiserver returns, slurmctld restarts with ``TopologyPlugin=topology/block``
    and ``scontrol show topology`` shows one block per NVLink domain. Then a Topograph
    label that names another domain than the node's GPUs see: a Warning Event on that
    Node, ``TopologyConsistent=False``, and the node is left out of the blocks and of the
    NVLink domain label (nothing else on the Node changes). A node that moves to another
    leaf switch is labelled there on the next pass."""
    import asyncio

    from test_slurm_operator import research_cluster

    from gpufleet.kubeapi import KubeApi
    from gpufleet.slurm.operator import ClusterOperator, OperatorSettings

    assert cluster.slurm_conf is not None
    kube = Kube(cluster)
    ns = "topology-test"
    n0, n1 = cluster.node_names[:2]
    agent = {  # what each node's agent publishes (NVML's fabric info, decision 0093)
        node: {well_known.LABEL_NVLINK_CLUSTER: uuid, well_known.LABEL_NVLINK_CLIQUE: f"{uuid}.1"}
        for node, uuid in ((n0, UUID_A), (n1, UUID_B))
    }
    lie = "network.topology.nvidia.com/accelerator"
    sched_keys = [f"gpufleet.io/topology-{k}" for k in ("spine", "leaf", "block", "nvlink-domain")]
    conf = cluster.slurm_conf
    original = conf.read_text()
    topology_conf = conf.parent / "topology.conf"
    leaf0 = kube.node(n0)["metadata"]["labels"][LEAF_KEY]
    base = research_cluster(cluster, kube, ns)

    async def reconcile() -> dict:
        api = await KubeApi.connect(str(cluster.kubeconfig))
        settings = OperatorSettings(conf_dir=tmp_path, reconfigure=False)
        operator = ClusterOperator(kube=api, scontrol=None, rest=None, settings=settings)
        return await operator.reconcile(ns, "research") or {}

    def condition(status: dict, ctype: str) -> dict:
        return next(c for c in status["conditions"] if c["type"] == ctype)

    try:
        for node, labels in agent.items():
            kube.patch_node(node, {"metadata": {"labels": labels}})
        kube.patch(
            f"{base}/research",
            {"spec": {"topology": {"plugin": "block", "schedulerLabels": {"enabled": True}}}},
            kind="merge-patch",
        )
        status = asyncio.run(reconcile())
        assert condition(status, "TopologyConsistent")["status"] == "True", status
        rendered = (tmp_path / "topology.conf").read_text()
        assert f"BlockName={UUID_A}.1 Nodes={n0}" in rendered, rendered
        assert "TopologyPlugin=topology/block" in (tmp_path / "slurm.conf").read_text()
        labels = kube.node(n0)["metadata"]["labels"]
        assert labels["gpufleet.io/topology-nvlink-domain"] == f"{UUID_A}.1"
        assert labels["gpufleet.io/topology-leaf"].startswith("ib-leaf-")

        # slurmctld reads the rendered blocks (the local cluster's own slurm.conf, plus the
        # plugin line the operator renders).
        topology_conf.write_text(rendered)
        conf.write_text(original + "TopologyPlugin=topology/block\n")
        run(cluster, "scontrol", "reconfigure")

        def blocks() -> str:
            r = subprocess.run(
                ["scontrol", "show", "topology"], env=cluster.slurm_env(),
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            return r.stdout if r.returncode == 0 else ""

        wait_for("slurmctld shows the blocks", lambda: "BlockName=" in blocks(), 60)
        shown = {line.split()[0]: line for line in blocks().splitlines() if line.strip()}
        assert f"Nodes={n0}" in shown[f"BlockName={UUID_A}.1"], shown
        assert f"Nodes={n1}" in shown[f"BlockName={UUID_B}.1"], shown

        # A label that lies about what n1's GPUs see: reported, left out, never acted on.
        before = kube.node(n1)["spec"]
        kube.patch_node(n1, {"metadata": {"labels": {lie: UUID_A}}})
        status = asyncio.run(reconcile())
        consistent = condition(status, "TopologyConsistent")
        assert consistent["status"] == "False" and n1 in consistent["message"], consistent
        cm = kube.get(f"/api/v1/namespaces/{ns}/configmaps/research-slurm-config")
        assert n1 not in cm["data"]["topology.conf"], cm["data"]["topology.conf"]
        node = kube.node(n1)
        assert "gpufleet.io/topology-nvlink-domain" not in node["metadata"]["labels"]
        assert node["metadata"]["labels"]["gpufleet.io/topology-leaf"].startswith("ib-leaf-")
        assert node["spec"] == before  # no cordon, no taint
        events = kube.get(
            "/api/v1/namespaces/default/events?fieldSelector="
            f"involvedObject.name={n1},reason=TopologyContradiction"
        )["items"]
        assert [e["type"] for e in events] == ["Warning"], events
        assert UUID_A in events[0]["message"] and f"{UUID_B}.1" in events[0]["message"]

        # n0 moves to another leaf switch: the next pass labels it there.
        kube.patch_node(n0, {"metadata": {"labels": {LEAF_KEY: "ib-leaf-moved"}}})
        asyncio.run(reconcile())
        assert kube.node(n0)["metadata"]["labels"]["gpufleet.io/topology-leaf"] == "ib-leaf-moved"
    finally:
        restore_slurm_conf(cluster, original, topology_conf)
        kube.http.delete(f"/api/v1/namespaces/{ns}")
        kube.patch_node(n0, {"metadata": {"labels": {LEAF_KEY: leaf0}}})
        drop_topology_labels(kube, (n0, n1), [*agent[n0], lie, *sched_keys])


def restore_slurm_conf(info: ClusterInfo, original: str, topology_conf: Path) -> None:
    """slurm.conf as it was and no topology.conf; slurmctld reconfigured and answering."""
    assert info.slurm_conf is not None
    info.slurm_conf.write_text(original)
    topology_conf.unlink(missing_ok=True)
    run(info, "scontrol", "reconfigure")
    wait_for(
        "slurmctld back without the topology",
        lambda: subprocess.run(
            ["scontrol", "ping"], env=info.slurm_env(), capture_output=True, timeout=30
        ).returncode == 0,
        60,
    )  # fmt: skip


def drop_topology_labels(kube: Kube, nodes: tuple[str, ...], keys: list[str]) -> None:
    """Remove ``keys``, the SlurmCluster label and the operator's list of what it wrote."""
    for node in nodes:
        labels = dict.fromkeys([*keys, well_known.LABEL_SLURM_CLUSTER])
        annotations = {well_known.ANNOTATION_TOPOLOGY_LABELS: None}
        kube.patch_node(node, {"metadata": {"labels": labels, "annotations": annotations}})


GUID_A, GUID_B, GUID_C = "0xfc6a1c0300e7a900", "0xfc6a1c0300e7b100", "0xfc6a1c0300e7c200"


def test_a_node_that_moves_or_is_replaced_moves_in_slurm_and_in_the_labels(
    cluster: ClusterInfo, tmp_path: Path
) -> None:
    """The InfiniBand leaf each node sees itself, end to end (decisions 0249, 0250): one
    agent per KWOK Node on the simulated backend, whose HCAs answer smpquery's
    directed-route queries from a configured switch, publishes the switch its rail 0 is
    cabled to; the SlurmCluster operator renders the tree from it, slurmctld 24.11 reads
    it (``scontrol show topology``), and the scheduler labels follow. Then n0 is
    recabled to another leaf (its operator label, which still names the old one, is
    reported and not taken), and n1 is replaced by hardware cabled to a switch without a
    name (its agent removes the name label it wrote). Each time Slurm's tree and the
    scheduler labels move with the node; labels gpufleet did not write stay as they are."""
    import asyncio

    from test_slurm_operator import research_cluster
    from waiting import wait_for_async

    from gpufleet.domain import hostlist
    from gpufleet.domain.policy import default_policy
    from gpufleet.health.agent import Agent, AgentSettings
    from gpufleet.health.backend_sim import SimulatedHardware
    from gpufleet.health.kube_report import KubeReporter
    from gpufleet.health.skus import bundled
    from gpufleet.kubeapi import KubeApi
    from gpufleet.slurm.operator import ClusterOperator, OperatorSettings

    assert cluster.slurm_conf is not None
    kube = Kube(cluster)
    ns = "topology-leaf"
    n0, n1 = cluster.node_names[:2]
    conf = cluster.slurm_conf
    original = conf.read_text()
    topology_conf = conf.parent / "topology.conf"
    leaf_label = kube.node(n0)["metadata"]["labels"][LEAF_KEY]  # the operator's, ib-leaf-000
    assert kube.node(n1)["metadata"]["labels"][LEAF_KEY] == leaf_label
    sched_leaf = "gpufleet.io/topology-leaf"
    sched_keys = [f"gpufleet.io/topology-{k}" for k in ("spine", "leaf", "block", "nvlink-domain")]
    base = research_cluster(cluster, kube, ns)
    kube.patch(
        f"{base}/research",
        {"spec": {"topology": {"plugin": "tree", "schedulerLabels": {"enabled": True}}}},
        kind="merge-patch",
    )
    settings = AgentSettings(interval_s=0.2, ib_rediscover_s=0.5)

    def agent(hw: SimulatedHardware) -> Agent:
        reporter = KubeReporter(hw.node, kubeconfig=str(cluster.kubeconfig))
        profile, policy = bundled().get("h100-sxm"), default_policy()
        return Agent(hw, profile, policy, node=hw.node, reporter=reporter, settings=settings)

    def labels(node: str) -> dict[str, str]:
        return dict(kube.node(node)["metadata"].get("labels") or {})

    def shown() -> dict[str, list[str]]:
        """``scontrol show topology``: leaf switch -> its nodes, as slurmctld has them."""
        r = subprocess.run(
            ["scontrol", "show", "topology"], env=cluster.slurm_env(),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        out: dict[str, list[str]] = {}
        for line in r.stdout.splitlines() if r.returncode == 0 else []:
            words = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if "SwitchName" in words and words.get("Level") == "0" and words.get("Nodes"):
                out[words["SwitchName"]] = hostlist.expand(words["Nodes"])
        return out

    hws = {
        n0: SimulatedHardware(node=n0, ib_leaf=GUID_A, ib_leaf_name=leaf_label),
        n1: SimulatedHardware(node=n1, ib_leaf=GUID_A, ib_leaf_name=leaf_label),
    }

    async def scenario() -> None:
        api = await KubeApi.connect(str(cluster.kubeconfig))
        operator = ClusterOperator(
            kube=api, scontrol=None, rest=None,
            settings=OperatorSettings(conf_dir=tmp_path, reconfigure=False),
        )  # fmt: skip
        stops = {n: asyncio.Event() for n in hws}
        tasks = {n: asyncio.create_task(agent(hw).run(stops[n])) for n, hw in hws.items()}

        async def slurm_reads(want: dict[str, list[str]]) -> dict:
            """One operator pass; slurmctld reconfigured with the tree it rendered."""
            status = await operator.reconcile(ns, "research") or {}
            topology_conf.write_text((tmp_path / "topology.conf").read_text())
            conf.write_text(original + "TopologyPlugin=topology/tree\n")
            run(cluster, "scontrol", "reconfigure")
            await wait_for_async(f"slurmctld shows {want}", lambda: shown() == want, 60)
            return status

        def consistent(status: dict) -> dict:
            return next(c for c in status["conditions"] if c["type"] == "TopologyConsistent")

        try:
            for n in hws:
                await wait_for_async(
                    f"{n}'s leaf",
                    lambda n=n: labels(n).get(well_known.LABEL_IB_SEEN_LEAF) == GUID_A,
                    15,
                )
            assert labels(n0)[well_known.LABEL_IB_SEEN_LEAF_NAME] == leaf_label
            status = await slurm_reads({GUID_A: [n0, n1]})
            assert consistent(status)["status"] == "True", status  # the label names the switch
            assert labels(n0)[sched_leaf] == GUID_A and labels(n1)[sched_leaf] == GUID_A

            # n0 is recabled to leaf B; its operator label still says the old leaf.
            hws[n0].cable_to(GUID_B, "ib-leaf-moved")
            await wait_for_async(
                "n0's new leaf", lambda: labels(n0).get(well_known.LABEL_IB_SEEN_LEAF) == GUID_B, 15
            )
            status = await slurm_reads({GUID_A: [n1], GUID_B: [n0]})
            lie = consistent(status)
            assert lie["status"] == "False" and n0 in lie["message"], lie
            assert leaf_label in lie["message"] and GUID_B in lie["message"]
            now0 = labels(n0)
            assert now0[sched_leaf] == GUID_B and now0[LEAF_KEY] == leaf_label  # not ours
            assert now0[well_known.LABEL_IB_SEEN_LEAF_NAME] == "ib-leaf-moved"

            # n1's hardware is replaced (new HCAs) and cabled to a switch with no name.
            stops[n1].set()
            await tasks.pop(n1)
            hws[n1].close()
            hws[n1] = SimulatedHardware(node=n1, ib_leaf=GUID_C, hardware_serial=1)
            stops[n1] = asyncio.Event()
            tasks[n1] = asyncio.create_task(agent(hws[n1]).run(stops[n1]))
            await wait_for_async(
                "n1's new leaf", lambda: labels(n1).get(well_known.LABEL_IB_SEEN_LEAF) == GUID_C, 15
            )
            assert well_known.LABEL_IB_SEEN_LEAF_NAME not in labels(n1)  # the old name removed
            await slurm_reads({GUID_B: [n0], GUID_C: [n1]})
            assert labels(n1)[sched_leaf] == GUID_C
            assert labels(n1)[LEAF_KEY] == leaf_label  # the operator's label, untouched
        finally:
            for n, task in tasks.items():
                stops[n].set()
                await task

    try:
        asyncio.run(scenario())
    finally:
        for hw in hws.values():
            hw.close()
        restore_slurm_conf(cluster, original, topology_conf)
        kube.http.delete(f"/api/v1/namespaces/{ns}")
        gone = [well_known.LABEL_IB_SEEN_LEAF, well_known.LABEL_IB_SEEN_LEAF_NAME, *sched_keys]
        drop_topology_labels(kube, (n0, n1), gone)
