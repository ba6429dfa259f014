"""Run demo scenarios on a fresh local cluster and print the timeline and summary."""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpufleet.demo import job, kube, policy
from gpufleet.demo.fleet import Fleet
from gpufleet.demo.observe import Entry, Observer
from gpufleet.demo.scenarios import SCENARIOS, Ctx, Scenario
from gpufleet.demo.timeline import StepMissed, Timeline
from gpufleet.local.processes import ComponentError


@dataclass
class ScenarioResult:
    name: str
    seconds: float
    figures: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)
    t0: float = 0.0


class Demo:
    """One fleet, any number of scenarios run on it one after another."""

    def __init__(self, fleet: Fleet, console: Console) -> None:
        self.fleet = fleet
        self.console = console
        self.dirty = False
        """Whether a scenario ran since start-up (the next one needs a reset)."""

    @classmethod
    def start(
        cls,
        *,
        nodes: int,
        run_dir: Path,
        console: Console,
        machines: int = 0,
        tenants: bool = False,
    ) -> Demo:
        """The fleet; with ``tenants`` the one the tenants' scenario needs (Slurm 24.11
        with accounting enforcing limits, the tenant controller; no agents, controller
        or syncer: decision 0289)."""
        t0 = time.monotonic()
        extra = f" and {machines} real machine(s)" if machines else ""
        extra += ", Slurm 24.11 with accounting enforcing limits" if tenants else ""
        console.print(
            f"[bold]Starting the local cluster[/bold] ({nodes} GPU nodes{extra}) in {run_dir}"
        )
        fleet = Fleet.start(
            nodes=nodes,
            run_dir=run_dir,
            progress=lambda m: console.print(f"  {m}"),
            machines=machines,
            tenants=tenants,
        )
        demo = cls(fleet, console)
        if tenants:
            console.print(
                f"  tenant controller running (set-up took {time.monotonic() - t0:.1f} s)"
            )
            return demo
        try:
            fleet.apply_policy(policy.demo_policy_spec())
            fleet.start_agents()
            fleet.start_controller()
            fleet.start_syncer()
            fleet.wait_ready()
        except BaseException:
            fleet.stop()
            raise
        console.print(
            f"  agents ({nodes}), controller and syncer running "
            f"(set-up took {time.monotonic() - t0:.1f} s)"
        )
        return demo

    def _health(self) -> None:
        dead = self.fleet.dead_component()
        if dead is not None:
            raise ComponentError(dead.name, dead.log, f"exited with code {dead.poll()}")

    def prepare(self, scenario: Scenario) -> None:
        """Bring the fleet to a clean start for ``scenario``: no job, no incident, every
        node in production and idle in Slurm, agents with fresh memories."""
        fleet = self.fleet
        spec = policy.demo_policy_spec(**scenario.rule_actions)
        if scenario.machines:
            # A reimaged real machine boots again (minutes under software emulation)
            # before it can be verified; the demo's one-minute limits are for KWOK nodes.
            spec["checks"]["verificationTimeoutSeconds"] = 1800
            for entry in spec["ladder"]:
                entry["timeoutSeconds"] = 1800
        if not scenario.pod_scheduler:
            fleet.stop_pod_scheduler()
        if not self.dirty and not scenario.rule_actions and not scenario.active_every_s:
            return
        job.cancel_all(fleet.info)
        fleet.remove_joining()
        fleet.stop_controller()
        for proc in fleet.agents.values():
            proc.stop(grace=3)
        with contextlib.suppress(Exception):
            for pod in fleet.api.get("/api/v1/namespaces/default/pods").get("items") or []:
                fleet.api.delete(
                    f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}"
                    "?gracePeriodSeconds=0"
                )
        for node in fleet.info.node_names:
            kube.reset_node(fleet.api, node)
        kube.delete_remediations(fleet.api)
        fleet.apply_policy(spec)
        fleet.start_agents(active_every_s=scenario.active_every_s)
        fleet.start_controller()
        fleet.wait_ready()
        _wait_slurm_idle(fleet)

    def run(self, name: str) -> ScenarioResult:
        scenario = SCENARIOS[name]
        if scenario.tenants != self.fleet.tenants:
            raise ValueError(
                f"scenario {name} needs a fleet started with tenants={scenario.tenants}"
                " (Demo.start): the tenants' fleet runs another Slurm and no agents"
            )
        self.prepare(scenario)
        self.dirty = True
        workdir = self.fleet.info.run_dir / "demo" / name
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        observer = Observer(self.fleet.info, self.fleet.api, policy_name=policy.POLICY_NAME)
        tl = Timeline(observer, self.console, health=self._health)
        self.console.print(f"\n[bold]Scenario {name}[/bold]: {scenario.summary}")
        tl.prime()
        tl.t0 = time.time()
        ctx = Ctx(self.fleet, tl, workdir)
        try:
            scenario.run(ctx)
        finally:
            observer.close()
        seconds = time.time() - tl.t0
        result = ScenarioResult(name, seconds, ctx.figures, tl.entries, tl.t0)
        print_summary(self.console, result)
        return result

    def stop(self) -> None:
        self.fleet.stop()


def _wait_slurm_idle(fleet: Fleet, timeout: float = 30) -> None:
    import subprocess

    def idle() -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            env=fleet.info.slurm_env(),
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split()
        return bool(out) and all(s == "idle" for s in out[1::2])

    kube.wait("every Slurm node idle", idle, timeout)


def print_summary(console: Console, r: ScenarioResult) -> None:
    f = r.figures
    table = Table(title=f"Summary: {r.name}", box=None, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()

    def add(label: str, key: str, fmt: str = "{:.2f} s") -> None:
        if f.get(key) is not None:
            table.add_row(label, fmt.format(f[key]))

    add("time to detect (fault -> Node condition)", "detect_s")
    add("time to isolate (-> cordoned + drained in Slurm)", "isolate_s")
    add("time to recover the job (-> resumed from checkpoint)", "job_back_s")
    add("time to recover the node (-> production, resumed in Slurm)", "node_back_s")
    add("Pod pending -> Running on a node taken from Slurm", "pod_running_s")
    add("gang created -> the higher-priority sbatch job running", "sbatch_running_s")
    add("gang created -> every pod bound (it waited its turn)", "gang_bound_s")
    add("sbatch job COMPLETED -> every pod of the gang bound", "gang_after_sbatch_s")
    add("BMC resets on the faulty node", "power_cycles", "{}")
    add("straggler reports (Events) before the node was taken out", "reports", "{}")
    add("job pace while the straggler was in it", "slow_step_s", "{:.2f} s per step")
    add("replica groups: survivors' steps lost", "survivors_steps_lost", "{}")
    add("replica groups: survivors' longest step gap", "survivors_gap_s")
    add("replica groups: requeue -> replacement training in quorum", "rejoin_s")
    add("replica groups: checkpoint blocking (median)", "checkpoint_blocking_ms", "{:.2f} ms")
    add("silent corruption: steps from the bit flip to the report", "steps_to_report", "{}")
    add("replica groups: goodput (the ledger, GPU-seconds)", "goodput", "{:.1%}")
    add("replica groups: lost by category (GPU-seconds)", "ledger_lost", "{}")
    add("power-on -> Node registered", "node_s")
    add("power-on -> burn-in (hardware matches the Machine)", "burn_in_s")
    add("power-on -> production (burn-in checks passed)", "production_s")
    add("XID 79 -> reimage through the BMC -> production", "reimage_to_production_s")
    add("Tenants applied -> Ready, Slurm accounts and limits written", "ready_s")
    for label, key in (
        ("pod over the quota", "pod_refused"),
        ("sbatch over the quota", "sbatch_refused"),
        ("what the refused sbatch means", "sbatch_meaning"),
    ):
        if key in f:
            table.add_row(label, escape(str(f[key])))
    for key in ("sbatch", "gang"):
        q = f.get(key)
        if q is not None:
            ended = f", ended {q.end}" if q.state not in ("PENDING", "RUNNING") else ""
            table.add_row(
                f"Slurm: {key} job",
                f"{q.job_id} {q.name} {q.state}, priority {q.priority}, "
                f"started {q.start}{ended}, nodes {q.nodes}",
            )
    if "console" in f:
        table.add_row("machine console", str(f["console"]))
    if "out" in f:
        table.add_row("nodes taken out / budget", f"{len(f['out'])} / {f['budget']}")
        table.add_row("circuit breaker", "open" if f.get("breaker_open") else "closed")
    plan = f.get("plan")
    if plan is not None:
        table.add_row(
            "maintenance plan",
            f"{plan.get('phase')} {plan.get('progress')}, {plan.get('failed')} failed",
        )
    work = f.get("work")
    if work is not None:
        table.add_row(
            "work lost",
            f"{work.repeated} steps repeated ({work.repeated * work.step_s:.1f} s) + "
            f"{work.stalled_s:.1f} s stalled = {work.lost_s:.1f} s "
            f"(checkpoint every {job.JobShape().every} steps)",
        )
        table.add_row(
            "goodput",
            f"{work.goodput:.0%} ({work.steps} steps x {work.step_s:.2f} s useful in "
            f"{work.elapsed_s:.1f} s, {work.restarts} restart(s))",
        )
    table.add_row("scenario duration", f"{r.seconds:.1f} s")
    console.print()
    console.print(table)


__all__ = ["SCENARIOS", "Demo", "ScenarioResult", "StepMissed"]
