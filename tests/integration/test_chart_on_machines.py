"""The Helm chart installed for real, as an operator does, on two real nodes.

The local cluster builds this checkout's images (gpufleet, Slurm 24.11) and serves them
from its registry. ``vm-node-0000``, a GPU node (pool ``machines``, simulated GPUs), is a
qemu machine that network-boots and joins with kubeadm; ``host-node-0000``, the system
node (pool ``system``), is the node image's kubelet, containerd and kube-proxy run
natively on the host in namespaces of their own, on the same fabric, joined by TLS
bootstrap with a bootstrap token (:mod:`gpufleet.local.host_node`, decision 0138: under
software emulation on two cores a system node took over 30 minutes to start the
Slurm control plane). ``helm install`` then runs the controller (2 replicas, kopf
peering) on the system node and the agent DaemonSet on the GPU node; each node's
containerd pulls the images from the registry. The test checks what an operator relies on:

- every pod Ready behind its probes, the images pulled from the registry;
- one controller acting: both replicas announce themselves on the ClusterKopfPeering
  with different priorities (kopf pauses all but the highest);
- Day 0: the GPU machine, powered on through its BMC, network-boots and joins with a
  single-use token (a real kubelet registers each; the used token is refused by the
  apiserver and by a second real ``kubeadm join``, an expired one too); the controller in
  its pod takes the GPU node through burn-in (run by the agent in its pod) to production,
  and leaves the system node, where it runs, alone;
- pods get addresses of their node's pod subnet and reach each other across the nodes
  by Service name, and the API through the ``kubernetes`` Service;
- the pod scheduler (two replicas, one holding its Lease): a Pod for ``gpufleet-slurm``
  waits in Slurm's queue, runs on the GPU machine where Slurm ran its job, and is accounted
  by slurmdbd under its name;
- an XID 79 on the GPU node, reported by the agent's pod: cordon, drain, a power cycle
  through the BMC, a network boot with a new single-use join token, the images pulled
  again, verification, production;
- ``helm upgrade`` rolls the controller: new pods, nothing done twice to the node; the
  Slurm partition it adds reaches slurmctld (its pod reloads when its ConfigMap volume
  changes);
- ``helm uninstall`` removes every object of the release, and its pre-delete hook first
  takes gpufleet's labels, annotations, taints, conditions and cordon off the GPU node.

Slurm 24.11 runs in pods too (slurmctld, slurmrestd, login and the syncer on the system
machine, slurmd on the GPU machine), all Ready behind their probes (slurmctld's is
``scontrol ping``: munge, its name in cluster DNS and its state volume work); the XID 79 is
drained in Slurm by the syncer's pod before the reimage and the drain lifted after. A user
of slurm.users runs a step and a batch job there (as that user, in cgroups), and the batch
job, a training job checkpointing as it runs, is requeued when the XID 79 comes and
resumes from its checkpoint after the reimage. Slurm accounting is on: the chart's
slurmdbd (a pod on the system node) keeps the jobs in the local cluster's MariaDB (on
the host, reached at qemu's 10.0.2.100), and ``sacct`` shows alice's step completed on the
GPU machine and her training job's run the XID 79 interrupted as requeued there. Bounded
waits only; nothing timed is asserted (bench/machine_boot.py measures a boot).

One cluster of machines serves the whole module (a boot under software emulation is
minutes): its tests run in order, each on what the ones before it left, and after a
failure the rest fail at once (the ``steps`` marker).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from controller_harness import (
    GV,
    Api,
    bmc_counters,
    issue_join_token,
    put_policy,
    self_subject_review,
)
from machines_harness import (
    BOOT_TIMEOUT,
    POLICY,
    TokenWatch,
    assert_reached_by_name,
    assert_refused_at_discovery,
    machine_policy,
    node_ready,
    pod_story,
    signed_for,
    state,
    wait_for,
    watch_consoles,
)
from test_slurm_chart import CHART, helm_binary

from gpufleet.domain import emptiness, uninstall, well_known
from gpufleet.local import host_node, kube, machines, processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.machines,
    pytest.mark.steps,
    pytest.mark.timeout(3600),
]

SYSTEM, GPU = host_node.NAME, "vm-node-0000"
NS = "gpufleet"
RELEASE = "gpufleet"
INJECT_PORT = 9401
"""The agent pod's fault-injection API (a hostPort on the GPU node, forwarded by qemu)."""
POD_TIMEOUT = 900.0
"""Pull (about 400 MB into a machine's RAM) and a Python start under software emulation on
2 shared cores: minutes. Generous: a slow run must not fail, only a broken one."""


INSTALL_TIMEOUT = 1800.0
"""From ``helm install`` to the first pods of this checkout's image Ready on the system
machine. Measured there: the gpufleet image (401 MB) pulled in 9 min 53 s while the
machine started seven pods at once (5 min 55 s on the GPU machine, which starts one), then
a Python start. Generous, as POD_TIMEOUT."""


SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "512Mi"}}
"""Slurm's pods share 2 host cores with an emulated machine: small requests, or they do not fit."""


def slurm_values() -> dict[str, Any]:
    """Slurm 24.11 in pods: slurmctld (its state on the system node's volume), slurmrestd,
    a login pod and the syncer on the system node; slurmd on the GPU machine, one CPU and
    no GPU gres (the machine's GPUs are simulated: there is no /dev/nvidia* to bind)."""
    system = {well_known.LABEL_POOL: "system"}
    return {
        "enabled": True,
        "nodePools": [
            {
                "name": "gpu",
                "nodeSelector": {well_known.LABEL_POOL: POLICY},
                "cpus": 1,
                "realMemoryMib": 1024,
                "gpus": 0,
                "featureLabels": [],
            }
        ],
        "partitions": [
            {"name": "batch", "pools": ["gpu"], "default": True, "preemptMode": "REQUEUE"}
        ],
        "topology": {"enabled": False},
        "controller": {"resources": SMALL, "nodeSelector": system},
        "slurmd": {"resources": SMALL},
        "restd": {"resources": SMALL, "nodeSelector": system},
        "login": {"replicas": 1, "resources": SMALL, "nodeSelector": system},
        "munge": {"resources": SMALL},
        "users": [{"name": "alice", "uid": 20001, "authorizedKeys": [ALICE_KEY]}],
    }


DB_SECRET = "slurmdbd-db"
"""The Secret the operator creates before installing: the database password slurmdbd uses."""


def accounting_values(info: ClusterInfo) -> dict[str, Any]:
    """``slurm.accounting``: slurmdbd in a pod on the system node, against the local
    cluster's MariaDB as the machines reach it (an existing database, as at a site)."""
    db = info.accounting_db
    assert db is not None, "the cluster runs with slurm_accounting"
    return {
        "enabled": True,
        "storageHost": db.machines_host,
        "storagePort": db.port,
        "storageUser": db.user,
        "passwordSecret": DB_SECRET,
        "resources": SMALL,
        "nodeSelector": {well_known.LABEL_POOL: "system"},
    }


def create_db_secret(info: ClusterInfo, api: Api) -> None:
    """What docs/install.md has an operator do before ``helm install``: the release's
    namespace and the database password's Secret in it."""
    db = info.accounting_db
    assert db is not None
    api.post("/api/v1/namespaces", {"metadata": {"name": NS}})
    password = Path(db.password_file).read_text().strip()
    api.post(
        f"/api/v1/namespaces/{NS}/secrets",
        {"metadata": {"name": DB_SECRET}, "stringData": {"password": password}},
    )


ALICE_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHMjyz0TyoGEbvQc3HvBWXXanMlKtgFJ8V2/G7oUeWHs alice@lab"
)
"""A public key in slurm.users: the login pod's sshd and accounts init containers run with it."""


def values(info: ClusterInfo, **extra: Any) -> dict[str, Any]:
    """The chart's values for this cluster: its images, the BMC Secrets' namespace of the
    local cluster, the controller on the system node managing the GPU pool only, Slurm."""
    gpufleet_repo, gpufleet_tag = info.images["gpufleet"].rsplit(":", 1)
    slurm_repo, slurm_tag = info.images["slurm"].rsplit(":", 1)
    pool = {well_known.LABEL_POOL: POLICY}
    system = {well_known.LABEL_POOL: "system"}
    return {
        "image": {"repository": gpufleet_repo, "tag": gpufleet_tag},
        "slurmImage": {"repository": slurm_repo, "tag": slurm_tag},
        "bmcSecretsNamespace": "gpufleet-system",
        "createBmcSecretsNamespace": False,
        "slurm": {**slurm_values(), "accounting": accounting_values(info)},
        # A pod start on the emulated system node takes minutes: the uninstall hook's
        # Job gets time for that and for the controllers' pods to go.
        "cleanupOnUninstall": {"timeoutSeconds": 1200, "stopTimeoutSeconds": 600},
        # Two host cores run both machines under emulation, where a Python poll costs 20-40
        # times its native CPU: the agent's (1.4 % of a core natively at 1 s) and the
        # syncer's passes every 5 s leave the system node the core it needs.
        "syncer": {
            "enabled": True,
            "pollInterval": 5.0,
            "nodeSelector": system,
            "resources": SMALL,
            "operatorResources": SMALL,
        },
        "controller": {
            "policyName": POLICY,
            "managedNodes": {**pool, "nvidia.com/gpu.present": None},
            "nodeSelector": {well_known.LABEL_POOL: "system"},
            # The BMCs listen on the host's loopback; a pod on a machine reaches the host
            # at qemu's 10.0.2.100.
            "bmcAddressMap": {"127.0.0.1": "10.0.2.100"},
            **extra,
        },
        "agent": {
            "backend": "simulated",
            "pollInterval": 5.0,
            "injectPort": INJECT_PORT,
            "nodeSelector": {**pool, "nvidia.com/gpu.present": None},
        },
        # Slurm schedules pods too (docs/pod-scheduler.md): two replicas, one acting, on the
        # system node; a pass every 5 s for the same reason as the syncer's.
        "podScheduler": {
            "enabled": True,
            "interval": 5.0,
            "nodeSelector": system,
            "resources": SMALL,
        },
    }


def helm(info: ClusterInfo, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
    """Runs helm; ``timeout`` must exceed any ``--timeout`` passed to it."""
    path = helm_binary()
    assert path is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    r = subprocess.run(
        [path, *args],
        capture_output=True,
        text=True,
        env=info.kube_env(),
        input=stdin,
        timeout=timeout,
    )
    assert r.returncode == 0, f"helm {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def install(
    info: ClusterInfo, verb: str, partitions: list[dict[str, Any]] | None = None, **extra: Any
) -> None:
    """helm install or upgrade with :func:`values` (``extra``: the controller's), and Slurm's
    ``partitions`` instead of the one ``batch`` when given."""
    chosen = values(info, **extra)
    if partitions is not None:
        chosen["slurm"]["partitions"] = partitions
    create = ["--create-namespace"] if verb == "install" else []
    helm(
        info, verb, RELEASE, str(CHART), "-n", NS, *create,
        "-f", "-", stdin=json.dumps(chosen),
    )  # fmt: skip


def pods(api: Api, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/name%3D{RELEASE}-{component}"
    items: list[dict[str, Any]] = api.get(f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")[
        "items"
    ]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def all_ready(api: Api, component: str, count: int, image: str) -> list[dict[str, Any]] | None:
    found = pods(api, component)
    if len(found) != count or not all(ready(p) for p in found):
        return None
    assert all(p["spec"]["containers"][0]["image"] == image for p in found)
    return found


def failures(api: Api) -> str:
    """What the pods of the release say when they fail (their logs' tails: the host cannot
    reach a machine's kubelet for logs)."""
    out = []
    for pod in api.get(f"/api/v1/namespaces/{NS}/pods")["items"]:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            last = (status.get("lastState") or {}).get("terminated") or {}
            if last:
                out.append(f"{pod['metadata']['name']}: {last.get('message', '')[-1500:]}")
    return "\n".join(out)


def release_events(api: Api) -> str:
    """The Events of the release's pods, oldest first: where each start went (scheduling,
    each image's pull and how long it took, probe failures, back-offs)."""
    events = api.get(f"/api/v1/namespaces/{NS}/events")["items"]
    lines = ["== events of the release's pods"]
    for e in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
        count = f" (x{e['count']})" if e.get("count", 1) > 1 else ""
        lines.append(
            f"{e.get('lastTimestamp') or e.get('eventTime')} {e['involvedObject'].get('name')}"
            f" {e['reason']}{count}: {e.get('message', '')[:240]}"
        )
    return "\n".join(lines[-150:])


def node_story(api: Api, node: str) -> str:
    """What happened to ``node``, for a failure: its lifecycle history and its Events."""
    lines = [f"== {node}"]
    if api.http.get(f"/api/v1/nodes/{node}").status_code == 200:
        lines += [json.dumps(entry) for entry in history(api, node)]
    events = api.get(f"/api/v1/events?fieldSelector=involvedObject.name%3D{node}")["items"]
    for e in sorted(events, key=lambda e: e.get("lastTimestamp") or ""):
        lines.append(f"{e.get('lastTimestamp')} {e['reason']}: {e.get('message', '')[:300]}")
    return "\n".join(lines)


def slurm_work(api: Api, node: str) -> str:
    """The Slurm state the syncer reports on a Node taken out (``idle+DRAIN``); "" if none."""
    annotations = api.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    work = emptiness.SlurmWork.from_annotation(annotations.get(well_known.ANNOTATION_SLURM_WORK))
    return work.state if work is not None else ""


def slurm_cluster_ready(api: Api) -> bool:
    """The chart's SlurmCluster says Ready: its config pushed (``configHash``) and slurmrestd
    answering."""
    status = api.get(f"{GV}/namespaces/{NS}/slurmclusters/{RELEASE}").get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
    return bool(status.get("configHash")) and bool(ready) and ready[0]["status"] == "True"


ALICE_UID = 20001
AS_ALICE = f"setpriv --reuid={ALICE_UID} --regid={ALICE_UID} --clear-groups"
"""Runs a command as slurm.users' alice in a Slurm client pod."""


def slurm_client(info: ClusterInfo, api: Api, name: str, script: str, node: str = GPU) -> str:
    """Runs ``script`` (sh) in a one-shot pod of the Slurm image on ``node``, with the
    release's Slurm config and munge key (what the login pod has) and alice in its passwd;
    returns what it printed (its termination message: the host cannot reach a machine's
    kubelet for logs). A user's own client, as on a workstation: the login pod is reached
    over ssh, which the host cannot reach either. On the GPU machine for ``srun`` (its
    slurmd connects back to the client); a client that only asks slurmctld and slurmdbd
    runs on the system node, where a pod starts in seconds, not in the emulated machine's
    minutes (a helm upgrade was rolling its DaemonSets there)."""
    munged = (
        "mkdir -p /run/munge && chmod 0755 /run/munge"
        " && install -m 0400 /etc/munge-key/munge.key /run/munge/munge.key"
        " && munged --force --key-file=/run/munge/munge.key --socket=/run/munge/munge.socket.2"
        " --pid-file=/run/munge/munged.pid --seed-file=/run/munge/munged.seed"
    )
    account = (
        f"echo alice:x:{ALICE_UID}:{ALICE_UID}::/tmp:/bin/sh >>/etc/passwd"
        f" && echo alice:x:{ALICE_UID}: >>/etc/group"
    )
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "client",
                    "image": info.images["slurm"],
                    "workingDir": "/tmp",
                    "securityContext": {"runAsUser": 0},
                    "command": [
                        "sh",
                        "-c",
                        f"({munged} && {account} && {script}) >/tmp/out 2>&1;"
                        " rc=$?; tail -c 3500 /tmp/out >/dev/termination-log; exit $rc",
                    ],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/slurm"},
                        {"name": "munge-key", "mountPath": "/etc/munge-key"},
                    ],
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": f"{RELEASE}-slurm-config"}},
                {"name": "munge-key", "secret": {"secretName": f"{RELEASE}-munge-key"}},
            ],
        },
    }
    path = f"/api/v1/namespaces/{NS}/pods"
    api.post(path, body)
    try:
        try:
            done = wait_for(
                f"pod {name} finished",
                lambda: (
                    (pod := api.get(f"{path}/{name}"))["status"].get("phase")
                    in ("Succeeded", "Failed")
                    and pod
                ),
                POD_TIMEOUT,
            )
        except AssertionError as e:
            raise AssertionError(f"{e}; {pod_story(api, name, NS)}") from e
        terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
        message = str(terminated.get("message", ""))
        assert done["status"]["phase"] == "Succeeded", message
        return message
    finally:
        api.delete(f"{path}/{name}?gracePeriodSeconds=0")


TRAINING_JOB = r"""#!/bin/sh
# A training job that checkpoints its step every few seconds and resumes from the last
# checkpoint when it is started again. The machines share no filesystem (a reimage wipes
# the node's): the checkpoint lives in the job's own Comment, in slurmctld's saved state.
# slurmctld may be restarting as the job starts (a reconfigure when the node comes back):
# a read that failed is not "no checkpoint", so it is tried again, a minute at most.
for i in $(seq 30); do
    shown=$(scontrol show job "$SLURM_JOB_ID") && break
    sleep 2
done
from=$(echo "$shown" | sed -n 's/.*Comment=step:\([0-9]*\).*/\1/p')
step=${from:-0}
while true; do
    step=$((step + 1))
    scontrol update jobid="$SLURM_JOB_ID" comment="step:$step,from:${from:-0}"
    sleep 5
done
"""
"""alice's batch job, submitted once the node is in production: the XID 79 must requeue
it, and after the reimage it runs again from its checkpoint."""


def sacct_until(select: str, row: str) -> str:
    """A client script: ``sacct`` (through the chart's slurmdbd) until a record of
    ``select`` reads ``row`` (User|State|NodeList), for two minutes at most; then its records
    (slurmctld sends a job's end to slurmdbd shortly after it ends, and a slurmctld that
    restarts for a reconfigure sends what it held once it is back)."""
    query = f"sacct -a -X -n -P {select} -o User,State,NodeList"
    return (
        f"for i in $(seq 60); do {query} | grep -qx '{row}' && break; sleep 2; done;"
        f" echo accounted:; {query}"
    )


LONG_JOB: dict[str, str] = {}
"""The training job's id."""
FIRST_BOOT: dict[str, list[str]] = {}
"""Machine -> the join tokens issued for its first boot."""


def lease_holder(api: Api) -> str | None:
    """The controller replica that holds the Lease (the one that acts), if any."""
    r = api.http.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{RELEASE}-controller")
    if r.status_code != 200:
        return None
    return (r.json().get("spec") or {}).get("holderIdentity") or None


def history(api: Api, node: str) -> list[Any]:
    """The Node's recorded lifecycle transitions; [] while it has no record."""
    annotations = api.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    record = json.loads(annotations.get(well_known.ANNOTATION_RECORD) or "{}")
    return list(record.get("history") or [])


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterInfo, Api]]:
    spec = ClusterSpec(
        nodes=1,
        slurm=False,
        machines=1,
        host_node=True,
        machine_memory_mib=3072,
        images=True,
        machine_agent=False,
        slurm_accounting=True,
        machine_power_on=False,
    )
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        api = Api(info)
        put_policy(api, POLICY, machine_policy())
        watch_consoles({GPU: Path(info.machines[GPU].console_log)})
        try:
            # Day 0 as an operator does it (`gpufleet machines power-on`), each token read
            # from its Secret before the Node's join spends it.
            with TokenWatch(info, GPU) as tokens:
                machines.power_on(info.kubeconfig, [GPU])
                wait_for(
                    "both nodes Ready",
                    lambda: all(node_ready(api, n) for n in (SYSTEM, GPU)),
                    BOOT_TIMEOUT,
                )
            FIRST_BOOT[GPU] = list(tokens.tokens)
            create_db_secret(info, api)
            install(info, "install")
            yield info, api
        finally:
            watch_consoles(None)
            print(failures(api))
            print(release_events(api))
            print(node_story(api, GPU))
            console = Path(info.machines[GPU].console_log)
            if console.exists():
                print(console.read_text(errors="replace")[-3000:])
            host = info.logs_dir / "host-node.log"
            if host.exists():
                print(host.read_text(errors="replace")[-3000:])


def test_the_chart_runs_on_real_nodes_with_one_controller_acting(chart: Any) -> None:
    info, api = chart
    image = info.images["gpufleet"]
    controllers = wait_for(
        "2 controller replicas Ready",
        lambda: all_ready(api, "controller", 2, image),
        INSTALL_TIMEOUT,
    )
    assert {p["spec"]["nodeName"] for p in controllers} == {SYSTEM}
    (agent,) = wait_for("the agent Ready", lambda: all_ready(api, "agent", 1, image), POD_TIMEOUT)
    assert agent["spec"]["nodeName"] == GPU
    # Slurm 24.11 in pods, each Ready behind its probe: slurmctld answers `scontrol ping`,
    # slurmrestd and sshd their ports, slurmd on the GPU machine (where the SlurmCluster
    # operator labelled the node), the syncer and operator.
    slurm_image = info.images["slurm"]
    for component in ("slurm-controller", "slurm-rest", "slurm-login", "slurm-accounting"):
        (pod,) = wait_for(
            f"{component} Ready", lambda c=component: all_ready(api, c, 1, slurm_image), POD_TIMEOUT
        )
        assert pod["spec"]["nodeName"] == SYSTEM
    (slurmd,) = wait_for(
        "slurmd Ready", lambda: all_ready(api, "slurmd", 1, slurm_image), POD_TIMEOUT
    )
    assert slurmd["spec"]["nodeName"] == GPU
    wait_for("the syncer Ready", lambda: all_ready(api, "slurm-syncer", 1, image), POD_TIMEOUT)
    # Pulled from the cluster's registry by the machines' containerd.
    registry_log = (info.logs_dir / "registry.log").read_text()
    assert "GET /v2/gpufleet/manifests/" in registry_log
    assert "GET /v2/slurm/manifests/" in registry_log

    # One replica holds the controller's Lease and acts; its identity is its pod's name.
    holder = wait_for("a replica holds the lease", lambda: lease_holder(api), 300)
    pods = api.get(f"/api/v1/namespaces/{NS}/pods")["items"]
    replicas = [p["metadata"]["name"] for p in pods if "-controller-" in p["metadata"]["name"]]
    assert any(holder.startswith(name) for name in replicas), (holder, replicas)

    # The controller in its pod takes the GPU node to production, burn-in run by the agent
    # in its pod; the system node, where the controller runs, is not its to manage.
    wait_for("the GPU node in production", lambda: state(api, GPU) == "production", BOOT_TIMEOUT)
    assert history(api, GPU), "production was reached through recorded transitions"
    system = api.get(f"/api/v1/nodes/{SYSTEM}")
    assert well_known.ANNOTATION_RECORD not in (system["metadata"].get("annotations") or {})
    assert not system["spec"].get("unschedulable")
    assert not [
        t for t in system["spec"].get("taints") or [] if t["key"].startswith("gpufleet.io/")
    ]


def test_the_gpu_machine_joined_once_and_its_token_is_spent(chart: Any) -> None:
    """Day 0 of the GPU machine: a real kubelet registered its Node with the inventory's
    labels; the Machine is joined and disarmed after one token; the boot watchdog (in the
    controller's pod, started after the join) recorded the boot as joined. The token was
    used once: its Secret is gone, the apiserver refuses it, cluster-info no longer carries
    its signature (a second real ``kubeadm join`` stops there), and a boot that asks again
    gets no token."""
    info, api = chart
    node = api.get(f"/api/v1/nodes/{GPU}")
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
    labels = node["metadata"]["labels"]
    assert labels[well_known.LABEL_MACHINE] == GPU
    assert labels[well_known.LABEL_POOL] == POLICY
    machine = api.get(f"{GV}/machines/{GPU}")["status"]
    assert machine["node"] == GPU and machine["phase"] == "Joined", machine
    assert machine["armed"] is False and machine["tokensIssued"] == 1, machine
    wait_for(
        "the boot recorded as joined",
        lambda: api.get(f"{GV}/machines/{GPU}")["status"]["boot"]["outcome"] == "Joined",
        300,
    )

    tokens = FIRST_BOOT[GPU]
    assert len(tokens) == 1, tokens
    token = tokens[0]
    token_id = token.split(".")[0]
    wait_for("used token refused", lambda: self_subject_review(info, token).status_code == 401, 60)
    wait_for("its cluster-info signature removed", lambda: not signed_for(api, token_id), 60)
    assert_refused_at_discovery(info, token)
    again = httpx.get(
        f"{info.provision_url}/cloud-init/{info.machines[GPU].mac}/user-data",
        headers={"X-Gpufleet-Serial": info.machines[GPU].serial},
        timeout=10,
    )
    assert again.status_code == 409, again.text


def test_an_expired_token_is_refused_by_real_kubeadm(chart: Any) -> None:
    """A token valid a moment ago (the apiserver authenticates it, cluster-info carries its
    signature) is refused by kubeadm's discovery once it expired: the bootstrap signer drops
    its signature and the token cleaner its Secret. Issued by the provisioning code for a
    Machine of its own (no VM boots: only the token matters). kubeadm runs only with the
    expired token: with a valid one it would go on to the address cluster-info names, the
    machines' side of their network, which the host must not call."""
    info, api = chart
    token = issue_join_token(info, api, "expiry-probe", "aa:00:00:00:0e:01", ttl_s=20)
    token_id = token.split(".")[0]
    try:
        wait_for("cluster-info signed for it", lambda: signed_for(api, token_id), 30)
        assert self_subject_review(info, token).status_code == 201
        wait_for("expired: signature removed", lambda: not signed_for(api, token_id), 120)
        assert self_subject_review(info, token).status_code == 401
        assert_refused_at_discovery(info, token)
    finally:
        api.delete(f"{GV}/machines/expiry-probe")


def test_a_pod_for_gpufleet_slurm_waits_in_slurms_queue_and_is_accounted(chart: Any) -> None:
    """The chart's pod scheduler on a real kubelet: its two replicas Ready beside their munged
    sidecar, one holding its Lease; a Pod for ``gpufleet-slurm`` becomes a Slurm job (sbatch
    as the scheduler's user, through the sidecar's munge socket), is bound to the GPU machine
    where Slurm ran it and runs there; deleting it ends the job, which slurmdbd accounts
    under the Pod's name. Before alice's jobs: the GPU machine has one Slurm CPU."""
    info, api = chart
    image = info.images["gpufleet"]
    replicas = wait_for(
        "2 pod-scheduler replicas Ready",
        lambda: all_ready(api, "pod-scheduler", 2, image),
        POD_TIMEOUT,
    )
    assert {p["spec"]["nodeName"] for p in replicas} == {SYSTEM}
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{RELEASE}-pod-scheduler"
    holder = wait_for(
        "a pod-scheduler replica holds its Lease",
        lambda: (api.http.get(lease).json().get("spec") or {}).get("holderIdentity"),
        300,
    )
    assert any(holder.startswith(p["metadata"]["name"]) for p in replicas), holder
    wait_for("the GPU node in production", lambda: state(api, GPU) == "production", BOOT_TIMEOUT)
    name = "queued-train"
    path = f"/api/v1/namespaces/{NS}/pods"
    api.post(
        path,
        {
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "schedulerName": well_known.POD_SCHEDULER_NAME,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "train",
                        "image": info.images["slurm"],  # already on the GPU machine
                        "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": "100m"}},
                    }
                ],
            },
        },
    )
    try:
        try:
            pod = wait_for(
                "the Pod bound by the pod scheduler and running",
                lambda: (p := api.get(f"{path}/{name}"))["status"].get("phase") == "Running" and p,
                POD_TIMEOUT,
            )
        except AssertionError as e:  # its conditions carry a refusal (SlurmRejected ...)
            raise AssertionError(f"{e}; {pod_story(api, name, NS)}") from e
        assert pod["spec"]["nodeName"] == GPU
        job = pod["metadata"]["annotations"][well_known.ANNOTATION_SLURM_JOB]
        shown = slurm_client(
            info, api, "slurm-client-queued", f"squeue -h -j {job} -o '%j|%T|%N'", node=SYSTEM
        )
        assert f"{NS}/{name}|RUNNING|{GPU}" in shown, shown
    finally:
        api.delete(f"{path}/{name}?gracePeriodSeconds=0")
    wait_for("the Pod gone", lambda: api.http.get(f"{path}/{name}").status_code == 404, 300)
    query = f"sacct -a -X -n -P -j {job} -o JobName,State,NodeList"
    accounted = slurm_client(
        info,
        api,
        "slurm-client-queued-sacct",
        f"for i in $(seq 60); do {query} | grep -q '^{NS}/{name}|CANCELLED' && break;"
        f" sleep 2; done; echo accounted:; {query}",
        node=SYSTEM,
    )
    rows = accounted.split("accounted:", 1)[1].splitlines()
    assert any(r.startswith(f"{NS}/{name}|CANCELLED") and r.endswith(f"|{GPU}") for r in rows), (
        accounted
    )


def test_a_users_jobs_run_through_slurm_in_pods(chart: Any) -> None:
    """What a researcher does: alice (slurm.users) runs a step with srun and submits a
    batch job; slurmctld (system node) schedules them on slurmd (GPU machine, host
    network, proctrack/cgroup), which runs them as alice. The batch job, a training job
    that checkpoints, keeps running for the XID 79 test. Accounting recorded the step,
    alice's, completed on the GPU machine."""
    info, api = chart
    wait_for("the GPU node in production", lambda: state(api, GPU) == "production", BOOT_TIMEOUT)
    # What an operator checks before handing Slurm to users: the SlurmCluster Ready, slurmctld
    # running the config rendered for the current nodes (24.11 restarts on a reconfigure).
    wait_for("the SlurmCluster Ready", lambda: slurm_cluster_ready(api), POD_TIMEOUT)
    out = slurm_client(
        info,
        api,
        "slurm-client-jobs",
        f"{AS_ALICE} srun -N1 -t 2 sh -c 'echo \"ran as $(id -un) on $(hostname)\"'"
        f" && cat >/tmp/train.sh <<'JOB'\n{TRAINING_JOB}JOB\n"
        f"echo submitted $({AS_ALICE} sbatch --parsable --requeue -t 120 -o /dev/null"
        " /tmp/train.sh); " + sacct_until("-S now-6hours", f"alice|COMPLETED|{GPU}"),
    )
    assert f"ran as alice on {GPU}" in out, out
    job = out.split("submitted ", 1)[1].split()[0]
    assert job.isdigit(), out
    assert f"alice|COMPLETED|{GPU}" in out.split("accounted:", 1)[1].splitlines(), out
    # The XID 79 test needs it running when the fault comes (it checks the requeue): once it
    # stayed pending for minutes and ran only after the reimage. Wait, and say why if not.
    shown = slurm_client(
        info,
        api,
        "slurm-client-running",
        f"for i in $(seq 150); do scontrol show job {job} | grep -q JobState=RUNNING && break;"
        f" sleep 2; done; scontrol show job {job}; scontrol show node {GPU}",
        node=SYSTEM,
    )
    assert "JobState=RUNNING" in shown, shown
    LONG_JOB["id"] = job


def test_pods_on_two_machines_reach_each_other_by_service_name(chart: Any) -> None:
    """What Slurm's pods will need: a pod on the system node reaches a pod on the GPU
    machine by its Service's DNS name (CoreDNS on a machine, the fabric between the
    machines, each Node's InternalIP on it, routes to the other's pod subnet) and the API
    through the ``kubernetes`` Service (kube-proxy's rules on the machine)."""
    _, api = chart
    for name in (SYSTEM, GPU):
        node = api.get(f"/api/v1/nodes/{name}")
        internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal and internal[0].startswith("10.1."), (name, internal)
    wait_for(
        "CoreDNS Ready",
        lambda: any(
            ready(p)
            for p in api.get(
                "/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dkube-dns"
            )["items"]
        ),
        POD_TIMEOUT,
    )
    running = assert_reached_by_name(api, "fabric", GPU, SYSTEM, 300)
    # The server's address is of the GPU node's own pod subnet (the bridge CNI of the image).
    subnet = ipaddress.ip_network(api.get(f"/api/v1/nodes/{GPU}")["spec"]["podCIDR"])
    assert subnet.subnet_of(ipaddress.ip_network(kube.POD_SUBNET))
    assert ipaddress.ip_address(running["status"]["podIP"]) in subnet


def test_xid_79_from_the_agent_pod_ends_in_a_reimage_and_production(chart: Any) -> None:
    """The whole remediation with every gpufleet component in a pod: the agent's pod reports
    the fault, the controller's pod cordons and drains the node, the syncer's pod drains it
    in Slurm (slurmrestd in its pod), the controller reimages it through its BMC (reached
    from the pod's machine), the machine boots again, pulls the images again and passes
    verification, and the Slurm drain is lifted."""
    info, api = chart
    wait_for("the GPU node in production", lambda: state(api, GPU) == "production", BOOT_TIMEOUT)
    with TokenWatch(info, GPU) as tokens:
        reimage_after_xid_79(info, api, tokens)


def reimage_after_xid_79(info: ClusterInfo, api: Api, tokens: TokenWatch) -> None:
    before = bmc_counters(info, GPU)
    issued = api.get(f"{GV}/machines/{GPU}")["status"]["tokensIssued"]
    console = Path(info.machines[GPU].console_log)
    console_before = console.stat().st_size
    inject = f"{info.machines[GPU].inject_url}/inject"  # the agent pod's hostPort, via qemu

    def injected() -> httpx.Response | None:
        # qemu's user network accepts the connection for the guest and resets it while
        # nothing listens on the hostPort (the agent pod starting again after the node's
        # last change): asked again until the agent answers. A second XID 79 is the same
        # fault.
        try:
            return httpx.post(inject, json={"fault": "xid=79,gpu=3"}, timeout=30)
        except httpx.TransportError:
            return None

    r = wait_for("the agent pod answering on its hostPort", injected, POD_TIMEOUT)
    assert r.status_code == 200, r.text
    wait_for("the GPU node taken out", lambda: state(api, GPU) != "production", 300)
    wait_for(
        "the node cordoned",
        lambda: api.get(f"/api/v1/nodes/{GPU}")["spec"].get("unschedulable"),
        300,
    )
    # The syncer, in its pod, drained the node in Slurm (through slurmrestd, in its pod) and
    # says so on the Node: the controller reboots a Slurm node only after that word.
    wait_for("the node drained in Slurm", lambda: "DRAIN" in slurm_work(api, GPU), POD_TIMEOUT)
    wait_for(
        "a one-time network boot through the BMC",
        lambda: bmc_counters(info, GPU)["BootCount"] > before["BootCount"],
        BOOT_TIMEOUT,
    )
    wait_for("a new join token issued", lambda: tokens.tokens, BOOT_TIMEOUT)
    wait_for("production again", lambda: state(api, GPU) == "production", BOOT_TIMEOUT)
    after = bmc_counters(info, GPU)
    assert after["LastBootSource"] == "Pxe"
    assert after["ResetCount"] > before["ResetCount"]
    machine = api.get(f"{GV}/machines/{GPU}")["status"]
    assert machine["tokensIssued"] == issued + 1, machine
    assert machine["armedBy"] == well_known.CONTROLLER, machine
    # The machine really booted again (its console shows a new kernel), and the reimage
    # boot's token is refused once the Node is back (single use).
    assert b"Linux version" in console.read_bytes()[console_before:]
    assert len(tokens.tokens) == 1, "one token per boot"
    wait_for(
        "the reimage boot's token refused",
        lambda: self_subject_review(info, tokens.tokens[0]).status_code == 401,
        60,
    )
    # Back in service, the syncer lifted the drain and withdrew its report.
    wait_for("the Slurm report withdrawn", lambda: "DRAIN" not in slurm_work(api, GPU), 300)
    wait_for(
        "the agent Ready again",
        lambda: all_ready(api, "agent", 1, info.images["gpufleet"]),
        POD_TIMEOUT,
    )
    # alice's training job, running when the fault came, was requeued before the reimage
    # (the rule's `requeue: now`) and runs again on the machine, from its checkpoint.
    job = LONG_JOB.get("id")
    assert job, "test_a_users_jobs_run_through_slurm_in_pods submitted it"
    wait_for(
        "slurmd Ready again",
        lambda: all_ready(api, "slurmd", 1, info.images["slurm"]),
        POD_TIMEOUT,
    )
    shown = slurm_client(
        info,
        api,
        "slurm-client-requeued",
        # Until it runs and has written its first checkpoint of this run (until then its
        # Comment is the last run's, which started from step 0).
        f"for i in $(seq 150); do scontrol show job {job} | grep -q JobState=RUNNING"
        f" && scontrol show job {job} | grep -q 'Comment=step:[0-9]*,from:[1-9]' && break;"
        f" sleep 2; done; scontrol show job {job}; "
        + sacct_until(f"-D -j {job}", f"alice|REQUEUED|{GPU}"),
        node=SYSTEM,
    )
    assert "JobState=RUNNING" in shown, shown
    restarts = int(shown.split("Restarts=", 1)[1].split()[0])
    assert restarts >= 1, shown
    resumed_from = int(shown.split("Comment=step:", 1)[1].split(",from:", 1)[1].split()[0])
    assert resumed_from >= 1, f"started again from step 0, not its checkpoint:\n{shown}"
    # Accounting kept the run the fault interrupted: alice's, requeued, on the GPU machine.
    runs = shown.split("accounted:", 1)[1].splitlines()
    assert f"alice|REQUEUED|{GPU}" in runs, shown


def test_helm_upgrade_rolls_the_controller_and_acts_once(chart: Any) -> None:
    info, api = chart
    image = info.images["gpufleet"]
    wait_for("production", lambda: state(api, GPU) == "production", BOOT_TIMEOUT)
    old = {p["metadata"]["name"] for p in pods(api, "controller")}
    entries = len(history(api, GPU))
    resets = bmc_counters(info, GPU)["ResetCount"]
    # The upgrade also adds a Slurm partition: the operator renders it into the ConfigMap,
    # the kubelet brings it into slurmctld's volume in its own time, and slurmctld's
    # reconfigure container reloads it then (24.11: a restart).
    partitions = [*slurm_values()["partitions"], {"name": "debug", "pools": ["gpu"]}]
    install(info, "upgrade", partitions=partitions, adoptionRate=20)
    wait_for(
        "new controller pods Ready",
        lambda: (
            (found := all_ready(api, "controller", 2, image))
            and not {p["metadata"]["name"] for p in found} & old
        ),
        POD_TIMEOUT,
    )
    assert all(
        "--adoption-rate" in (args := p["spec"]["containers"][0]["args"])
        and args[args.index("--adoption-rate") + 1] == "20"
        for p in pods(api, "controller")
    )
    # Bounded in wall time (each scontrol at most 15 s: one that waits on a name or a
    # slurmctld mid-restart must not stretch the loop past the pod's wait), and when it
    # ends without the partition it says what slurmctld and its name answered.
    try:
        shown = slurm_client(
            info,
            api,
            "slurm-client-partition",
            "end=$(($(date +%s) + 420)); while [ $(date +%s) -lt $end ]; do"
            " timeout 15 scontrol show partition debug >/dev/null 2>&1 && break; sleep 2;"
            " done; timeout 15 scontrol show partition debug"
            " || { rc=$?; timeout 15 scontrol ping; grep '^SlurmctldHost' /etc/slurm/slurm.conf;"
            " host=$(grep -m1 '^SlurmctldHost' /etc/slurm/slurm.conf"
            " | sed 's/.*(//; s/).*//; s/.*=//');"
            ' timeout 15 getent hosts "$host"; exit $rc; }',
            node=SYSTEM,
        )
    except AssertionError as e:
        ctld = "; ".join(
            pod_story(api, p["metadata"]["name"], NS) for p in pods(api, "slurm-controller")
        )
        raise AssertionError(f"{e}; slurmctld: {ctld or 'no pod'}") from e
    assert "PartitionName=debug" in shown and f"Nodes={GPU}" in shown, shown
    assert state(api, GPU) == "production"
    assert len(history(api, GPU)) == entries
    assert bmc_counters(info, GPU)["ResetCount"] == resets


def test_helm_uninstall_removes_the_release(chart: Any) -> None:
    info, api = chart
    wait_for("production", lambda: state(api, GPU) == "production", BOOT_TIMEOUT)
    marked = api.get(f"/api/v1/nodes/{GPU}")
    assert well_known.LABEL_STATE in marked["metadata"]["labels"]
    # helm waits for the hook Job (up to its activeDeadlineSeconds, 1200) and then for the
    # release's objects to go.
    helm(info, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "25m", timeout=1560)
    # The pre-delete hook stopped the controller, then took gpufleet off the GPU node, which
    # was in production: no state label, record or taint of ours, no cordon. What identifies
    # the machine (its pool, its Machine) stays.
    node = api.get(f"/api/v1/nodes/{GPU}")
    labels, annotations = node["metadata"]["labels"], node["metadata"].get("annotations") or {}
    assert well_known.LABEL_STATE not in labels, labels
    assert labels[well_known.LABEL_POOL] == POLICY and labels[well_known.LABEL_MACHINE] == GPU
    assert not [a for a in annotations if a in uninstall.ANNOTATIONS], annotations
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] in uninstall.TAINTS]
    assert not node["spec"].get("unschedulable")
    assert not [
        c for c in node["status"].get("conditions") or [] if c["type"] in uninstall.CONDITIONS
    ]
    wait_for(
        "no pod of the release", lambda: not api.get(f"/api/v1/namespaces/{NS}/pods")["items"], 600
    )
    for path in (
        f"/apis/apps/v1/namespaces/{NS}/deployments",
        f"/apis/apps/v1/namespaces/{NS}/daemonsets",
        f"/api/v1/namespaces/{NS}/services",
    ):
        assert not api.get(path)["items"], path
    # The Lease was let go by the replica that stopped (it may stay: it names no holder).
    assert lease_holder(api) is None
    # The CRDs stay (helm keeps crds/): Machines and policies survive an uninstall.
    assert api.http.get(f"{GV}/fleetpolicies/{POLICY}").status_code == 200
