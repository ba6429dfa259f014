"""The demo's scenarios: what each injects and which steps it waits for.

Each scenario acts through the real interfaces (the agent's fault-injection
API, ``sbatch``, a Pod, SIGKILL, the provisioning service's HTTP API as a booting
machine calls it) and then waits for the steps it expects on
the :class:`~gpufleet.demo.timeline.Timeline`; every wait names the component
to look at when it does not come. It returns the figures of its summary.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpufleet.api import nodedata
from gpufleet.demo import job, kube, policy, replica_scenarios, tenant_scenarios
from gpufleet.demo.fleet import Fleet
from gpufleet.demo.observe import Entry
from gpufleet.demo.timeline import StepMissed, Timeline
from gpufleet.domain import enrollment, well_known
from gpufleet.kubeapi.errors import ApiError
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import kube as local_kube
from gpufleet.local.cluster import ClusterInfo
from gpufleet.provision import machines


@dataclass
class Ctx:
    """What a scenario works with."""

    fleet: Fleet
    tl: Timeline
    workdir: Path
    shape: job.JobShape = field(default_factory=job.JobShape)
    figures: dict[str, Any] = field(default_factory=dict)
    job_id: int | None = None

    def log(self, component: str) -> Path:
        return self.fleet.info.logs_dir / f"{component}.log"

    # ------------------------------------------------------------ helpers

    def start_job(self, *sbatch: str) -> int:
        ckpt = self.workdir / "ckpt"
        self.tl.observer.watch_training(ckpt)
        self.job_id = job.submit(
            self.fleet.info, ckpt, self.shape, *sbatch, env=self.fleet.job_env()
        )
        self.tl.note(
            "demo",
            f"sbatch examples/slurm-ddp/train.sbatch -> job {self.job_id} "
            f"({self.shape.steps} steps, checkpoint every {self.shape.every})",
        )
        return self.job_id

    def job_nodes(self) -> list[str]:
        e = self.tl.wait(
            "job-running",
            what="the training job running",
            timeout=60,
            component="slurmctld",
            log=self.log("slurmctld"),
        )
        return list(e.data["nodes"])

    def wait_step(self, step: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            log = self.tl.observer.training
            if log is not None and any(
                e["kind"] == "step" and e["step"] >= step for e in log.events
            ):
                return
            if time.monotonic() > deadline:
                raise StepMissed(
                    f"the training job reaching step {step}",
                    timeout,
                    "the training job",
                    self.workdir / "ckpt",
                )
            self.tl.poll()
            time.sleep(0.2)

    def inject_url(self, url: str, node: str, fault: str, text: str) -> Entry:
        """Inject through an agent's fault-injection API at ``url`` (a real machine's)."""
        httpx.post(f"{url}/inject", json={"fault": fault}, timeout=10).raise_for_status()
        return self.tl.note("fault", f"{node}: fault injected: {text} [{fault}]", node)

    def inject(self, node: str, fault: str, text: str) -> Entry:
        self.fleet.inject(node, fault)
        return self.tl.note("fault", f"{node}: fault injected: {text} [{fault}]", node)

    def agent(self, node: str) -> tuple[str, Path]:
        return f"agent-{node}", self.log(f"agent-{node}")

    def agent_condition(self, node: str, what: str, after: float, timeout: float) -> Entry:
        """The problem condition ``node``'s agent raises after ``after``."""
        name, agent_log = self.agent(node)
        return self.tl.wait(
            "condition",
            what=what,
            timeout=timeout,
            component=name,
            log=agent_log,
            node=node,
            after=after,
        )

    def wait(self, kind: str, what: str, component: str, timeout: float = 30, **kw: Any) -> Entry:
        return self.tl.wait(
            kind, what=what, timeout=timeout, component=component, log=self.log(component), **kw
        )

    def finish_job(self, timeout: float = 180) -> None:
        self.tl.wait(
            "train-done",
            what="the training job finishing",
            timeout=timeout,
            component="the training job",
            log=self.workdir / "ckpt" / f"slurm-{self.job_id}.out",
        )
        self.wait("job-completed", "Slurm reporting the job COMPLETED", "slurmctld", 30)
        log = self.tl.observer.training
        assert log is not None
        self.figures["work"] = job.work_report(log.events, self.shape.steps)

    def recovery(
        self, node: str, fault: Entry, *, reset: str | None, agent_step: str | None
    ) -> None:
        """The ladder from the fault to production, and the job's resume, on ``node``."""
        name, agent_log = self.agent(node)
        cond = self.tl.wait(
            "condition",
            what=f"a problem condition on {node}",
            timeout=15,
            component=name,
            log=agent_log,
            node=node,
            after=fault.t,
        )
        cordon = self.wait("cordon", f"{node} cordoned and tainted", "controller", 15, node=node)
        drain = self.wait("slurm-drain", f"{node} drained in Slurm", "syncer", 15, node=node)
        self.figures["detect_s"] = cond.t - fault.t
        self.figures["isolate_s"] = max(cordon.t, drain.t) - fault.t
        if self.job_id is not None:
            self.wait("job-requeued", "the job requeued by the syncer", "syncer", 20)
        if reset is not None:
            self.wait(
                "bmc-reset",
                f"{node}'s BMC reset ({reset})",
                "controller",
                45,
                node=node,
                match=lambda e: e.data.get("reset") == reset,
            )
        if agent_step is not None:
            self.tl.wait(
                "agent-result",
                what=f"the agent's {agent_step}",
                timeout=45,
                component=name,
                log=agent_log,
                node=node,
                match=lambda e: e.data.get("kind", "").startswith(agent_step) and e.data["passed"],
            )
        self.tl.wait(
            "agent-result",
            what=f"verification of {node}",
            timeout=60,
            component=name,
            log=agent_log,
            node=node,
            match=lambda e: e.data.get("kind") == "checks verify" and e.data["passed"],
        )
        prod = self.wait(
            "state",
            f"{node} back in production",
            "controller",
            30,
            node=node,
            match=lambda e: e.data.get("state") == "production",
        )
        back = self.wait("slurm-resume", f"{node} resumed in Slurm", "syncer", 30, node=node)
        self.figures["node_back_s"] = max(prod.t, back.t) - fault.t
        if self.job_id is not None:
            resumed = self.tl.wait(
                "train-start",
                what="the job resuming from its checkpoint",
                timeout=120,
                component="slurmctld",
                log=self.log("slurmctld"),
                match=lambda e: e.data.get("step", 0) > 0,
            )
            self.figures["job_back_s"] = resumed.t - fault.t


# ----------------------------------------------------------------- scenarios


def _mid_interval(ctx: Ctx) -> None:
    """Let the job pass two checkpoints and stop between two, so that work is lost."""
    ctx.wait_step(2 * ctx.shape.every + 2)


def xid79(ctx: Ctx) -> None:
    ctx.start_job()
    nodes = ctx.job_nodes()
    _mid_interval(ctx)
    node = nodes[-1]
    fault = ctx.inject(node, "xid=79,gpu=3", "XID 79 (GPU has fallen off the bus) on GPU 3")
    ctx.recovery(node, fault, reset="GracefulRestart", agent_step=None)
    ctx.finish_job()
    ctx.figures["faulty"] = node


def ib_flap(ctx: Ctx) -> None:
    ctx.start_job()
    nodes = ctx.job_nodes()
    _mid_interval(ctx)
    node = nodes[-1]
    first: Entry | None = None
    for i in range(3):
        e = ctx.inject(node, "ib-link-flap,hca=mlx5_1", f"InfiniBand link flap {i + 1} on mlx5_1")
        first = first or e
        if i < 2:
            ctx.tl.idle(1.5)
            if ctx.tl.find("condition", node, after=first.t) is not None:
                raise StepMissed(
                    "a single flap must only be logged (policy: 3 in 10 minutes)",
                    0,
                    *ctx.agent(node),
                )
    assert first is not None
    ctx.tl.note("demo", f"{node}: 2 flaps were Events only; the 3rd within 10 min takes it out")
    last = ctx.tl.entries[-1]
    ctx.recovery(node, last, reset="GracefulRestart", agent_step=None)
    ctx.finish_job()
    ctx.figures["faulty"] = node


def ecc_uncorrectable(ctx: Ctx) -> None:
    ctx.start_job()
    nodes = ctx.job_nodes()
    _mid_interval(ctx)
    node = nodes[0]
    fault = ctx.inject(node, "ecc-uncorrectable,gpu=2", "uncorrectable ECC error on GPU 2")
    ctx.recovery(node, fault, reset=None, agent_step="gpu-reset")
    ctx.finish_job()
    ctx.figures["faulty"] = node


def controller_crash(ctx: Ctx) -> None:
    ctx.start_job()
    nodes = ctx.job_nodes()
    _mid_interval(ctx)
    node = nodes[-1]
    fault = ctx.inject(node, "xid=79,gpu=3", "XID 79 on GPU 3 (policy: power cycle)")
    ctx.wait("bmc-reset", f"{node}'s power cycle", "controller", 45, node=node)
    # Killed while the machine reboots: the power cycle is done, the step is not. (Its
    # verification is over in less than one look at the fleet, too short to aim at.)
    ctx.fleet.kill_controller()
    ctx.tl.note(
        "demo", "controller killed with SIGKILL after the power cycle, while the machine reboots"
    )
    ctx.tl.idle(2)
    ctx.fleet.start_controller()
    ctx.tl.note("demo", "controller restarted; it carries on from the Node's record")
    ctx.recovery(node, fault, reset="PowerCycle", agent_step=None)
    ctx.finish_job()
    ctx.tl.idle(2)
    resets = ctx.tl.count("bmc-reset", node)
    ctx.figures["power_cycles"] = resets
    ctx.figures["faulty"] = node
    if resets != 1:
        raise StepMissed(
            f"exactly one BMC reset on {node} (saw {resets})",
            0,
            "controller",
            ctx.log("controller"),
        )


def fault_storm(ctx: Ctx) -> None:
    nodes = ctx.fleet.info.node_names
    storm = nodes[: max(3, len(nodes) - 1)]
    faults = [ctx.inject(n, "xid=79,gpu=0", "XID 79 on GPU 0") for n in storm]
    ctx.wait("breaker-open", "the circuit breaker opening", "controller", 20)
    for n in storm:
        ctx.tl.wait(
            "condition",
            what=f"a condition on {n}",
            timeout=15,
            component=ctx.agent(n)[0],
            log=ctx.agent(n)[1],
            node=n,
            after=faults[0].t,
        )
    ctx.tl.idle(5)
    out = [n for n, s in ctx.tl.observer.nodes.items() if s.unschedulable]
    budget = int(
        ctx.fleet.api.get(f"{kube.GV}/fleetpolicies/{policy.POLICY_NAME}")["status"]["budget"][
            "default"
        ]["allowed"]
    )
    held = _held_faults(ctx)
    ctx.figures.update(out=out, budget=budget, breaker_open=ctx.tl.observer.breaker_open, held=held)
    ctx.tl.note(
        "demo",
        f"{len(storm)} nodes report faults; {len(out)} taken out of service (budget {budget}); "
        f"{len(held)} kept as pending incidents ({', '.join(held) or 'none'}): repaired when the"
        " breaker closes and the budget allows, or dismissed by an operator"
        " (`gpufleet node dismiss`)",
    )
    if len(out) > budget or not ctx.tl.observer.breaker_open:
        raise StepMissed(
            "the budget holding and the breaker open", 0, "controller", ctx.log("controller")
        )


def _held_faults(ctx: Ctx) -> list[str]:
    """Nodes whose record keeps a held fault (read from the Nodes, not assumed)."""
    held = []
    for node in kube.nodes(ctx.fleet.api):
        record = nodedata.trusted_record(node)
        if record is not None and record.pending is not None:
            held.append(record.name)
    return sorted(held)


def preemption(ctx: Ctx) -> None:
    n = len(ctx.fleet.info.node_names)
    ctx.start_job(f"--nodes={n}")
    ctx.job_nodes()
    _mid_interval(ctx)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "inference-0", "namespace": "default"},
        "spec": {
            "priorityClassName": kube.INFERENCE_CLASS,
            "containers": [
                {
                    "name": "serve",
                    "image": "example.invalid/inference:1",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }
    ctx.fleet.api.create("/api/v1/namespaces/default/pods", pod, exist_ok=False)
    created = ctx.tl.note(
        "demo", f"Pod inference-0 created (priority {kube.INFERENCE_PRIORITY}, 8 GPUs)"
    )
    lent = ctx.wait("lent", "the syncer lending a node to the Pod", "syncer", 20)
    node = str(lent.node)
    ctx.wait("slurm-drain", f"{node} drained in Slurm", "syncer", 15, node=node)
    ctx.wait("job-requeued", "the job requeued", "syncer", 20)
    running = ctx.wait("pod-running", "the Pod running on the lent node", "syncer", 30, node=node)
    ctx.figures["pod_running_s"] = running.t - created.t
    ctx.figures["lent"] = node
    ctx.tl.idle(4)
    ctx.fleet.api.delete("/api/v1/namespaces/default/pods/inference-0?gracePeriodSeconds=0")
    ctx.tl.note("demo", "Pod inference-0 deleted (inference scaled down)")
    ctx.wait("returned", f"{node} returned to Slurm", "syncer", 20, node=node)
    ctx.wait("slurm-resume", f"{node} resumed in Slurm", "syncer", 20, node=node)
    resumed = ctx.tl.wait(
        "train-start",
        what="the job resuming from its checkpoint",
        timeout=120,
        component="slurmctld",
        log=ctx.log("slurmctld"),
        match=lambda e: e.data.get("step", 0) > 0,
    )
    ctx.figures["job_back_s"] = resumed.t - created.t
    ctx.finish_job()


def sdc_found_by_active_check(ctx: Ctx) -> None:
    ctx.start_job()
    busy = set(ctx.job_nodes())
    node = next(n for n in ctx.fleet.info.node_names if n not in busy)
    fault = ctx.inject(
        node,
        "sdc-mismatch,gpu=6",
        "GPU 6 computes wrong results (silent: nothing in the kernel log, no ECC error)",
    )
    cond = ctx.agent_condition(
        node, f"the idle-time active check (GEMM vs. reference) finding it on {node}", fault.t, 45
    )
    cordon = ctx.wait("cordon", f"{node} cordoned and tainted", "controller", 15, node=node)
    drain = ctx.wait("slurm-drain", f"{node} drained in Slurm", "syncer", 15, node=node)
    ctx.wait(
        "state",
        f"{node} handed to a person (triage: a GPU that computes wrong answers)",
        "controller",
        30,
        node=node,
        match=lambda e: e.data.get("state") == "triage",
    )
    ctx.figures["detect_s"] = cond.t - fault.t
    ctx.figures["isolate_s"] = max(cordon.t, drain.t) - fault.t
    ctx.figures["faulty"] = node
    ctx.finish_job()


def straggler(ctx: Ctx) -> None:
    ctx.start_job()
    nodes = ctx.job_nodes()
    _mid_interval(ctx)
    node = nodes[-1]
    fault = ctx.inject(
        node,
        "straggler,gpu=5,factor=0.4",
        "GPU 5 computes at 40% of its speed (no XID, no ECC error, no throttle reason: "
        "nothing in any log; the whole job slows to its pace)",
    )
    name, agent_log = ctx.agent(node)
    ctx.tl.wait(
        "event",
        what=f"the agent finding {node} slower than its peer in the job (job telemetry)",
        timeout=30,
        component=name,
        log=agent_log,
        node=node,
        after=fault.t,
        match=lambda e: e.data.get("reason") == "Straggler",
    )
    if ctx.tl.find("condition", node, after=fault.t) is not None:
        raise StepMissed(
            "a first straggler report must only be logged (policy: 3 within a day)", 0, name, None
        )
    ctx.tl.note("demo", f"{node}: straggler reports are Events; the 3rd within a day takes it out")
    ctx.recovery(node, fault, reset="GracefulRestart", agent_step=None)
    requeued = ctx.tl.find("job-requeued", after=fault.t)
    ctx.finish_job()
    log = ctx.tl.observer.training
    assert log is not None and requeued is not None
    resumed = ctx.tl.find("train-start", match=lambda e: e.data.get("step", 0) > 0)
    done = ctx.tl.find("train-done")
    assert resumed is not None and done is not None
    ctx.figures["slow_step_s"] = job.pace(log.events, fault.t, requeued.t)
    ctx.figures["pace_after_s"] = job.pace(log.events, resumed.t, done.t)
    ctx.figures["peer"] = nodes[0]
    ctx.figures["reports"] = sum(
        1 for e in ctx.tl.entries if e.kind == "event" and e.data.get("reason") == "Straggler"
    )
    ctx.figures["faulty"] = node


NHC_REASON = "NHC: check_hw_ib: mlx5_0 port 1 DOWN"
"""What LBNL NHC writes when an InfiniBand port is down (its ``die`` drains the node)."""
ADMIN_REASON = "maintenance by alice: reseat the PSU"
"""A person's hold: no pattern of the policy knows it, so it is ``admin``."""


def _slurm(ctx: Ctx, *argv: str, check: bool = True) -> str:
    """A Slurm command's output (``sbatch``, ``squeue``, ``scontrol``) on the fleet's Slurm."""
    out = subprocess.run(
        argv,
        env=ctx.fleet.info.slurm_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=check,
    )
    return out.stdout


def _scontrol(ctx: Ctx, *args: str) -> str:
    return _slurm(ctx, "scontrol", *args)


def _drain_reason(ctx: Ctx, node: str) -> str | None:
    """The node's drain reason as Slurm has it now (None: not drained)."""
    return ctx.tl.observer.slurm_nodes.get(node, ("", None))[1]


def slurm_health_drain(ctx: Ctx) -> None:
    """A drain by Slurm's own health check feeds the repair loop; a person's drain does not.

    The drain is made as LBNL NHC makes it (``scontrol update ... state=drain reason="NHC:
    ..."``), so nothing of gpufleet's is involved until the syncer reads it from Slurm.
    """
    sick, held = ctx.fleet.info.node_names[0], ctx.fleet.info.node_names[1]
    try:
        _scontrol(ctx, "update", f"nodename={held}", "state=drain", f"reason={ADMIN_REASON}")
        ctx.tl.note("demo", f"{held}: an administrator drains it in Slurm ({ADMIN_REASON!r})", held)
        ctx.wait("slurm-drain", f"{held} drained in Slurm", "slurmctld", 15, node=held)
        _scontrol(ctx, "update", f"nodename={sick}", "state=drain", f"reason={NHC_REASON}")
        fault = ctx.tl.note(
            "fault",
            f"{sick}: Slurm's health check (LBNL NHC) drains it: "
            f"scontrol update state=drain reason={NHC_REASON!r}",
            sick,
        )
        cond = ctx.wait(
            "condition",
            f"the syncer reporting the drain on {sick} as a hardware fault",
            "syncer",
            15,
            node=sick,
            after=fault.t,
        )
        cordon = ctx.wait("cordon", f"{sick} cordoned and tainted", "controller", 15, node=sick)
        ctx.wait(
            "slurm-drain",
            f"the syncer taking {sick}'s drain over (gpufleet: ...)",
            "syncer",
            20,
            node=sick,
            match=lambda e: "gpufleet:" in e.text,
        )
        ctx.wait(
            "bmc-reset", f"{sick}'s BMC reset (the ladder's reboot)", "controller", 45, node=sick
        )
        name, agent_log = ctx.agent(sick)
        ctx.tl.wait(
            "agent-result",
            what=f"verification of {sick}",
            timeout=60,
            component=name,
            log=agent_log,
            node=sick,
            match=lambda e: e.data.get("kind") == "checks verify" and e.data["passed"],
        )
        prod = ctx.wait(
            "state",
            f"{sick} back in production",
            "controller",
            30,
            node=sick,
            match=lambda e: e.data.get("state") == "production",
        )
        back = ctx.wait("slurm-resume", f"{sick} resumed in Slurm", "syncer", 30, node=sick)
        ctx.figures["detect_s"] = cond.t - fault.t
        ctx.figures["isolate_s"] = cordon.t - fault.t
        ctx.figures["node_back_s"] = max(prod.t, back.t) - fault.t
        ctx.figures["faulty"] = sick
        # the syncer polls every 0.5 s: two seconds more is four looks at the admin's drain
        ctx.tl.idle(2)
        ctx.figures["held"] = held
        ctx.figures["held_reason"] = _drain_reason(ctx, held)
    finally:
        # the administrator is done: the demo fleet is shared by the scenarios that follow
        _scontrol(ctx, "update", f"nodename={held}", "state=resume")
        if (_drain_reason(ctx, sick) or "").startswith("NHC:"):
            _scontrol(ctx, "update", f"nodename={sick}", "state=resume")
    done = ctx.tl.note("demo", f"{held}: the administrator resumes it (maintenance done)", held)
    ctx.wait("slurm-resume", f"{held} resumed in Slurm", "slurmctld", 15, node=held, after=done.t)


NEW_MACHINE = "gpu-node-0100"
NEW_MAC = "aa:bb:cc:00:01:00"
ENROLLMENT_SECRET = "demo-enrollment-secret-0100"
"""What the new machine's image carries; the Machine holds only its digest."""
NEW_HARDWARE = {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8}
"""The inventory's word for the box; the simulated agent reports 8 x ``NVIDIA H100 80GB
HBM3`` and 8 HCAs (``mlx5_0``..``mlx5_7``)."""


def _self_review(info: ClusterInfo, token: str) -> tuple[int, dict[str, Any]]:
    """Who the apiserver says ``token`` is (a SelfSubjectReview made with it): HTTP 201 and
    the user, or the status of the refusal (0: no answer) and no user."""
    as_token = SyncKube(info.apiserver_url, token, info.ca_file)
    try:
        review = as_token.create(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            exist_ok=False,
        )
    except ApiError as exc:
        return exc.status or 0, {}
    finally:
        as_token.close()
    return 201, (review.get("status") or {}).get("userInfo") or {}


def _served(ctx: Ctx, r: httpx.Response, what: str) -> str:
    if r.status_code != 200:
        raise StepMissed(
            f"{what}: HTTP {r.status_code} {r.text[:200]}", 0, "provision", ctx.log("provision")
        )
    return r.text


def _until(ctx: Ctx, check: Callable[[], bool], what: str, component: str) -> None:
    """Poll ``check`` (and the timeline) for up to 20 s."""
    deadline = time.monotonic() + 20
    while not check():
        if time.monotonic() > deadline:
            raise StepMissed(what, 20, component, ctx.log(component))
        ctx.tl.poll()
        time.sleep(0.2)


def new_machine(ctx: Ctx) -> None:
    fleet, tl, api = ctx.fleet, ctx.tl, ctx.fleet.api
    name, mac = NEW_MACHINE, NEW_MAC
    url = fleet.start_provisioning()
    bmc = fleet.start_new_bmc(name)
    fleet.joining.add(name)
    spec = machines.MachineSpec.model_validate(
        {
            "macs": [mac],
            "serial": f"SN-{name}",
            "bmc": {"endpoint": bmc.url, "credentialsSecret": kube.put_bmc_secret(api, bmc)},
            "hardware": NEW_HARDWARE,
            "topology": {"leaf": "ib-leaf-025", "block": "ib-block-b"},
            "enrollmentDigest": enrollment.digest(ENROLLMENT_SECRET),
        }
    )
    api.create(
        f"{kube.GV}/{well_known.MACHINE_PLURAL}", machines.manifest(name, spec), exist_ok=False
    )
    tl.note(
        "demo",
        f"Machine {name} added to the inventory (MAC {mac}, 8 x H100, 8 HCAs, its BMC, "
        f"enrollment digest); gpufleet provision serve on {url}",
        name,
    )

    # Power on: the PXE firmware chain-loads iPXE, the image fetches its cloud-init.
    power_on = tl.note("power-on", f"{name} powers on; PXE: GET /ipxe?mac={mac}", name)
    with httpx.Client(base_url=url, timeout=10) as http:
        script = _served(ctx, http.get("/ipxe", params={"mac": mac}), "the iPXE script")
        kernel = next((ln for ln in script.splitlines() if ln.startswith("kernel ")), "")
        tl.note("ipxe", f"{name}: iPXE script served: {kernel.split(' ds=')[0]} ...", name)
        _served(ctx, http.get(f"/cloud-init/{mac}/meta-data"), "cloud-init meta-data")
        text = _served(
            ctx,
            http.get(
                f"/cloud-init/{mac}/user-data",
                headers={"X-Gpufleet-Enrollment": ENROLLMENT_SECRET},
            ),
            "cloud-init user-data",
        )
    doc = yaml.safe_load(text.removeprefix("#cloud-config\n"))
    join = yaml.safe_load(doc["write_files"][0]["content"])
    discovery = join["discovery"]["bootstrapToken"]
    token = str(discovery["token"])
    token_id = token.split(".")[0]
    value = join["nodeRegistration"]["kubeletExtraArgs"][0]["value"]
    labels = dict(pair.split("=", 1) for pair in value.split(","))
    tl.note(
        "user-data",
        f"{name}: cloud-init user-data served (enrollment secret checked): kubeadm join "
        f"{discovery['apiServerEndpoint']}, token {token_id}.<secret>, "
        f"{len(labels)} node labels",
        name,
    )

    # kubeadm join: the token authenticates as a bootstrapper.
    code, user = _self_review(fleet.info, token)
    groups = list(user.get("groups") or [])
    if code != 201 or "system:bootstrappers" not in groups:
        raise StepMissed(
            f"the join token accepted by the apiserver (HTTP {code}, {user})",
            0,
            "kube-apiserver",
            ctx.log("kube-apiserver"),
        )
    tl.note(
        "token-accepted",
        f"{name}: the apiserver accepts the token: {user.get('username')} "
        f"in {', '.join(g for g in groups if g != 'system:authenticated')}",
        name,
    )

    # The kubelet registers the Node (played here: no kubelets run in the local
    # cluster; KWOK makes it Ready), then its agent starts.
    body = local_kube.node_manifest(
        name,
        len(fleet.info.node_names),
        local_kube.NodeShape(kubelet_version=str(api.get("/version")["gitVersion"])),
    )
    body["metadata"]["labels"].update(labels)
    api.create("/api/v1/nodes", body, exist_ok=False)
    added = ctx.wait("node-added", f"Node {name} registered", "kube-apiserver", 15, node=name)
    ctx.wait("node-ready", f"{name} Ready", "kwok", 30, node=name)
    fleet.start_agent(name)
    tl.note("demo", f"agent started on {name} (simulated HGX H100: 8 GPUs, 8 HCAs)", name)
    agent, agent_log = ctx.agent(name)

    burn_in = ctx.wait(
        "state",
        f"{name}: hardware matches the Machine, burn-in",
        "controller",
        90,  # the agent starts, reads its hardware and reports: 20 s alone, 45+ on a busy host
        node=name,
        match=lambda e: e.data.get("state") == "burn-in",
    )
    tl.wait(
        "agent-result",
        what=f"the agent's burn-in checks on {name}",
        timeout=120,
        component=agent,
        log=agent_log,
        node=name,
        match=lambda e: e.data.get("kind") == "checks burn-in" and e.data["passed"],
    )
    prod = ctx.wait(
        "state",
        f"{name} in production",
        "controller",
        30,
        node=name,
        match=lambda e: e.data.get("state") == "production",
    )
    status = api.get(f"{kube.GV}/{well_known.MACHINE_PLURAL}/{name}").get("status") or {}
    tl.note(
        "demo",
        f"Machine {name}: phase {status.get('phase')}, node {status.get('node')}, "
        f"observed {status.get('observed')}",
        name,
    )

    # Single use: the controller deleted the token's Secret when the Node registered;
    # the apiserver refuses the token once its authentication cache (10 s) has expired.
    secret = f"/api/v1/namespaces/kube-system/secrets/{enrollment.secret_name(token_id)}"
    _until(ctx, lambda: not api.exists(secret), "the used token's Secret deleted", "controller")
    tl.note("demo", f"{name}: token Secret kube-system/{secret.rsplit('/', 1)[1]} deleted", name)
    _until(
        ctx,
        lambda: _self_review(fleet.info, token)[0] == 401,
        "the used join token refused",
        "kube-apiserver",
    )
    tl.note("token-refused", f"{name}: the used join token is refused (HTTP 401)", name)
    ctx.figures.update(
        joined=name,
        node_s=added.t - power_on.t,
        burn_in_s=burn_in.t - power_on.t,
        production_s=prod.t - power_on.t,
        machine_phase=status.get("phase"),
    )


def real_machine(ctx: Ctx) -> None:
    """A real machine (a qemu VM of the local cluster) is powered on through its BMC,
    network-boots the node image, joins with kubeadm and its single-use token, passes
    burn-in; an XID 79 on it is remediated by a reimage through the BMC."""
    fleet, tl, api = ctx.fleet, ctx.tl, ctx.fleet.api
    info = fleet.info
    name, machine = next(iter(info.machines.items()))
    bmc = info.bmcs[name]
    tl.note(
        "demo",
        f"{name}: a qemu VM ({machine.cpus} vCPU, {machine.memory_mib} MiB, no disk, "
        f"MAC {machine.mac}); "
        f"its console: {machine.console_log}",
        name,
    )
    _bmc_reset(bmc, "On")
    power_on = tl.note("power-on", f"{name}: ComputerSystem.Reset On through its BMC", name)
    boot_timeout = 900
    added = ctx.wait(
        "node-added",
        f"{name} network-booted and joined (kubeadm join, real kubelet)",
        "provision",
        boot_timeout,
        node=name,
    )
    ctx.wait("node-ready", f"{name} Ready", "kube-controller-manager", boot_timeout, node=name)
    prod = ctx.wait(
        "state",
        f"{name}: hardware matches the Machine, burn-in passed, production",
        "controller",
        boot_timeout,
        node=name,
        match=lambda e: e.data.get("state") == "production",
    )
    status = api.get(f"{kube.GV}/{well_known.MACHINE_PLURAL}/{name}").get("status") or {}
    token_id = str(status.get("tokenId") or "")
    secret = f"/api/v1/namespaces/kube-system/secrets/{enrollment.secret_name(token_id)}"
    _until(ctx, lambda: not api.exists(secret), "the used token's Secret deleted", "controller")
    tl.note(
        "demo",
        f"Machine {name}: phase {status.get('phase')}, token {token_id} used once and its "
        "Secret deleted",
        name,
    )
    first = _bmc_system(bmc)
    fault = ctx.inject_url(machine.inject_url, name, "xid=79,gpu=3", "XID 79 on GPU 3")
    ctx.wait(
        "state",
        f"{name} taken out for the reimage",
        "controller",
        120,
        node=name,
        match=lambda e: e.data.get("state") not in (None, "production"),
        after=fault.t,
    )
    _until_long(
        ctx,
        lambda: (
            _bmc_system(bmc)["Oem"]["Gpufleet"]["BootCount"] > first["Oem"]["Gpufleet"]["BootCount"]
        ),
        "the BMC power-cycling the machine into a network boot",
        "controller",
        300,
    )
    boot = _bmc_system(bmc)["Oem"]["Gpufleet"]
    tl.note(
        "bmc",
        f"{name}: BMC reset {boot['LastResetType']}, boot {boot['BootCount']} from "
        f"{boot['LastBootSource']} (a stateless machine: a fresh root from the network)",
        name,
    )
    back = ctx.wait(
        "state",
        f"{name} rejoined with a new token and back in production",
        "controller",
        boot_timeout,
        node=name,
        match=lambda e: e.data.get("state") == "production",
        after=fault.t,
    )
    status = api.get(f"{kube.GV}/{well_known.MACHINE_PLURAL}/{name}").get("status") or {}
    tl.note(
        "demo",
        f"Machine {name}: {status.get('tokensIssued')} tokens issued in all, the last "
        f"{status.get('tokenId')}; console: {machine.console_log}",
        name,
    )
    ctx.figures.update(
        machine=name,
        console=machine.console_log,
        node_s=added.t - power_on.t,
        production_s=prod.t - power_on.t,
        reimage_to_production_s=back.t - fault.t,
    )


def _bmc_reset(bmc: Any, reset_type: str) -> None:
    r = httpx.post(
        f"{bmc.system_url}/Actions/ComputerSystem.Reset",
        json={"ResetType": reset_type},
        auth=(bmc.user, bmc.password),
        timeout=10,
    )
    r.raise_for_status()


def _bmc_system(bmc: Any) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(
        bmc.system_url, auth=(bmc.user, bmc.password), timeout=10
    ).json()
    return data


def _until_long(
    ctx: Ctx, check: Callable[[], bool], what: str, component: str, timeout: float
) -> None:
    """Poll ``check`` (and the timeline) for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise StepMissed(what, timeout, component, ctx.log(component))
        ctx.tl.poll()
        time.sleep(0.5)


GANG = "gang"
"""The Kubernetes Indexed Job of the shared-queue scenario (its Slurm job: default/gang)."""
GANG_PRIORITY = 100
SBATCH_PRIORITY = 200
EARLIER_S = 8
"""How long the earlier job holds every node, so both newcomers wait in the queue."""


@dataclass(frozen=True)
class QueuedJob:
    """One line of ``squeue -o`` :data:`QUEUE_FORMAT` (times as Slurm prints them)."""

    job_id: int
    name: str
    state: str
    priority: int
    start: str
    end: str
    nodes: str


QUEUE_FORMAT = "%i|%j|%T|%Q|%S|%e|%N"


def queued(ctx: Ctx, *job_ids: int) -> dict[int, QueuedJob]:
    """What Slurm says of these jobs now, in any state it still lists."""
    ids = ",".join(map(str, job_ids))
    out = _slurm(ctx, "squeue", "-h", "--states=all", "-j", ids, "-o", QUEUE_FORMAT, check=False)
    found: dict[int, QueuedJob] = {}
    for line in out.splitlines():
        f = line.split("|")
        if len(f) == 7 and f[0].isdigit():
            found[int(f[0])] = QueuedJob(int(f[0]), f[1], f[2], int(f[3] or 0), *f[4:])
    return found


def gang_job(nodes: int) -> dict[str, Any]:
    """An Indexed Job of ``nodes`` pods, 8 GPUs each, that Slurm schedules as one job."""
    container = {
        "name": "train",
        "image": "example.invalid/trainer:1",
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }
    pod = {
        "metadata": {
            "annotations": {f"{well_known.SLURM_POD_ANNOTATION_PREFIX}priority": str(GANG_PRIORITY)}
        },
        "spec": {
            "schedulerName": well_known.POD_SCHEDULER_NAME,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": GANG, "namespace": "default"},
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,
            "template": pod,
        },
    }


def _gang_pods(ctx: Ctx) -> dict[str, str]:
    """The gang's pods -> their node ('' while unbound)."""
    items = (
        ctx.fleet.api.get(
            "/api/v1/namespaces/default/pods", params={"labelSelector": f"job-name={GANG}"}
        ).get("items")
        or []
    )
    return {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in items}


def shared_queue(ctx: Ctx) -> None:
    """An sbatch job and a Kubernetes gang wait in one Slurm queue; priority decides."""
    fleet, info = ctx.fleet, ctx.fleet.info
    n = len(info.node_names)
    fleet.start_pod_scheduler()
    ctx.tl.note(
        "demo",
        "gpufleet pod-scheduler running (Slurm schedules schedulerName "
        f"{well_known.POD_SCHEDULER_NAME})",
    )
    earlier = _slurm(
        ctx, "sbatch", "--parsable", f"--nodes={n}", "--gres=gpu:8", "--time=1",
        "--job-name=earlier-work", "--output=/dev/null", "--wrap", f"sleep {EARLIER_S}",
    ).strip().split(";")[0]  # fmt: skip
    ctx.tl.note("demo", f"sbatch earlier-work -> job {earlier} (every node, {EARLIER_S} s)")
    ctx.wait(
        "job-running",
        "the earlier job running",
        "slurmctld",
        30,
        match=lambda e: str(e.data.get("job")) == earlier,
    )
    api = fleet.api
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    try:
        api.create(jobs, gang_job(n), exist_ok=False)
        created = ctx.tl.note(
            "demo",
            f"Job {GANG} created: Indexed, {n} pods x 8 GPUs, schedulerName "
            f"{well_known.POD_SCHEDULER_NAME}, Slurm priority {GANG_PRIORITY}",
        )
        gang_id = 0

        def gang_submitted() -> bool:
            nonlocal gang_id
            out = _slurm(
                ctx,
                *("squeue", "-h", "--states=all", f"--name=default/{GANG}", "-o", "%i"),
                check=False,
            ).split()
            gang_id = int(out[0]) if out else 0
            return bool(gang_id)

        _until(ctx, gang_submitted, f"the Slurm job of Job {GANG} submitted", "pod-scheduler")
        ctx.tl.note("demo", f"job {gang_id} (default/{GANG}) submitted by the pod scheduler")
        sbatch_id = ctx.start_job(f"--priority={SBATCH_PRIORITY}")
        ctx.tl.note(
            "demo",
            f"job {sbatch_id} is sbatch's, priority {SBATCH_PRIORITY}: "
            f"submitted after job {gang_id}",
        )
        both = queued(ctx, gang_id, sbatch_id)
        for j in sorted(both.values(), key=lambda j: -j.priority):
            ctx.tl.note(
                "demo", f"squeue: job {j.job_id} ({j.name}) {j.state}, priority {j.priority}"
            )
        running = ctx.wait(
            "job-running",
            "the sbatch job running first",
            "slurmctld",
            60,
            match=lambda e: e.data.get("job") == sbatch_id,
        )
        waiting = queued(ctx, gang_id)[gang_id]
        unbound = [p for p, node in _gang_pods(ctx).items() if not node]
        ctx.tl.note(
            "demo",
            f"job {gang_id} (default/{GANG}) {waiting.state}; "
            f"{len(unbound)} of its pods Pending, none bound",
        )
        ctx.figures["gang_waited"] = waiting.state == "PENDING" and len(unbound) == n
        ctx.finish_job()
        ended = ctx.wait(
            "job-completed",
            "Slurm reporting the sbatch job COMPLETED",
            "slurmctld",
            30,
            match=lambda e: e.data.get("job") == sbatch_id,
        )
        _until(
            ctx,
            lambda: all(_gang_pods(ctx).values()) and len(_gang_pods(ctx)) == n,
            f"every pod of Job {GANG} bound",
            "pod-scheduler",
        )
        bound = ctx.tl.note(
            "demo", f"every pod of Job {GANG} bound: {sorted(set(_gang_pods(ctx).values()))}"
        )
        final = queued(ctx, gang_id, sbatch_id)
        ctx.figures.update(
            gang_job=gang_id,
            sbatch_job=sbatch_id,
            gang=final.get(gang_id),
            sbatch=final.get(sbatch_id),
            gang_nodes=sorted(set(_gang_pods(ctx).values())),
            gang_bound_s=bound.t - created.t,
            sbatch_running_s=running.t - created.t,
            gang_after_sbatch_s=bound.t - ended.t,
        )
        ctx.tl.idle(3)  # the pods finish (KWOK); the pod scheduler ends their Slurm job
    finally:
        api.delete(f"{jobs}/{GANG}?propagationPolicy=Background")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[Ctx], None]
    rule_actions: dict[str, str] = field(default_factory=dict)
    active_every_s: float = 0.0
    machines: int = 0
    """Real machines the fleet needs (qemu VMs; ``gpufleet local up --machines``)."""
    pod_scheduler: bool = False
    """The scenario starts ``gpufleet pod-scheduler``; the others run without it."""
    tenants: bool = False
    """The scenario needs a fleet of its own: Slurm 24.11 with accounting enforcing
    limits and the tenant controller, without the agents, controller and syncer
    (decision 0289)."""


MAINTENANCE_PLAN = "demo-driver-rollout"
ROLLOUT_LABEL = "demo.gpufleet.io/rollout"


def maintenance(ctx: Ctx) -> None:
    """A MaintenancePlan reboots every node (a driver update), two at a time (the budget)
    and never two of one InfiniBand leaf; a Slurm job holds its node until it ends: that
    node is drained in Slurm at once but rebooted only after the job, and the next batch
    starts only when every node of this one is verified and back."""
    api, info = ctx.fleet.api, ctx.fleet.info
    nodes = list(info.node_names)
    leaves = {n: f"leaf-{i // 2 + 1}" for i, n in enumerate(nodes)}
    plans = f"/apis/{well_known.GROUP}/{well_known.VERSION}/maintenanceplans"
    for node, leaf in leaves.items():
        labels = {well_known.LABEL_IB_LEAF: leaf, ROLLOUT_LABEL: "yes"}
        api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})
    budget = {"maxNodes": 2, "minNodes": 2, "maxPercent": 100}
    api.patch(
        f"/apis/{well_known.GROUP}/{well_known.VERSION}/fleetpolicies/{policy.POLICY_NAME}",
        {"spec": {"safety": {"budget": budget}}},
    )
    ctx.tl.note("demo", f"leaves: {', '.join(f'{n}={v}' for n, v in leaves.items())}; budget 2")
    try:
        out = subprocess.run(
            ["sbatch", "--parsable", "--output=/dev/null", "-w", nodes[0], "--wrap=sleep 8"],
            env=info.slurm_env(),
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        )
        job_id = int(out.stdout.strip().split(";")[0])
        ctx.tl.note("demo", f"sbatch -w {nodes[0]} --wrap 'sleep 8' -> job {job_id}")
        ctx.wait("job-running", "the job running", "slurmctld", 30)
        api.create(
            plans,
            {
                "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
                "kind": "MaintenancePlan",
                "metadata": {"name": MAINTENANCE_PLAN},
                "spec": {
                    "nodeSelector": {ROLLOUT_LABEL: "yes"},
                    "action": "reboot",
                    "maxUnavailable": 4,
                    "maxPerDomain": 1,
                    "maxFailures": 1,
                },
            },
        )
        ctx.tl.note(
            "demo",
            f"gpufleet maintenance create {MAINTENANCE_PLAN} --action reboot "
            f"-l {ROLLOUT_LABEL}=yes --max-unavailable 4 (leaf label {well_known.LABEL_IB_LEAF})",
        )
        ctx.wait("slurm-drain", f"{nodes[0]} drained in Slurm", "syncer", 20, node=nodes[0])
        done = ctx.wait("job-completed", "the job finishing on its own", "slurmctld", 30)
        for node in nodes:
            reset = ctx.wait(
                "bmc-reset", f"{node} rebooted via its BMC", "controller", 60, node=node
            )
            if node == nodes[0] and reset.t < done.t:
                raise RuntimeError(f"{node} was rebooted while its Slurm job ran")
            ctx.wait(
                "state",
                f"{node} verified and back in production",
                "controller",
                60,
                node=node,
                after=reset.t,
                match=lambda e: e.data.get("state") == "production",
            )

        def completed() -> bool:
            status = api.get(f"{plans}/{MAINTENANCE_PLAN}").get("status") or {}
            ctx.figures["plan"] = status
            return status.get("phase") == "Completed"

        _until(ctx, completed, f"{MAINTENANCE_PLAN} Completed", "controller")
        status = ctx.figures["plan"]
        ctx.tl.note(
            "demo",
            f"{MAINTENANCE_PLAN}: {status.get('phase')} {status.get('progress')}, "
            f"{status.get('failed')} failed",
        )
    finally:
        api.delete(f"{plans}/{MAINTENANCE_PLAN}")
        gone: dict[str, str | None] = {well_known.LABEL_IB_LEAF: None, ROLLOUT_LABEL: None}
        for node in nodes:
            api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": gone}})


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "xid79",
            "XID 79 under a 2-node training job: cordon, Slurm drain, requeue, reboot via the BMC, "
            "verification, back in production; the job resumes from its checkpoint",
            xid79,
        ),
        Scenario(
            "ib-flap",
            "InfiniBand link flaps: the first two are only Events, the third within 10 minutes "
            "takes the node out (repeat rule) and it is rebooted",
            ib_flap,
        ),
        Scenario(
            "ecc-uncorrectable",
            "an uncorrectable ECC error: the agent resets the GPU (no reboot), verification, back",
            ecc_uncorrectable,
        ),
        Scenario(
            "controller-crash-mid-remediation",
            "the controller is SIGKILLed during the remediation and restarted: it continues from "
            "the Node's record and the BMC sees exactly one power cycle",
            controller_crash,
            rule_actions={"xid79": "power-cycle"},
        ),
        Scenario(
            "fault-storm",
            "XID 79 on most nodes at once (a monitoring bug looks like this): the disruption "
            "budget and the circuit breaker stop gpufleet from draining the fleet",
            fault_storm,
        ),
        Scenario(
            "sdc-found-by-active-check",
            "silent data corruption on an idle node: no error is logged, the agent's idle-time "
            "GEMM check finds the GPU disagreeing with the reference, and the node goes to triage",
            sdc_found_by_active_check,
            active_every_s=5.0,
        ),
        Scenario(
            "straggler",
            "a GPU slows down without a word in any log: the agents compare each node's "
            "compute per step in the job's telemetry, report the slow node, and the third "
            "report takes it out; the job resumes on healthy nodes at full speed",
            straggler,
        ),
        Scenario(
            "replica-groups",
            "a torchft training of three replica groups (one Slurm job each): XID 79 under one "
            "group's node; the node is drained, the group leaves at a step boundary and is "
            "requeued, the other two keep training; the requeued group starts on the idle "
            "fourth node and copies the weights from a live peer; the training never stops",
            replica_scenarios.replica_groups,
        ),
        Scenario(
            "silent-corruption",
            "one bit of one replica group's weights flips on its node's GPU, silently: the "
            "node's agent compares the groups' weight fingerprints in the job telemetry and "
            "reports sdc-mismatch on that node",
            replica_scenarios.silent_corruption,
        ),
        Scenario(
            "slurm-health-drain",
            "Slurm's own health check (an LBNL NHC drain) takes a node out: the syncer reports "
            "it as a hardware fault, the controller reboots it via the BMC, verification, back "
            "in production and resumed in Slurm; an administrator's drain on another node is "
            "left alone",
            slurm_health_drain,
        ),
        Scenario(
            "preemption-by-inference-pod",
            "a high-priority inference Pod takes a node from a running Slurm job, which is "
            "requeued and resumes from its checkpoint when the Pod is gone",
            preemption,
        ),
        Scenario(
            "shared-queue",
            "an sbatch job and a Kubernetes Indexed Job (schedulerName gpufleet-slurm) wait in "
            "one Slurm queue: the sbatch job has the higher priority and runs first although "
            "it came later; the gang's pods stay Pending, then are bound all at once",
            shared_queue,
            pod_scheduler=True,
        ),
        Scenario(
            "new-machine",
            "a new machine joins: iPXE -> cloud-init with a single-use join token -> Node -> "
            "hardware checked against the inventory -> burn-in -> production",
            new_machine,
        ),
        Scenario(
            "real-machine",
            "a real machine (a qemu VM): BMC power-on -> PXE -> iPXE -> kernel, initrd and root "
            "image over HTTP -> cloud-init -> kubeadm join with a single-use token -> burn-in -> "
            "production; an XID 79 on it -> reimage through its BMC -> network boot -> production",
            real_machine,
            rule_actions={"xid79": "reimage"},
            machines=1,
        ),
        Scenario(
            "maintenance",
            "a MaintenancePlan reboots every node, two at a time and one per InfiniBand leaf; "
            "a running Slurm job's node is drained and waits for the job; each batch is "
            "verified before the next",
            maintenance,
        ),
        Scenario(
            "two-tenants",
            "two tenants share the fleet, vision with a quota of 8 GPUs and speech with 16: "
            "vision holds 4 in a pod and 4 in a Slurm job, then asks for more from kubectl "
            "and from sbatch and is refused by each with the reason; speech runs within its "
            "quota from both, unaffected",
            tenant_scenarios.two_tenants,
            tenants=True,
        ),
    )
}
