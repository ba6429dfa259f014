"""Helpers for the lifecycle-controller integration tests: API access, the controller
process, the agent's side of the Node contract, BMC counters.

The tests play the node agent by writing problem conditions and request
results on the Node status with the domain's encoders, exactly what the agent
writes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from node_history import annotation_values
from waiting import wait_for

from gpufleet.domain import agent_requests, conditions, enrollment, node_reports, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.policy import Detection, default_policy
from gpufleet.domain.records import NodeRecord, record_from_json
from gpufleet.health.agent import Agent, AgentSettings
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.kube_report import KubeReporter
from gpufleet.health.metrics import AgentMetrics
from gpufleet.health.skus import bundled
from gpufleet.kubeapi import KubeApi
from gpufleet.local import kube as local_kube
from gpufleet.provision import machines
from gpufleet.provision.issuer import Provisioner, ServiceSettings
from gpufleet.provision.server import ServeOptions, boot_config

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "deploy" / "crds"
SYSTEM_NS = "gpufleet-system"
GV = f"/apis/{well_known.GROUP}/{well_known.VERSION}"


class Api:
    """Plain authenticated HTTP to the test cluster's apiserver."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.http = httpx.Client(
            base_url=info.apiserver_url,
            verify=str(info.ca_file),
            headers={"Authorization": f"Bearer {info.token}"},
            timeout=30,
        )

    def get(self, path: str) -> Any:
        r = self.http.get(path)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: Any, ok: tuple[int, ...] = (200, 201)) -> httpx.Response:
        r = self.http.post(path, json=body)
        assert r.status_code in ok, f"POST {path}: {r.status_code} {r.text[:500]}"
        return r

    def patch(self, path: str, body: Any, kind: str = "merge") -> Any:
        r = self.http.patch(
            path, json=body, headers={"Content-Type": f"application/{kind}-patch+json"}
        )
        assert r.status_code == 200, f"PATCH {path}: {r.status_code} {r.text[:500]}"
        return r.json()

    def delete(self, path: str) -> None:
        self.http.delete(path)

    def node(self, name: str) -> Any:
        return self.get(f"/api/v1/nodes/{name}")

    def record(self, name: str) -> NodeRecord | None:
        text = (self.node(name)["metadata"].get("annotations") or {}).get(
            well_known.ANNOTATION_RECORD
        )
        return record_from_json(text) if text else None

    def state(self, name: str) -> str | None:
        return (self.node(name)["metadata"].get("labels") or {}).get(well_known.LABEL_STATE)

    def resource_version(self, name: str) -> str:
        """The Node's resourceVersion now: where :meth:`records_since` starts reading."""
        return str(self.node(name)["metadata"]["resourceVersion"])

    def records_since(self, name: str, resource_version: str) -> list[NodeRecord]:
        """Every record the Node carried since ``resource_version``, oldest first, read
        from a watch (the apiserver replays each change): a state that lasted less than
        one poll, such as a verification the simulated agent passes at once, is seen."""
        texts = annotation_values(self.http, name, well_known.ANNOTATION_RECORD, resource_version)
        return [record_from_json(text) for text in texts]

    def set_condition(self, name: str, cond: conditions.ConditionReport) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "status": {
                "conditions": [
                    {
                        "type": cond.type,
                        "status": cond.status,
                        "reason": cond.reason,
                        "message": cond.message,
                        "lastTransitionTime": now,
                        "lastHeartbeatTime": now,
                    }
                ]
            }
        }
        self.patch(f"/api/v1/nodes/{name}/status", body, kind="strategic-merge")

    def set_annotation(self, name: str, report: node_reports.AnnotationReport) -> None:
        """What the agent writes: an annotation, through the Node's status subresource."""
        body = {"metadata": {"annotations": {report.key: report.value}}}
        self.patch(f"/api/v1/nodes/{name}/status", body, kind="strategic-merge")

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.get(
            f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{name}"
        )["items"]
        return [e for e in items if e.get("source", {}).get("component") == well_known.CONTROLLER]


def xid(node: str, number: int, gpu: int = 3) -> FaultEvent:
    return FaultEvent(
        FaultKind.XID, node, at=time.time(), xid=number, evidence=Evidence(gpu_index=gpu)
    )


def report_fault(api: Api, node: str, number: int, subsystem: Subsystem = Subsystem.PCIE) -> None:
    api.set_condition(node, conditions.problem(subsystem, [xid(node, number)]))


def answer_request(api: Api, node: str, passed: bool, detail: str = "") -> str:
    """Answer the agent request the node's record asks for now (as the agent would);
    returns its kind. A GPU reset or a command is written by the gate only once the node
    is proven empty, a moment after the record: waited for (bounded)."""

    def current() -> conditions.AgentRequest | None:
        body = api.node(node)
        value = (body["metadata"].get("annotations") or {}).get(well_known.ANNOTATION_AGENT_REQUEST)
        request = conditions.decode_request(value)
        record = api.record(node)
        wanted = agent_requests.request_id(record) if record is not None else None
        return request if request is not None and request.id == wanted else None

    try:
        request = wait_for(f"{node}'s agent request", current, timeout=30)
    except AssertionError:
        raise AssertionError(f"{node} has no agent request") from None
    api.set_condition(
        node, conditions.AgentResult(request.id, passed, detail or request.kind).condition()
    )
    return request.kind


def install(api: Api) -> None:
    """CRDs and the namespace (idempotent)."""
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        r = api.http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        if r.status_code == 404:
            api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        wait_for(
            f"CRD {name} established",
            lambda n=name: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
                .get("status", {})
                .get("conditions")
                or []
            ),
        )
    api.post(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}},
        ok=(201, 409),
    )


def put_bmc_secret(api: Api, name: str, endpoint: str, user: str, password: str) -> str:
    """The BMC Secret ``bmc-<name>`` (kept when present); returns its ``namespace/name``,
    what a Node's annotation and a Machine's ``spec.bmc.credentialsSecret`` hold."""
    data = {
        k: base64.b64encode(v.encode()).decode()
        for k, v in {"endpoint": endpoint, "username": user, "password": password}.items()
    }
    api.post(
        f"/api/v1/namespaces/{SYSTEM_NS}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"bmc-{name}"}, "data": data},
        ok=(201, 409),
    )
    return f"{SYSTEM_NS}/bmc-{name}"


def add_bmc_secret(api: Api, node: str, endpoint: str, user: str, password: str) -> None:
    ref = put_bmc_secret(api, node, endpoint, user, password)
    api.patch(
        f"/api/v1/nodes/{node}",
        {"metadata": {"annotations": {well_known.ANNOTATION_BMC_SECRET: ref}}},
    )


def create_kwok_nodes(api: Api, names: list[str], pool: str) -> None:
    for i, name in enumerate(names):
        body = local_kube.node_manifest(name, 100 + i, local_kube.NodeShape())
        body["metadata"]["labels"][well_known.LABEL_POOL] = pool
        api.post("/api/v1/nodes", body, ok=(201, 409))
    wait_for(
        "extra KWOK nodes Ready",
        lambda: all(
            any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in api.node(n).get("status", {}).get("conditions", [])
            )
            for n in names
        ),
        timeout=60,
    )


@contextlib.contextmanager
def labelled_kwok_nodes(
    api: Api, label: str, nodes: dict[str, list[str]], pool: str
) -> Iterator[None]:
    """KWOK nodes of ``pool``, each group labelled ``label=<its key>``; reset and deleted
    after (a module's own nodes beside the session cluster's)."""
    for value, names in nodes.items():
        create_kwok_nodes(api, names, pool=pool)
        for name in names:
            api.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {label: value}}})
    try:
        yield
    finally:
        for name in (n for names in nodes.values() for n in names):
            reset_node(api, name)
            api.delete(f"/api/v1/nodes/{name}")


@contextlib.contextmanager
def labelled_fleet(
    info: Any,
    label: str,
    nodes: dict[str, list[str]],
    pool: str,
    *,
    policy: str,
    plans: tuple[str, ...] = (),
) -> Iterator[Api]:
    """A module's fleet beside the session cluster's: the CRDs installed and
    :func:`labelled_kwok_nodes`; after, the nodes go, then the module's MaintenancePlans
    ``plans`` and its FleetPolicy ``policy``."""
    api = Api(info)
    install(api)
    try:
        with labelled_kwok_nodes(api, label, nodes, pool=pool):
            yield api
    finally:
        for plan in plans:
            api.delete(f"{GV}/maintenanceplans/{plan}")
        api.delete(f"{GV}/fleetpolicies/{policy}")


def draining(api: Api, names: list[str]) -> list[str]:
    """Those of ``names`` taken out and held draining (a budget counts them out)."""
    return [n for n in names if api.state(n) == "draining"]


def budget_burst(
    api: Api, ctl: Any, nodes: dict[str, list[str]], allowed: dict[str, int], xid: int
) -> list[str]:
    """Adopt ``nodes``, report ``xid`` on every one at once, and check that each set takes
    out exactly its ``allowed`` budget while the rest are held (a pending fault, no cordon),
    still so three ticks later. Returns the held nodes."""
    every = [n for names in nodes.values() for n in names]
    wait_for("adopted", lambda: all(api.state(n) == "production" for n in every))
    for name in every:
        report_fault(api, name, xid)
    wait_for(
        "each budget used",
        lambda: all(len(draining(api, nodes[k])) == allowed[k] for k in nodes),
        timeout=30,
    )
    held = [n for n in every if api.state(n) == "production"]
    wait_for(
        "the others held",
        lambda: all((r := api.record(n)) is not None and r.pending is not None for n in held),
        timeout=30,
    )
    ctl.wait_ticks(3, timeout=30)
    assert {k: len(draining(api, nodes[k])) for k in nodes} == allowed
    assert not any(api.node(n)["spec"].get("unschedulable") for n in held)
    return held


def reset_node(api: Api, name: str) -> None:
    """Remove every gpufleet mark and reported condition, and any cordon or taint."""
    node = api.node(name)
    ann = node["metadata"].get("annotations") or {}
    drop = {
        k: None
        for k in ann
        if k.startswith("gpufleet.io/") and k != well_known.ANNOTATION_BMC_SECRET
    }
    api.patch(
        f"/api/v1/nodes/{name}",
        {
            "metadata": {"annotations": drop, "labels": {well_known.LABEL_STATE: None}},
            "spec": {"unschedulable": None, "taints": None},
        },
    )
    ours = set(well_known.CONDITIONS.values()) | {
        *node_reports.LEGACY_CONDITIONS,
        well_known.CONDITION_BMC_MISMATCH,
    }
    conds = [c for c in node.get("status", {}).get("conditions", []) if c["type"] not in ours]
    if len(conds) != len(node.get("status", {}).get("conditions", [])):
        node = api.node(name)
        api.patch(
            f"/api/v1/nodes/{name}/status",
            {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "status": {"conditions": conds},
            },
        )


def prepare_fleet(api: Api, info: Any) -> None:
    """CRDs and namespace installed, every node reset, each with its own BMC Secret."""
    install(api)
    for node in info.node_names:
        reset_node(api, node)
        bmc = info.bmcs[node]
        add_bmc_secret(api, node, bmc.url, bmc.user, bmc.password)


def policy_spec(*, slurm: str = "never", **changes: Any) -> dict[str, Any]:
    """The default policy as a FleetPolicy spec, with short timeouts for tests.

    ``slurm`` is ``drain.slurm``: a module that runs no syncer says no Slurm has to
    confirm its nodes empty (``never``: otherwise each drain waits for Slurm's word
    forever, docs/decisions/0146); a module with a syncer passes ``auto``."""
    spec: dict[str, Any] = default_policy().model_dump(by_alias=True, mode="json")
    for entry in spec["ladder"]:
        entry["timeoutSeconds"] = 120
    spec["checks"]["verificationTimeoutSeconds"] = 120
    spec["drain"]["timeoutSeconds"] = 30
    spec["drain"]["slurm"] = slurm
    spec.update(changes)
    return spec


def put_policy(api: Api, name: str, spec: dict[str, Any]) -> None:
    path = f"{GV}/fleetpolicies/{name}"
    r = api.http.get(path)
    if r.status_code == 200:
        api.http.delete(path)
        wait_for("old FleetPolicy gone", lambda: api.http.get(path).status_code == 404)
    api.post(
        f"{GV}/fleetpolicies",
        {
            "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
            "kind": "FleetPolicy",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControllerProcess:
    """``gpufleet controller`` as a child process, logging to a file."""

    def __init__(
        self,
        info: Any,
        log_dir: Path,
        *,
        policy: str,
        lease: str = "",
        lease_duration: float = 8.0,
        identity: str = "",
        wait_policy: bool = True,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.wait_policy = wait_policy
        self.extra_args = extra_args
        self.info = info
        self.policy = policy
        self.port = free_port()
        self.log = log_dir / f"controller-{policy}-{self.port}.log"
        self.lease = lease or f"controller-{policy}"
        """Replicas given the same lease are one controller: only its holder acts."""
        self.lease_duration = lease_duration
        """Short in tests, so a restarted process takes over in seconds (30 s by default)."""
        self.identity = identity
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        args = [
            sys.executable,
            "-m",
            "gpufleet.cli.main",
            "controller",
            "--kubeconfig",
            str(self.info.kubeconfig),
            "--policy-name",
            self.policy,
            "--metrics-port",
            str(self.port),
            "--tick",
            "0.3",
            "--lease",
            self.lease,
            "--lease-duration",
            str(self.lease_duration),
            # The emulator's OS takes seconds, not minutes, to shut down (local.redfish).
            "--graceful-settle",
            "20",
            *(["--identity", self.identity] if self.identity else []),
            *(["--verbose"] if os.environ.get("GPUFLEET_CONTROLLER_DEBUG") else []),
            *self.extra_args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_for("controller metrics endpoint", self._metrics_up, timeout=60)
        return self

    def _metrics_up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"controller exited: {self.log.read_text()[-3000:]}")
        try:
            text = self.metrics()
            return "gpufleet_policy_valid 1.0" in text or (
                not self.wait_policy and "gpufleet_policy_valid" in text
            )
        except httpx.HTTPError:
            return False

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def metric(self, line_start: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
        return None

    def records_held(self) -> float:
        """Nodes the controller holds a record of (its ``gpufleet_nodes`` gauges summed)."""
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in self.metrics().splitlines()
            if line.startswith("gpufleet_nodes{")
        )

    def wait_ticks(self, count: int = 3, timeout: float = 30.0) -> None:
        """Wait until the controller has completed ``count`` more passes over every node:
        an assertion that nothing changed is then about passes that provably ran."""
        start = self.metric("gpufleet_controller_ticks_total") or 0.0
        wait_for(
            f"{count} controller passes",
            lambda: (self.metric("gpufleet_controller_ticks_total") or 0.0) >= start + count,
            timeout=timeout,
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as a crashed pod."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def running(info: Any, log_dir: Path, **kw: Any) -> Iterator[ControllerProcess]:
    ctl = ControllerProcess(info, log_dir, **kw)
    try:  # stopped also when it never came up (an invalid policy): no process left acting
        yield ctl.start()
    finally:
        ctl.stop()


def self_subject_review(info: Any, token: str) -> httpx.Response:
    """A SelfSubjectReview sent with the bearer ``token``: 201 names who the apiserver
    takes it for, 401 means the token does not authenticate (unknown, used, expired)."""
    return httpx.post(
        f"{info.apiserver_url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        headers={"Authorization": f"Bearer {token}"},
        verify=ssl.create_default_context(cafile=str(info.ca_file)),
        timeout=10,
    )


def bmc_counters(info: Any, node: str) -> dict[str, Any]:
    """The emulator's counters: ``ResetCount`` (resets performed), ``ResetPosts`` (Reset
    POSTs received, performed or not), ``ResetPostsByType``, ``LastResetType``, boots."""
    bmc = info.bmcs[node]
    data = httpx.get(bmc.system_url, auth=(bmc.user, bmc.password), timeout=5).json()
    counters: dict[str, Any] = data["Oem"]["Gpufleet"]
    return counters


def bmc_control(info: Any, node: str, **switches: Any) -> dict[str, Any]:
    """Set a BMC's misbehaviour switches (``refuse``, ``failAfterReset``, ``slowAnswers``,
    ``slowAnswerSeconds``, ``getDelaySeconds``, ``bootSeconds``, ``reportLastResetTime``;
    see :mod:`gpufleet.local.redfish`); returns them all."""
    bmc = info.bmcs[node]
    url = bmc.url + "/gpufleet/control"
    r = httpx.patch(url, json=switches, auth=(bmc.user, bmc.password), timeout=5)
    assert r.status_code == 200, f"PATCH {url}: {r.status_code} {r.text[:300]}"
    result: dict[str, Any] = r.json()
    return result


WELL_BEHAVED_BMC = {
    "failAfterReset": 0,
    "slowAnswers": 0,
    "refuse": 0,
    "getDelaySeconds": 0.0,
    "bootSeconds": 0.0,
    "reportLastResetTime": True,
}
"""Switches of a BMC that does what it is asked: ``bmc_control(info, n, **WELL_BEHAVED_BMC)``."""


class RunningAgent:
    """A real agent for one node (simulated hardware, whose counters tell what it did),
    on its own event loop in a thread of the test process."""

    def __init__(self, info: Any, node: str, settings: AgentSettings | None = None) -> None:
        self.node = node
        self.hw = SimulatedHardware(node=node)
        policy = default_policy().model_copy(
            update={"detection": Detection(raise_after_seconds=0, clear_after_seconds=1.0)}
        )
        self.metrics = AgentMetrics(node)
        self.agent = Agent(
            self.hw,
            bundled().get("h100-sxm"),
            policy,
            node=node,
            reporter=KubeReporter(node, kubeconfig=str(info.kubeconfig)),
            metrics=self.metrics,
            settings=settings or AgentSettings(interval_s=0.2, request_retry_s=1.0),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        async def go() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self.agent.run(self._stop)

        asyncio.run(go())

    def requests(self, kind: str = "gpu-reset", outcome: str = "refused") -> float:
        value = self.metrics.registry.get_sample_value(
            "gpufleet_agent_requests_total", {"node": self.node, "kind": kind, "outcome": outcome}
        )
        return value or 0.0

    @contextlib.contextmanager
    def started(self) -> Iterator[RunningAgent]:
        self._thread.start()
        self._ready.wait(10)
        try:
            yield self
        finally:
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(15)
            self.hw.close()


def issue_join_token(info: Any, api: Api, name: str, mac: str, ttl_s: float) -> str:
    """Register a Machine ``name`` (no BMC behind it) and have the provisioning code issue
    its join token with a lifetime of ``ttl_s``, as a boot's user-data request would."""
    secret = f"enrol-{name}"
    spec = machines.MachineSpec.model_validate(
        {
            "macs": [mac],
            "serial": f"SN-{name}",
            "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": f"{SYSTEM_NS}/none"},
            "pool": "train",
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
            "enrollmentDigest": enrollment.digest(secret),
        }
    )
    api.post(f"{GV}/machines", machines.manifest(name, spec))

    async def issue() -> str:
        kube = await KubeApi.connect(str(info.kubeconfig))
        config = boot_config(ServeOptions(kubeconfig=info.kubeconfig))
        prov = Provisioner(kube, config, ServiceSettings(token_ttl_s=ttl_s))
        boot = await prov.user_data(mac, client="test", enrollment_secret=secret)
        await prov.drain_events()
        return boot.token

    return asyncio.run(issue())


def gpufleet_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``gpufleet ARGS`` as a user runs it (a subprocess; stdout a real pipe), not checked."""
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def maintenance_cli(info: Any, *args: str) -> str:
    """``gpufleet maintenance ARGS`` against the test cluster; its output (it must succeed)."""
    command = [sys.executable, "-m", "gpufleet.cli.main", "maintenance", *args]
    out = subprocess.run(
        [*command, "--kubeconfig", str(info.kubeconfig)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"gpufleet maintenance {args}: {out.stdout}{out.stderr}"
    return out.stdout


def plan_status(api: Api, plan: str) -> dict[str, Any]:
    """A MaintenancePlan's status ({} before the controller wrote one)."""
    found: dict[str, Any] = api.get(f"{GV}/maintenanceplans/{plan}").get("status") or {}
    return found
