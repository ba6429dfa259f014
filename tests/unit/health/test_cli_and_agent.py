"""The CLI on the simulated backend, the injection API and the agent loop."""

from __future__ import annotations

import asyncio
import json

import httpx
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain import conditions, node_reports
from gpufleet.domain.policy import Detection, default_policy
from gpufleet.health import compute
from gpufleet.health.agent import Agent, InjectionServer
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.metrics import AgentMetrics
from gpufleet.health.results import CheckStatus
from gpufleet.health.skus import bundled

runner = CliRunner()


def test_health_check_reports_xid_79_on_gpu_3_and_exits_non_zero() -> None:
    res = runner.invoke(
        app, ["health", "check", "--backend", "simulated", "--inject", "xid=79,gpu=3", "--json"]
    )
    assert res.exit_code == 2, res.output
    doc = json.loads(res.output)
    failed = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["gpu-xid"]
    (fault,) = failed[0]["faults"]
    assert (fault["xid"], fault["gpu"]) == (79, 3)
    assert "GPU has fallen off the bus" in fault["message"]


def test_healthy_simulated_node_passes_everything_it_can_run() -> None:
    res = runner.invoke(app, ["health", "check", "--backend", "simulated", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert {c["status"] for c in doc["checks"]} == {"pass"}


def test_ib_flap_injected_between_polls_is_seen() -> None:
    res = runner.invoke(
        app,
        [
            "health",
            "check",
            "--backend",
            "simulated",
            "--checks",
            "infiniband",
            "--inject",
            "ib-link-flap,hca=mlx5_3",
        ],
    )
    assert res.exit_code == 2
    assert "mlx5_3" in res.output and "link_downed" in res.output


def test_bad_injection_is_a_usage_error_listing_known_faults() -> None:
    res = runner.invoke(app, ["health", "check", "--backend", "simulated", "--inject", "melt"])
    assert res.exit_code == 2 and "unknown fault" in res.output


def test_real_backend_without_gpu_says_so() -> None:
    res = runner.invoke(app, ["health", "check", "--backend", "real", "--checks", "gpu-count"])
    assert res.exit_code == 3
    assert "no GPU found" in res.output


class ListReporter:
    def __init__(self) -> None:
        self.conditions: dict[str, conditions.ConditionReport] = {}
        self.annotations: dict[str, str] = {}
        self.events: list[str] = []

    async def set_conditions(self, reports: list[conditions.ConditionReport], now: float) -> None:
        self.conditions.update({r.type: r for r in reports})

    async def set_annotations(
        self, reports: list[node_reports.AnnotationReport], now: float
    ) -> None:
        self.annotations.update({r.key: r.value for r in reports})

    async def event(
        self, fault: object, *, reason: str, message: str, now: float, warning: bool = True
    ) -> None:
        self.events.append(reason)


def make_agent(clear: float = 2.0) -> tuple[Agent, SimulatedHardware, ListReporter]:
    hw = SimulatedHardware(node="n1")
    policy = default_policy().model_copy(
        update={"detection": Detection(raise_after_seconds=0, clear_after_seconds=clear)}
    )
    rep = ListReporter()
    agent = Agent(
        hw, bundled().get("h100-sxm"), policy, node="n1", reporter=rep, metrics=AgentMetrics("n1")
    )
    return agent, hw, rep


def tick(agent: Agent, at: float) -> None:
    changed, events = agent.step(at)
    asyncio.run(agent.publish(changed, events, at))


def test_agent_raises_the_condition_with_evidence_and_clears_after_recovery() -> None:
    agent, hw, rep = make_agent()
    try:
        tick(agent, 100.0)
        assert rep.conditions["GpuProblem"].status == "False"
        hw.inject("xid=48,gpu=2")
        tick(agent, 101.0)
        c = rep.conditions["GpuProblem"]
        assert (c.status, c.reason) == ("True", "Xid48")
        (f,) = conditions.faults_of("n1", c.type, c.status, c.message)
        assert (f.xid, f.evidence.gpu_index) == (48, 2)
        assert rep.events == ["Xid48"]
        tick(agent, 102.0)
        assert rep.conditions["GpuProblem"].status == "True"  # held for clear_after
        tick(agent, 103.5)
        assert rep.conditions["GpuProblem"].status == "False"
    finally:
        hw.close()


def test_state_fault_holds_until_recovered_and_log_only_faults_are_events_only() -> None:
    agent, hw, rep = make_agent()
    try:
        tick(agent, 0.0)
        hw.inject("ib-port-down,hca=mlx5_1")
        hw.inject("xid=13,gpu=0")  # application XID: restart the job, not a node problem
        for t in (1.0, 2.0, 5.0, 9.0):
            tick(agent, t)
            assert rep.conditions["InfinibandProblem"].status == "True"
        assert rep.conditions["GpuProblem"].status == "False"
        assert rep.events.count("IbPortDown") == 1 and rep.events.count("Xid13") == 1
        hw.recover()
        tick(agent, 10.0)
        assert rep.conditions["InfinibandProblem"].status == "True"
        tick(agent, 12.5)
        assert rep.conditions["InfinibandProblem"].status == "False"
    finally:
        hw.close()


def test_injection_api_on_loopback() -> None:
    hw = SimulatedHardware()
    server = InjectionServer(hw, 0).start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        r = httpx.post(f"{url}/inject", json={"fault": "xid=79,gpu=3"})
        assert r.status_code == 200 and r.json()["injected"] == "xid"
        assert httpx.get(f"{url}/faults").json() == {"injected": ["xid=79,gpu=3"], "resets": 0}
        assert httpx.post(f"{url}/inject", json={"fault": "nope"}).status_code == 400
        assert httpx.post(f"{url}/recover").status_code == 200
        assert hw.injected == []
    finally:
        server.stop()
        hw.close()


def test_metrics_expose_gpu_port_and_check_series() -> None:
    agent, hw, _ = make_agent()
    try:
        tick(agent, 1.0)
        agent.run_active(2.0)
        port = agent.metrics.serve(0) if agent.metrics else 0
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        if agent.metrics:
            agent.metrics.stop()
        hw.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [temp] = [
        s for s in families["gpufleet_gpu_temperature_celsius"].samples if s.labels["gpu"] == "3"
    ]
    # dcgm-exporter's label name and value format, so the two join on(UUID)
    assert temp.labels["UUID"].startswith("GPU-") and temp.labels["node"] == "n1"
    assert 'gpufleet_ib_port_active{hca="mlx5_0",node="n1",port="1"} 1.0' in text
    # base units: a 400 Gb/s NDR port is 5e10 bytes per second
    rate = families["gpufleet_ib_port_rate_bytes_per_second"].samples[0]
    assert rate.value == 400e9 / 8
    # monotonic hardware counts are counters, one name per counter
    for name in ("link_downed", "symbol_errors", "link_error_recoveries", "receive_errors"):
        family = families[f"gpufleet_ib_port_{name}"]
        assert family.type == "counter" and family.samples
        assert family.samples[0].name == f"gpufleet_ib_port_{name}_total"
    assert families["gpufleet_gpu_ecc_uncorrected_volatile"].type == "counter"
    assert 'gpufleet_check_duration_seconds{check="gemm",node="n1"}' in text
    assert 'gpufleet_condition{condition="GpuProblem",node="n1"} 0.0' in text


class CountingHardware(SimulatedHardware):
    """Counts GEMM passes; optionally a workload starts while the GEMM runs."""

    def __init__(self, *, workload_starts_during_gemm: bool = False) -> None:
        super().__init__(node="n1")
        self.gemm_passes = 0
        self.workload_starts = workload_starts_during_gemm

    def run_gemm(self, n: int, iters: int, seed: int) -> dict[int, compute.GemmRun]:
        self.gemm_passes += 1
        if self.workload_starts:
            self.inject("busy")
        return super().run_gemm(n, iters, seed)


def scheduled_agent(hw: SimulatedHardware) -> Agent:
    return Agent(
        hw, bundled().get("h100-sxm"), default_policy(), node="n1", reporter=ListReporter()
    )


def test_scheduled_active_checks_share_one_gemm_between_gemm_and_sdc() -> None:
    hw = CountingHardware()
    try:
        results = {r.name: r for r in scheduled_agent(hw).run_active(now=10.0)}
    finally:
        hw.close()
    assert results["gemm"].status is CheckStatus.OK and results["sdc"].status is CheckStatus.OK
    assert results["hbm"].status is CheckStatus.OK
    assert hw.gemm_passes == 1


def test_a_workload_that_starts_during_the_checks_stops_the_rest() -> None:
    hw = CountingHardware(workload_starts_during_gemm=True)
    try:
        results = {r.name: r for r in scheduled_agent(hw).run_active(now=10.0)}
    finally:
        hw.close()
    assert results["gemm"].status is CheckStatus.OK  # it had started before the workload
    for name in ("sdc", "hbm", "allreduce"):
        assert results[name].status is CheckStatus.UNKNOWN
        assert results[name].reason == "not run: GPU processes are running"
        assert results[name].faults == ()
