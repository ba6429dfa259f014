"""The cluster a run starts with, and the environment events a seed throws at it.

An environment event is something outside gpufleet that happens at a virtual time:
a GPU fault, a pod that lands with a preset ``nodeName`` and tolerations for
everything, a Slurm job, an administrator's drain or ``scontrol resume``, a
process killed, a second controller replica, a partition, the policy paused, a
forged write by another identity, slurmctld down, a BMC that refuses. A seed
draws a list of them (:func:`generate`); the shrinker deletes them one by one.
Each carries every number it needs, so deleting one never changes another.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from gpufleet.domain import agent_requests, departure, domain_burnin, well_known
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.operator import OperatorRequest
from gpufleet.domain.policy import Policy, load_policy
from gpufleet.domain.records import Incident, NodeRecord, StepAttempt, record_to_json
from gpufleet.domain.states import NodeState, Transition, Trigger
from gpufleet.dst import notices, pods
from gpufleet.dst.bmc import BmcModel
from gpufleet.dst.domain_faults import KINDS
from gpufleet.dst.domain_faults import inject as inject_fabric_fault
from gpufleet.dst.kube import PDB_LABEL, node_body
from gpufleet.dst.node import FAULTS
from gpufleet.dst.procs import (
    CONTROLLER_SETTINGS,
    LEASE_NAMESPACE,
    PLANS,
    POLICIES,
    agent_spec,
    controller_spec,
    syncer_spec,
)
from gpufleet.dst.quarantine import with_quarantine
from gpufleet.dst.slurmd import OPERATOR, SlurmdFleet
from gpufleet.dst.world import GPU_ANNOTATION, World
from gpufleet.kubeapi import LEASES, NODES, PODS, SECRETS, Forbidden, NotFound
from gpufleet.kubeapi.secrets import encode_data

ADMIN = "admin"
INTRUDER = "intruder"
WORK_NS = "work"
BMC_NS = "gpufleet-bmc"


@functools.cache
def _default_spec_text() -> str:
    return json.dumps(yaml.safe_load(DEFAULT_POLICY_YAML))


RACK = "example.com/rack"
"""The label a run with ``groups`` puts on its Nodes: rack a (the first half), rack b."""

RACK_A_OVERRIDE: dict[str, Any] = {
    "name": "rack-a",
    "nodeSelector": {"matchLabels": {RACK: "a"}},
    "budget": {"maxNodes": 1},
    "rules": [{"match": {"xid": 79}, "action": "reimage"}],
}
"""A run with ``groups``: rack a's nodes have a budget of one node of their own (on top of
the pool's two) and go straight to a reimage on XID 79 (docs/policy.md, "Node groups")."""


def rack_of(index: int, nodes: int) -> str:
    """The rack of the ``index``-th node in a run with ``groups``."""
    return "a" if index < (nodes + 1) // 2 else "b"


NVLINK_DOMAIN = "network.topology.nvidia.com/accelerator"
"""The label a run with ``domains`` puts on its Nodes (the per-domain budget's default key)."""


DOMAIN_PLAN: dict[str, Any] = {
    "metadata": {"name": "nvswitch-fw", "generation": 1},
    "spec": {
        "nodeSelector": {},
        "scope": "nvlinkDomain",
        "action": "command",
        "command": "nvswitch-fw",
        "commandTimeoutSeconds": 60,
        "maxFailures": 4,
    },
}
"""The MaintenancePlan of a run with ``domain_plan``: every node, a whole domain at a time."""


def nvlink_domain_of(index: int) -> str:
    """The NVLink domain of the ``index``-th node in a run with ``domains``: nodes
    alternate between two domains, so each domain spans both racks of a run with
    ``groups`` too."""
    return f"nvl72-{index % 2}"


def dst_policy_spec(
    breaker_min_nodes: int = 2,
    groups: bool = False,
    domains: bool = False,
    domain_burn_in: bool = False,
) -> dict[str, Any]:
    """The default policy with times a run can reach: short ladder timeouts, a quick
    clear, a budget of two nodes out of four, a breaker that trips at three faulting
    nodes (``breaker_min_nodes`` + 1); with ``groups``, the override of rack a; with
    ``domains``, at most one node of an NVLink domain out at once; with ``domain_burn_in``,
    both trays of a domain may be out and a domain with none in production is burnt in
    as a unit before its trays return (decision 0247)."""
    spec: dict[str, Any] = json.loads(_default_spec_text())
    spec["ladder"] = [
        {"step": "gpu-reset", "timeoutSeconds": 60, "attempts": 1},
        {"step": "reboot", "timeoutSeconds": 120, "attempts": 1},
        {"step": "power-cycle", "timeoutSeconds": 120, "attempts": 1},
        {"step": "reimage", "timeoutSeconds": 180, "attempts": 1, "onFailure": "triage"},
    ]
    spec["detection"]["clearAfterSeconds"] = 20
    spec["checks"]["verificationTimeoutSeconds"] = 120
    spec["drain"]["timeoutSeconds"] = 120
    spec["safety"] = {
        "budget": {"maxNodes": 2, "maxPercent": 50, "minNodes": 1},
        "breaker": {
            "maxNodes": 2,
            "maxPercent": 10,
            "minNodes": breaker_min_nodes,
            "windowSeconds": 300,
            "cooldownSeconds": 120,
        },
        "rateLimit": {"maxActions": 30, "windowSeconds": 600},
    }
    if groups:
        spec["overrides"] = [RACK_A_OVERRIDE]
    if domains:
        spec["safety"]["budget"]["perDomain"] = {"maxNodes": 1}
    if domain_burn_in:
        spec["safety"]["budget"]["perDomain"] = {"maxNodes": 2}
        spec["checks"]["domainBurnIn"] = {"required": True}
    return spec


@functools.cache
def dst_policy(
    breaker_min_nodes: int = 2,
    groups: bool = False,
    domains: bool = False,
    domain_burn_in: bool = False,
) -> Policy:
    spec = dst_policy_spec(breaker_min_nodes, groups, domains, domain_burn_in)

    return load_policy(yaml.safe_dump(spec), "dst policy")


@dataclass(frozen=True)
class Config:
    """The shape of a run."""

    nodes: int = 4
    duration: float = 900.0
    """Virtual seconds of environment events."""
    calm_s: float = 200.0
    """Quiet seconds at the end (processes back, nothing injected) before the final checks."""
    rate_per_min: float = 8.0
    """Environment events per virtual minute."""
    admission: bool = True
    """The chart's admission policy holds: only the controller's account may write a
    Node's record, BMC mark and agent request (``deploy/controller/rbac.yaml``)."""
    breaker_min_nodes: int = 2
    """The breaker tolerates this many faulting nodes in its window (4: never trips here)."""
    groups: bool = False
    """Nodes in two racks and a FleetPolicy override for rack a (:data:`RACK_A_OVERRIDE`):
    invariant 4 holds per node group too; off by default, so a recorded seed replays the
    same story."""
    domains: bool = False
    """Nodes in two NVLink domains (:func:`nvlink_domain_of`) and a per-domain budget of
    one node: invariant 4 holds per domain too; off by default, so a recorded seed
    replays the same story."""
    domain_burn_in: bool = False
    """With ``domains``: both trays of a domain may be out, a tray of a domain with none in
    production waits for the domain's burn-in, and the environment's ``domain-burn-in``
    keeps verdicts on them (invariant 8); off by default, so a recorded seed replays the
    same story."""
    domain_plan: bool = False
    """With ``domains``: a MaintenancePlan of scope nvlinkDomain (:data:`DOMAIN_PLAN`) that
    empties each NVLink domain in turn, runs a command on its trays and returns them
    together (invariant 12); off by default, so a recorded seed replays the same story."""
    slurmd_roll: bool = False
    """The chart's slurmd DaemonSet on every node and the Slurm operator rolling it
    (:mod:`gpufleet.dst.slurmd`, invariant 7); off by default, so a recorded seed, drawn
    without it, replays the same story."""
    quarantine: bool = False
    """The FleetPolicy quarantines one GPU for the faults that allow it and repairs it a
    minute later (:mod:`gpufleet.dst.quarantine`, invariant 9); off by default, so a
    recorded seed replays the same story."""
    pod_scheduler: bool = False
    """The pod scheduler runs and the environment makes pod groups for it
    (:mod:`gpufleet.dst.pods`, invariants 14-16); off by default, so a recorded seed
    replays the same story."""
    device_taints: bool = False
    """The controllers keep one DRA DeviceTaintRule per quarantined GPU (with
    ``quarantine``; :mod:`gpufleet.dst.dra_checks`, invariant 13); off by default, so a
    recorded seed replays the same story."""
    weights: dict[str, int] = field(
        default_factory=lambda: {
            "fault": 14,
            "pod": 10,
            "job": 14,
            "resume": 4,
            "admin-drain": 1,
            "admin-taint": 2,
            "kill": 5,
            "replica": 2,
            "partition": 2,
            "pause": 3,
            "forge": 1,
            "slurm-down": 1,
            "bmc-refuse": 2,
            "operator": 3,
            "pdb": 1,
            "lease": 1,
            # The slurmd roll's (drawn only with weights given, see ROLL_WEIGHTS): a
            # zero weight at the end changes no other draw.
            "upgrade": 0,
            "roll-pause": 0,
            "roll-dry-run": 0,
            "roll-kill": 0,
            "domain-burn-in": 0,
            "domain-fault": 0,  # with_domain_faults (dst.domain_faults)
            "pod-group": 0,  # with_pod_scheduler (dst.pods)
            "pod-kill": 0,
        }
    )


POD_WEIGHTS = {"pod-group": 10, "pod-kill": 2}
"""A run with ``pod_scheduler`` (:func:`with_pod_scheduler`): a pod group for the pod
scheduler, the pod scheduler killed."""


def with_pod_scheduler(cfg: Config | None = None, **weights: int) -> Config:
    """``cfg`` with the pod scheduler and its pod groups (``weights`` override them)."""
    base = cfg or Config()
    return replace(base, pod_scheduler=True, weights={**base.weights, **POD_WEIGHTS, **weights})


ROLL_WEIGHTS = {"upgrade": 4, "roll-pause": 2, "roll-dry-run": 1, "roll-kill": 2}
"""The roll's events in a run with ``slurmd_roll`` (:func:`with_roll`): a ``helm upgrade``
of the slurmd pods, the roll paused, the operator in dry-run, the operator killed."""


def with_domain_burn_in(cfg: Config | None = None, weight: int = 6) -> Config:
    """``cfg`` with NVLink domains burnt in as a unit and an operator's verdicts on them."""
    base = cfg or Config()
    return replace(
        base,
        domains=True,
        domain_burn_in=True,
        weights={**base.weights, "domain-burn-in": weight},
    )


def with_roll(cfg: Config | None = None, **weights: int) -> Config:
    """``cfg`` with the slurmd roll and its events (``weights`` override them)."""
    base = cfg or Config()
    return replace(base, slurmd_roll=True, weights={**base.weights, **ROLL_WEIGHTS, **weights})


@dataclass(frozen=True)
class Env:
    """One environment event."""

    at: float
    kind: str
    args: tuple[Any, ...] = ()

    def text(self) -> str:
        return f"{self.kind} " + " ".join(str(a) for a in self.args)


def generate(seed: int, cfg: Config) -> list[Env]:
    """The environment events of a seed."""
    rng = random.Random(f"env-{seed}")
    names = [f"n{i + 1}" for i in range(cfg.nodes)]
    kinds = list(cfg.weights)
    weights = [cfg.weights[k] for k in kinds]
    out: list[Env] = []
    t = rng.uniform(5, 30)
    while t < cfg.duration:
        kind = rng.choices(kinds, weights)[0]
        node = rng.choice(names)
        ev: Env
        if kind == "fault":
            ev = Env(t, kind, (node, rng.choice(sorted(FAULTS)), rng.randrange(8)))
        elif kind == "pod":
            ev = Env(
                t, kind, (node, rng.random() < 0.5, rng.random() < 0.3, round(rng.uniform(20, 400)))
            )
        elif kind == "job":
            ev = Env(
                t,
                kind,
                (
                    rng.randrange(1000),
                    rng.random() < 0.6,
                    rng.random() < 0.85,
                    round(rng.uniform(20, 600)),
                ),
            )
        elif kind == "kill":
            proc = rng.choice(["ctl-1", "ctl-1", "syncer", f"agent-{node}"])
            ev = Env(t, kind, (proc, round(rng.choice([2, 10, 40, 90]))))
        elif kind == "replica":
            ev = Env(t, kind, (round(rng.uniform(60, 400)),))
        elif kind == "partition":
            ev = Env(t, kind, (rng.choice(["ctl-1", "ctl-2", "syncer"]), round(rng.uniform(5, 90))))
        elif kind == "pause":
            ev = Env(t, kind, (round(rng.uniform(10, 200)),))
        elif kind == "forge":
            ev = Env(t, kind, (node, rng.choice(["record-reboot", "gpu-reset-request"])))
        elif kind == "slurm-down":
            ev = Env(t, kind, (rng.choice(["ctld", "restd"]), round(rng.uniform(5, 120))))
        elif kind == "bmc-refuse":
            ev = Env(
                t,
                kind,
                (
                    node,
                    rng.choice(["GracefulRestart", "PowerCycle", "ForceOff"]),
                    round(rng.uniform(30, 400)),
                ),
            )
        elif kind == "operator":
            ev = Env(
                t,
                kind,
                (node, rng.choice(["triage", "triage", "dismiss"]), round(rng.uniform(60, 300))),
            )
        elif kind == "pdb":
            ev = Env(t, kind, (round(rng.uniform(10, 120)),))
        elif kind == "admin-drain":
            ev = Env(t, kind, (node, round(rng.uniform(30, 300))))
        elif kind == "lease":
            ev = Env(t, kind, ())
        elif kind == "admin-taint":
            ev = Env(t, kind, (node, rng.choice(["taint", "cordon"])))
        elif kind in ("roll-pause", "roll-dry-run"):
            ev = Env(t, kind, (round(rng.uniform(10, 200)),))
        elif kind == "roll-kill":
            ev = Env(t, kind, (round(rng.choice([2, 10, 40, 90])),))
        elif kind == "domain-fault":
            count = rng.choice([1, 2, 2])
            ev = Env(t, kind, (nvlink_domain_of(rng.randrange(2)), rng.choice(KINDS), count))
        elif kind == "domain-burn-in":
            verdict = rng.choice(["pass", "pass", "fail-named", "fail"])
            ev = Env(t, kind, (nvlink_domain_of(rng.randrange(2)), verdict, node))
        elif kind == "upgrade":
            ev = Env(t, kind, ())
        elif kind == "pod-group":
            ev = Env(
                t, kind, (rng.choice([1, 1, 2]), rng.random() < 0.7, round(rng.uniform(20, 300)))
            )
        elif kind == "pod-kill":
            ev = Env(t, kind, (round(rng.choice([2, 10, 40])),))
        else:
            ev = Env(t, kind, (node,))
        out.append(replace(ev, at=round(ev.at, 3)))
        t += rng.expovariate(cfg.rate_per_min / 60.0)
    return out


# ------------------------------------------------------------------- set-up


def build(world: World, cfg: Config, seed: int) -> Policy:
    """The cluster at virtual time 0: Nodes, BMCs and their Secrets, the FleetPolicy,
    the admission policy, and the processes (one controller, the syncer, the agents)."""
    rng = random.Random(f"build-{seed}")
    api = world.api
    policy = dst_policy(cfg.breaker_min_nodes, cfg.groups, cfg.domains, cfg.domain_burn_in)
    spec = dst_policy_spec(cfg.breaker_min_nodes, cfg.groups, cfg.domains, cfg.domain_burn_in)
    if cfg.quarantine:
        spec = with_quarantine(spec)
        policy = load_policy(yaml.safe_dump(spec), "dst policy")
    api.create(ADMIN, POLICIES, {"metadata": {"name": "default"}, "spec": spec}, None)
    if cfg.domain_plan:
        api.create(ADMIN, PLANS, DOMAIN_PLAN, None)
    if cfg.admission:
        api.admission.append(records_admission)
    for name in world.node_names:
        endpoint = f"https://bmc-{name}.dst"
        api.create(
            ADMIN,
            SECRETS,
            {
                "metadata": {"name": f"bmc-{name}"},
                "data": encode_data({"endpoint": endpoint, "username": "u", "password": "p"}),
            },
            BMC_NS,
        )
        body = node_body(
            name, annotations={well_known.ANNOTATION_BMC_SECRET: f"{BMC_NS}/bmc-{name}"}
        )
        body["metadata"]["labels"][well_known.LABEL_SLURM_CLUSTER] = "dst"
        if cfg.groups:
            index = world.node_names.index(name)
            body["metadata"]["labels"][RACK] = rack_of(index, len(world.node_names))
        if cfg.domains:
            index = world.node_names.index(name)
            body["metadata"]["labels"][NVLINK_DOMAIN] = nvlink_domain_of(index)
        api.create("kubelet", NODES, body, None)
        allowed: tuple[str, ...] = (
            "On",
            "ForceOff",
            "GracefulRestart",
            "ForceRestart",
            "PowerCycle",
        )
        if rng.random() < 0.25:
            allowed = ("On", "ForceOff", "GracefulRestart", "ForceRestart")
        world.add_bmc(
            BmcModel(
                node=name,
                endpoint=endpoint,
                serial=f"SN-{name}",
                reports_reset_time=rng.random() < 0.75,
                allowed=allowed,
                shutdown_s=rng.choice([2.0, 8.0, 30.0]),
            )
        )
        world.add_process(f"agent-{name}", agent_spec(name, policy))
    settings = replace(CONTROLLER_SETTINGS, device_taints=cfg.device_taints)
    world.add_process("ctl-1", controller_spec(settings))
    world.add_process("ctl-2", controller_spec(settings))
    world.add_process("syncer", syncer_spec())
    for name in world.node_names:
        world.start(f"agent-{name}")
    world.start("syncer")
    world.start("ctl-1")
    if cfg.slurmd_roll:
        SlurmdFleet(world).install()
    if cfg.pod_scheduler:
        pods.install(world)
    notices.install(world)
    return policy


# -------------------------------------------------------------------- events


def apply(world: World, ev: Env) -> None:
    """Carry out one environment event now."""
    handler = _HANDLERS[ev.kind]
    world.trace.add("env", ev.text(), handler(world, *ev.args), key=True)


def _fault(world: World, node: str, kind: str, gpu: int) -> str:
    world.hw[node].inject(kind, world.clock.now(), gpu)
    return "logged by the kernel"


def _pod(world: World, node: str, gpu: bool, pdb: bool, lifetime: float) -> str:
    name = f"job-{node}-{int(world.loop.time() * 1000)}"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {PDB_LABEL: "block"} if pdb else {},
            "annotations": {GPU_ANNOTATION: "true" if gpu else "false"},
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "train"}],
        },
        "status": {"phase": "Running"},
    }
    world.api.create("scheduler", PODS, body, WORK_NS)

    def done() -> None:
        pod = world.api.find(PODS, name, WORK_NS)
        if pod is not None and not pod["metadata"].get("deletionTimestamp"):
            world.api.patch(
                "kubelet",
                PODS,
                name,
                {"status": {"phase": "Succeeded"}},
                namespace=WORK_NS,
                status=True,
            )
            world.trace.add("kubelet", f"pod {WORK_NS}/{name}", "Succeeded", key=True)

    world.loop.call_later(lifetime, done)
    return f"pod {WORK_NS}/{name} running on {node} (gpu={gpu}, pdb={pdb})"


def _job(world: World, pick: int, uses_gpu: bool, requeueable: bool, lifetime: float) -> str:
    candidates = world.slurm.candidates()
    if not candidates:
        return "no idle undrained node: stays pending"
    node = candidates[pick % len(candidates)]
    # A third of the requeueable jobs ask for a departure notice (dst.notices): most leave
    # 1-12 s after it (exit 75), one in nine finishes its work then instead (exit 0: not
    # to be requeued, invariant 18), a third ignore it. Drawn from ``pick``.
    notice = requeueable and pick % 3 == 0
    depart_s = None if pick % 9 == 0 else float(1 + pick % 12)
    code = 0 if pick % 27 == 6 else departure.DEPARTED_EXIT_CODE
    job = world.slurm.start_job(
        node,
        requeueable=requeueable,
        uses_gpu=uses_gpu,
        notice=notice,
        depart_s=depart_s,
        depart_code=code,
    )

    def done() -> None:
        if world.slurm.end_job(job.id) is not None:
            world.trace.add("slurmctld", f"job {job.id} on {node}", "completed", key=True)

    world.loop.call_later(lifetime, done)
    asks = ", notice" if notice else ""
    return f"job {job.id} started on {node} (gpu={uses_gpu}, requeueable={requeueable}{asks})"


def _resume(world: World, node: str) -> str:
    n = world.slurm.nodes[node]
    was = f"{n.state}{'+DRAIN' if 'DRAIN' in n.flags else ''} ({n.reason})"
    world.slurm.admin_resume(node)
    return f"scontrol update nodename={node} state=resume (was {was})"


def _admin_drain(world: World, node: str, seconds: float) -> str:
    world.slurm.admin_drain(node, "admin: bios update")

    def undo() -> None:
        if (world.slurm.nodes[node].reason or "").startswith("admin: bios update"):
            world.slurm.admin_resume(node)

    world.loop.call_later(seconds, undo)
    return f"drained by an admin for {seconds:g}s"


def _admin_taint(world: World, node: str, what: str) -> str:
    obj = world.api.find(NODES, node)
    if obj is None:
        return "no such node"
    if what == "cordon":
        world.api.patch(ADMIN, NODES, node, {"spec": {"unschedulable": True}})
        return "cordoned by an admin"
    taints = list((obj.get("spec") or {}).get("taints") or [])
    taints.append({"key": "example.com/maintenance", "value": "admin", "effect": "NoSchedule"})
    world.api.patch(ADMIN, NODES, node, {"spec": {"taints": taints}})
    return "tainted example.com/maintenance by an admin"


def _kill(world: World, proc: str, down_s: float) -> str:
    if proc not in world.procs or not world.procs[proc].alive:
        return "not running"
    world.kill(proc, restart_s=down_s, why="killed by the environment")
    return f"back in {down_s:g}s"


def _replica(world: World, lifetime: float) -> str:
    p = world.procs.get("ctl-2")
    if p is not None and p.alive:
        return "already running"
    world.start("ctl-2")
    world.loop.call_later(lifetime, lambda: world.kill("ctl-2", restart_s=None, why="scaled down"))
    return f"second controller replica for {lifetime:g}s"


def _partition(world: World, proc: str, seconds: float) -> str:
    world.partition(proc, seconds)
    return f"cut from the apiserver for {seconds:g}s"


def _pause(world: World, seconds: float) -> str:
    world.api.patch(ADMIN, POLICIES, "default", {"spec": {"paused": True}})

    def unpause() -> None:
        world.api.patch(ADMIN, POLICIES, "default", {"spec": {"paused": False}})
        world.trace.add("env", "unpause", "FleetPolicy paused=false", key=True)

    world.loop.call_later(seconds, unpause)
    return f"FleetPolicy paused for {seconds:g}s"


def _forge(world: World, node: str, what: str) -> str:
    """Another identity writes gpufleet's annotations (a record, a request) on a Node."""
    now = world.clock.now()
    fault = FaultEvent(FaultKind.XID, node, now, xid=79, evidence=Evidence(gpu_index=0))
    step = Step.REBOOT if what == "record-reboot" else Step.GPU_RESET
    inc = Incident(
        key=fault.key,
        description="xid79 gpu0",
        opened_at=now,
        plan=step,
        drained=True,
        current=step,
        tried=(StepAttempt(step=step, attempt=1, started_at=now),),
    )
    t = Transition(
        NodeState.DRAINING, NodeState.REMEDIATING, Trigger.DRAIN_COMPLETED, "forged", now
    )
    rec = NodeRecord(
        name=node,
        state=NodeState.REMEDIATING,
        since=now,
        reason="forged",
        incident=inc,
        history=(t,),
    )
    ann: dict[str, str] = {well_known.ANNOTATION_RECORD: record_to_json(rec)}
    if step is Step.GPU_RESET:
        req = agent_requests.issue(rec, "gpu-reset", gpu_index=0)
        assert req is not None
        ann[well_known.ANNOTATION_AGENT_REQUEST] = req.encode()
    try:
        world.api.patch(
            INTRUDER,
            NODES,
            node,
            {"metadata": {"annotations": ann, "labels": {well_known.LABEL_STATE: "remediating"}}},
        )
    except Forbidden as exc:
        return f"{INTRUDER}'s record refused by admission: {exc}"
    return f"{INTRUDER} wrote a record (remediating, {step} in progress)" + (
        " and a bound gpu-reset request" if step is Step.GPU_RESET else ""
    )


def _slurm_down(world: World, which: str, seconds: float) -> str:
    setattr(world.slurm, f"{which}_down", True)

    def up() -> None:
        setattr(world.slurm, f"{which}_down", False)
        world.trace.add("env", f"slurm{which} up", "answering again", key=True)

    world.loop.call_later(seconds, up)
    return f"slurm{which} down for {seconds:g}s"


def _bmc_refuse(world: World, node: str, reset_type: str, seconds: float) -> str:
    m = world.bmc_of(node)
    m.refused.add(reset_type)
    world.loop.call_later(seconds, lambda: m.refused.discard(reset_type))
    return f"BMC refuses {reset_type} for {seconds:g}s"


def _domain_fault(world: World, domain: str, kind: str, count: int) -> str:
    """The agents of ``count`` trays of ``domain`` log fabric fault ``kind`` at once."""
    trays = sorted(
        str(n["metadata"]["name"])
        for n in world.api.all(NODES)
        if ((n["metadata"].get("labels") or {}).get(NVLINK_DOMAIN)) == domain
    )
    return inject_fabric_fault(world, tuple(trays[:count]), kind)


def _domain_burn_in(world: World, domain: str, verdict: str, named: str) -> str:
    """``gpufleet burn-in domain``: an operator keeps a verdict on every tray of ``domain``
    (``fail-named`` names ``named`` if it is a tray of it). Nothing runs on the trays: the
    run itself is the local cluster's test; here only its verdict meets the controller."""
    trays = [
        str(n["metadata"]["name"])
        for n in world.api.all(NODES)
        if ((n["metadata"].get("labels") or {}).get(NVLINK_DOMAIN)) == domain
    ]
    bad = (named,) if verdict == "fail-named" and named in trays else ()
    kept = domain_burnin.Recorded(
        domain, verdict == "pass", world.clock.now(), f"dst: {verdict}", bad
    ).to_json()
    for t in trays:
        world.api.patch(
            ADMIN,
            NODES,
            t,
            {"metadata": {"annotations": {well_known.ANNOTATION_DOMAIN_BURN_IN: kept}}},
        )
    return f"verdict {verdict} kept on {', '.join(trays) or 'no tray'}" + (
        f" naming {bad[0]}" if bad else ""
    )


def _operator(world: World, node: str, verb: str, later_s: float) -> str:
    """``gpufleet node VERB``; a triage is returned ``later_s`` afterwards."""

    def request(v: str) -> None:
        req = OperatorRequest(v, "dst", "alice", world.clock.now(), f"r{int(world.loop.time())}")
        if world.api.find(NODES, node) is not None:
            world.api.patch(
                ADMIN,
                NODES,
                node,
                {
                    "metadata": {
                        "annotations": {well_known.ANNOTATION_OPERATOR_REQUEST: req.encode()}
                    }
                },
            )

    request(verb)
    if verb == "triage":

        def back() -> None:
            request("return")
            world.trace.add("env", f"operator return {node}", "requested", key=True)

        world.loop.call_later(later_s, back)
        return f"gpufleet node triage {node} (return in {later_s:g}s)"
    return f"gpufleet node {verb} {node}"


def _lease(world: World) -> str:
    """Someone deletes the controller's Lease (an admin, a namespace clean-up)."""
    name = CONTROLLER_SETTINGS.lease
    if world.api.find(LEASES, name, LEASE_NAMESPACE) is None:
        return "no Lease to delete"
    world.api.delete(ADMIN, LEASES, name, LEASE_NAMESPACE)
    return f"Lease {LEASE_NAMESPACE}/{name} deleted"


PROTECTED = (
    well_known.ANNOTATION_RECORD,
    well_known.ANNOTATION_RECORD_SIGNATURE,
    well_known.ANNOTATION_BMC_ACTION,
    well_known.ANNOTATION_BMC_ACTION_SIGNATURE,
    well_known.ANNOTATION_AGENT_REQUEST,
)


def records_admission(identity: str, resource: str, before: Any, after: Any) -> str | None:
    """The chart's ValidatingAdmissionPolicy ``<release>-controller-records``: a Node
    write by anyone but the controller may not change the protected annotations."""
    if resource != str(NODES) or identity == well_known.CONTROLLER or after is None:
        return None

    def ann(obj: Any) -> dict[str, str]:
        return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})

    old, new = ann(before), ann(after)
    changed = [k for k in PROTECTED if old.get(k, "") != new.get(k, "")]
    if changed:
        return f"only the gpufleet lifecycle controller may write {', '.join(changed)}"
    return None


def _pdb(world: World, seconds: float) -> str:
    world.api.pdb_open_at = world.loop.time() + seconds
    return f"PodDisruptionBudgets refuse evictions for {seconds:g}s"


def _roll(world: World, *args: float, what: str) -> str:
    fleet = world.slurmd
    if fleet is None:
        return "no slurmd DaemonSet in this run"
    if what == "upgrade":
        return fleet.upgrade()
    if what == "roll-pause":
        return fleet.pause(args[0])
    if what == "roll-dry-run":
        return fleet.dry_run_for(args[0])
    return _kill(world, OPERATOR, args[0])


_HANDLERS: dict[str, Any] = {
    "fault": _fault,
    "pod": _pod,
    "job": _job,
    "resume": _resume,
    "admin-drain": _admin_drain,
    "admin-taint": _admin_taint,
    "kill": _kill,
    "replica": _replica,
    "partition": _partition,
    "pause": _pause,
    "forge": _forge,
    "slurm-down": _slurm_down,
    "bmc-refuse": _bmc_refuse,
    "operator": _operator,
    "pdb": _pdb,
    "lease": _lease,
    "domain-burn-in": _domain_burn_in,
    "domain-fault": _domain_fault,
    "pod-group": lambda world, *args: pods.pod_group(world, *args),
    "pod-kill": lambda world, down_s: _kill(world, pods.PROC, down_s),
    **{k: functools.partial(_roll, what=k) for k in ROLL_WEIGHTS},
}

__all__ = [
    "POD_WEIGHTS",
    "ROLL_WEIGHTS",
    "Config",
    "Env",
    "NotFound",
    "apply",
    "build",
    "dst_policy",
    "generate",
    "with_pod_scheduler",
    "with_roll",
]
