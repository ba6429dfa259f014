"""The demo's fleet: the local cluster plus the gpufleet processes a user would run.

Agents (one per node, simulated hardware with the fault-injection API), the
lifecycle controller and the Slurm syncer run as ``python -m gpufleet.cli.main
...`` subprocesses, registered with the cluster: their logs are in
``<run_dir>/logs/`` and ``gpufleet local down`` stops them with the rest. Each
node's BMC is told to call its agent's ``/recover`` when the node boots, so a
reboot or power cycle clears the simulated fault as it would on a real server.

A scenario in which a new machine joins starts ``gpufleet provision serve`` and a
BMC for that machine the same way, when it first needs them; one in which Slurm
schedules Kubernetes pods starts ``gpufleet pod-scheduler`` when it first needs it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.demo import kube, policy
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import processes
from gpufleet.local.cluster import (
    DEFAULT_BMC_USER,
    PASSES_METRIC,
    BmcEndpoint,
    ClusterInfo,
    ClusterSpec,
    LocalCluster,
    pod_scheduler_process,
)
from gpufleet.local.processes import ComponentError, ManagedProcess

CLI = (sys.executable, "-m", "gpufleet.cli.main")
AGENT_INTERVAL_S = 0.5
SYNC_POLL_S = 0.5
POD_SCHEDULER_INTERVAL_S = 0.5
CONTROLLER_TICK_S = 0.5
BOOT_SECONDS = 8.0
"""How long the demo's servers take to boot after a BMC reset (real ones: minutes)."""


@dataclass
class Ports:
    inject: dict[str, int]
    agent_metrics: dict[str, int]
    controller_metrics: int
    syncer_metrics: int

    @classmethod
    def pick(cls, nodes: tuple[str, ...]) -> Ports:
        free = processes.free_ports(2 * len(nodes) + 2)
        n = len(nodes)
        return cls(
            inject=dict(zip(nodes, free[:n], strict=True)),
            agent_metrics=dict(zip(nodes, free[n : 2 * n], strict=True)),
            controller_metrics=free[2 * n],
            syncer_metrics=free[2 * n + 1],
        )


@dataclass
class Fleet:
    """A running demo fleet; :meth:`stop` ends every process of it."""

    cluster: LocalCluster
    info: ClusterInfo
    ports: Ports
    api: SyncKube
    agents: dict[str, ManagedProcess] = field(default_factory=dict)
    controller: ManagedProcess | None = None
    syncer: ManagedProcess | None = None
    controller_starts: int = 0
    active_every_s: float = 0.0
    provision: ManagedProcess | None = None
    provision_url: str = ""
    pod_scheduler: ManagedProcess | None = None
    new_bmcs: dict[str, tuple[ManagedProcess, BmcEndpoint]] = field(default_factory=dict)
    """BMCs of machines that are not part of the cluster yet (they join in a scenario)."""
    joining: set[str] = field(default_factory=set)
    """Machines added by a scenario; :meth:`remove_joining` takes them out again."""
    tenants: bool = False
    """Started for tenants (:meth:`start`): no agents, controller or syncer run on it."""

    # ------------------------------------------------------------ start-up

    @classmethod
    def start(
        cls,
        *,
        nodes: int,
        run_dir: Path,
        progress: Callable[[str], None],
        machines: int = 0,
        tenants: bool = False,
    ) -> Fleet:
        """``tenants``: Slurm 24.11 with accounting enforcing associations' limits, and
        the tenant controller (the ``two-tenants`` scenario; decision 0289)."""
        spec = ClusterSpec(nodes=nodes, run_dir=run_dir)
        ports = Ports.pick(spec.node_names())
        hooks = {n: f"http://127.0.0.1:{p}/recover" for n, p in ports.inject.items()}
        spec = ClusterSpec(
            nodes=nodes,
            run_dir=run_dir,
            bmc_boot_hooks=hooks,
            bmc_boot_seconds=BOOT_SECONDS,
            # A scenario powers its machines on through their BMCs.
            machines=machines,
            machine_power_on=False,
            # Without the syncer to lend nodes, Slurm keeps the first half and pods get
            # the rest (tenant_scenarios.kubernetes_nodes).
            slurmd_nodes=nodes // 2 if tenants else None,
            slurm_version="24.11" if tenants else ClusterSpec.slurm_version,
            slurm_accounting=tenants,
            slurm_enforce_limits=tenants,
            tenant_controller=tenants,
        )
        cluster = LocalCluster(spec, progress=progress)
        info = cluster.start()
        try:
            api = kube.connect(info)
            fleet = cls(
                cluster=cluster,
                info=info,
                ports=ports,
                api=api,
                tenants=tenants,
            )
            (info.run_dir / "slurm-jwt").write_text(info.slurm_jwt or "")
            (info.run_dir / "slurm-jwt").chmod(0o600)
            kube.install(api)
            kube.add_bmc_secrets(api, info)
            progress("CRDs, BMC Secrets and node annotations applied")
        except BaseException:
            cluster.stop()
            raise
        return fleet

    @property
    def telemetry_dir(self) -> Path:
        """Job telemetry (GPUFLEET_TELEMETRY_DIR of the example job), read by the agents."""
        return self.info.run_dir / "job-telemetry"

    @property
    def sim_gpus_dir(self) -> Path:
        """Where each node's simulated GPUs publish their speed (GPUFLEET_SIM_GPUS)."""
        return self.info.run_dir / "sim-gpus"

    def job_env(self) -> dict[str, str]:
        """What the example job needs to write telemetry and run on the simulated GPUs."""
        return {
            "GPUFLEET_TELEMETRY_DIR": str(self.telemetry_dir),
            "GPUFLEET_SIM_GPUS": str(self.sim_gpus_dir),
        }

    def apply_policy(self, spec: dict[str, Any]) -> None:
        """(Re)create the FleetPolicy: the controller obeys it, the agents judge with it."""
        kube.put_policy(self.api, policy.fleet_policy(spec))

    def _log(self, name: str) -> Path:
        return self.info.logs_dir / f"{name}.log"

    def start_agents(self, *, active_every_s: float = 0.0) -> None:
        self.active_every_s = active_every_s
        for node in self.info.node_names:
            self.start_agent(node)

    def start_agent(self, node: str) -> ManagedProcess:
        """The agent of ``node`` on simulated hardware (ports from :attr:`ports`)."""
        argv = [
            *CLI,
            "agent",
            "--node",
            node,
            "--backend",
            "simulated",
            "--kubeconfig",
            str(self.info.kubeconfig),
            "--inject-port",
            str(self.ports.inject[node]),
            "--metrics-port",
            str(self.ports.agent_metrics[node]),
            "--policy-name",
            policy.POLICY_NAME,
            "--interval",
            str(AGENT_INTERVAL_S),
            "--active-every",
            str(self.active_every_s),
            "--job-telemetry",
            str(self.telemetry_dir),
            "--telemetry-every",
            str(AGENT_INTERVAL_S),
            "--sim-publish",
            str(self.sim_gpus_dir),
        ]
        self.agents[node] = self.cluster.launch(
            ManagedProcess(f"agent-{node}", argv, self._log(f"agent-{node}"))
        )
        return self.agents[node]

    def stop_agent(self, node: str) -> None:
        """Stop and forget the agent of a node that leaves the fleet."""
        proc = self.agents.pop(node, None)
        if proc is not None:
            proc.stop(grace=3)

    def remove_joining(self) -> None:
        """Take out the machines a scenario added: agent, Node, Machine, token and BMC
        Secrets (their BMC and the provisioning service keep running)."""
        for name in sorted(self.joining):
            self.stop_agent(name)
            kube.remove_machine(self.api, name)
            self.joining.discard(name)

    def start_provisioning(self, timeout: float = 60.0) -> str:
        """``gpufleet provision serve`` on a free loopback port (once); its base URL."""
        if self.provision is not None and self.provision.poll() is None:
            return self.provision_url
        port = processes.free_ports(1)[0]
        argv = [
            *CLI,
            "provision",
            "serve",
            "--kubeconfig",
            str(self.info.kubeconfig),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        proc = self.cluster.launch(ManagedProcess("provision", argv, self._log("provision")))
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=2) as http:
            proc.wait_ready(
                lambda: http.get(f"{url}/healthz").status_code == 200,
                timeout=timeout,
                what="serving /healthz",
            )
        self.provision, self.provision_url = proc, url
        return url

    def start_new_bmc(self, node: str, timeout: float = 30.0) -> BmcEndpoint:
        """A Redfish BMC for a machine that is not in the cluster yet (once per name), and
        agent ports for it; its boot calls the agent's ``/recover`` as the others do."""
        if node in self.new_bmcs and self.new_bmcs[node][0].poll() is None:
            return self.new_bmcs[node][1]
        inject, metrics, port = processes.free_ports(3)
        self.ports.inject[node] = inject
        self.ports.agent_metrics[node] = metrics
        bmc = BmcEndpoint(node, f"http://127.0.0.1:{port}", DEFAULT_BMC_USER, secrets.token_hex(8))
        config = self.info.run_dir / f"redfish-{node}.json"
        config.write_text(
            json.dumps(
                {
                    "user": bmc.user,
                    "password": bmc.password,
                    "bmcs": [
                        {
                            "node": node,
                            "port": port,
                            "boot_seconds": BOOT_SECONDS,
                            "boot_hook": f"http://127.0.0.1:{inject}/recover",
                        }
                    ],
                }
            )
        )
        config.chmod(0o600)
        argv = [sys.executable, "-m", "gpufleet.local.redfish", str(config)]
        proc = self.cluster.launch(
            ManagedProcess(f"redfish-{node}", argv, self._log(f"redfish-{node}"))
        )
        with httpx.Client(timeout=2) as http:
            proc.wait_ready(
                lambda: http.get(f"{bmc.url}/redfish/v1").status_code == 200,
                timeout=timeout,
                what=f"serving the BMC of {node}",
            )
        self.new_bmcs[node] = (proc, bmc)
        return bmc

    def start_controller(self) -> ManagedProcess:
        argv = [
            *CLI,
            "controller",
            "--kubeconfig",
            str(self.info.kubeconfig),
            "--policy-name",
            policy.POLICY_NAME,
            "--metrics-port",
            str(self.ports.controller_metrics),
            "--lease-duration",
            "8",
            "--tick",
            str(CONTROLLER_TICK_S),
        ]
        self.controller_starts += 1
        self.controller = self.cluster.launch(
            ManagedProcess("controller", argv, self._log("controller"))
        )
        return self.controller

    def start_syncer(self) -> ManagedProcess:
        assert self.info.slurmrestd_url and self.info.slurm_conf
        argv = [
            *CLI,
            "syncer",
            "run",
            "--slurmrestd-url",
            self.info.slurmrestd_url,
            "--kubeconfig",
            str(self.info.kubeconfig),
            "--slurm-conf",
            str(self.info.slurm_conf),
            "--token-file",
            str(self.info.run_dir / "slurm-jwt"),
            "--poll-interval",
            str(SYNC_POLL_S),
            "--preempt-priority",
            str(kube.INFERENCE_PRIORITY),
            "--metrics-port",
            str(self.ports.syncer_metrics),
        ]
        self.syncer = self.cluster.launch(ManagedProcess("syncer", argv, self._log("syncer")))
        return self.syncer

    def start_pod_scheduler(self, timeout: float = 60.0) -> ManagedProcess:
        """``gpufleet pod-scheduler`` (once): Slurm schedules the pods whose
        ``schedulerName`` is ``gpufleet-slurm``, one Slurm job per pod group."""
        if self.pod_scheduler is not None and self.pod_scheduler.poll() is None:
            return self.pod_scheduler
        port = processes.free_ports(1)[0]
        proc = self.cluster.launch(
            pod_scheduler_process(self.info, port, interval_s=POD_SCHEDULER_INTERVAL_S)
        )
        url = f"http://127.0.0.1:{port}/metrics"
        with httpx.Client(timeout=2) as http:
            proc.wait_ready(
                lambda: PASSES_METRIC in http.get(url).text,
                timeout=timeout,
                what="through its first pass",
            )
        self.pod_scheduler = proc
        return proc

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Agents answer on their injection API, the controller serves metrics with a
        valid policy, every Node carries a state and the Slurm hold taint."""
        with httpx.Client(timeout=2) as http:
            for node, proc in self.agents.items():
                url = f"http://127.0.0.1:{self.ports.inject[node]}/faults"
                proc.wait_ready(lambda u=url: http.get(u).status_code == 200, timeout=timeout)  # type: ignore[misc]
            assert self.controller is not None
            metrics = f"http://127.0.0.1:{self.ports.controller_metrics}/metrics"
            self.controller.wait_ready(
                lambda: "gpufleet_policy_valid 1.0" in http.get(metrics).text,
                timeout=timeout,
                what="obeying the demo FleetPolicy",
            )
        assert self.syncer is not None
        self.syncer.wait_ready(
            lambda: all(
                (n["metadata"].get("labels") or {}).get("gpufleet.io/state") == "production"
                and any(t["key"] == "gpufleet.io/slurm" for t in n["spec"].get("taints") or [])
                for n in kube.nodes(self.api)
            ),
            timeout=timeout,
            what="holding every node for Slurm (taint gpufleet.io/slurm=held)",
        )

    # ------------------------------------------------------------ actions

    def inject(self, node: str, fault: str) -> None:
        url = f"http://127.0.0.1:{self.ports.inject[node]}/inject"
        r = httpx.post(url, json={"fault": fault}, timeout=5)
        if r.status_code != 200:
            raise ComponentError(
                f"agent-{node}", self._log(f"agent-{node}"), f"inject {fault}: {r.text}"
            )

    def recover(self, node: str) -> None:
        httpx.post(f"http://127.0.0.1:{self.ports.inject[node]}/recover", timeout=5)

    def kill_controller(self) -> None:
        """SIGKILL, as a crashed pod: no clean-up at all."""
        assert self.controller is not None and self.controller.record is not None
        with contextlib.suppress(ProcessLookupError):
            import os

            os.killpg(self.controller.pid, signal.SIGKILL)
        self.controller.stop(grace=0.1)
        self.controller = None  # not running, on purpose: not a dead component

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.controller.stop(grace=5)

    def stop_pod_scheduler(self) -> None:
        """Stop it: the scenarios that do not need it run without its passes."""
        if self.pod_scheduler is not None:
            self.pod_scheduler.stop(grace=5)
            self.pod_scheduler = None

    def dead_component(self) -> ManagedProcess | None:
        """A gpufleet process that exited although it should be running."""
        procs = [
            *self.agents.values(),
            self.controller,
            self.syncer,
            self.provision,
            self.pod_scheduler,
            *(p for p, _ in self.new_bmcs.values()),
        ]
        for p in procs:
            if p is not None and p.poll() is not None:
                return p
        return None

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.api.close()
        self.cluster.stop()

    def detach(self) -> None:
        self.cluster.detach()


def wait_seconds(seconds: float) -> None:
    time.sleep(seconds)
