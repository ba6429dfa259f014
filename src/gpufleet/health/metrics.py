"""Prometheus metrics of the agent, in a registry of its own (no global state).

Names follow the Prometheus conventions (docs/decisions/0099): base units
(bytes per second, not Gb/s), counters for monotonic counts (the HCA port
counters and the GPU's volatile ECC count are read from the hardware and
exported as counters, so ``rate()`` works and a reset is a counter reset),
and per-GPU series carry the GPU's ``UUID`` under dcgm-exporter's label name
so the two join with ``on(UUID)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gpufleet.health import sysfs
from gpufleet.health.monitors import Snapshot
from gpufleet.health.results import CheckResult

DEFAULT_PORT = 29440
"""The agent's /metrics port: outside the 9100-9999 range the Prometheus port list has
filled (9400 is dcgm-exporter's), and below Linux's ephemeral ports (decision 0099)."""

IB_COUNTER_METRICS = {
    "link_downed": "gpufleet_ib_port_link_downed",
    "symbol_error": "gpufleet_ib_port_symbol_errors",
    "link_error_recovery": "gpufleet_ib_port_link_error_recoveries",
    "port_rcv_errors": "gpufleet_ib_port_receive_errors",
}
"""sysfs counter -> metric name (exported with ``_total``): one meaning per name."""
assert set(IB_COUNTER_METRICS) == set(sysfs.COUNTERS)

_GPU_LABELS = ["node", "gpu", "UUID", "pci_bus_id"]
_PORT_LABELS = ["node", "hca", "port"]


class HardwareCounters(Collector):
    """Monotonic hardware counts (HCA port counters, volatile ECC) as Prometheus counters.

    The hardware keeps the count; this collector exports the last value read,
    so a counter reset in the hardware (a port or GPU reset) is a counter reset
    to Prometheus, which ``rate()`` and ``increase()`` handle.
    """

    def __init__(self) -> None:
        self.ports: dict[tuple[str, str, str], dict[str, int]] = {}
        self.ecc: dict[tuple[str, str, str, str], int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        for counter, name in IB_COUNTER_METRICS.items():
            fam = CounterMetricFamily(
                name,
                f"HCA port counter {counter} (sysfs), as the hardware counts it",
                labels=_PORT_LABELS,
            )
            for labels, values in sorted(self.ports.items()):
                if counter in values:
                    fam.add_metric(list(labels), values[counter])
            yield fam
        fam = CounterMetricFamily(
            "gpufleet_gpu_ecc_uncorrected_volatile",
            "Uncorrectable ECC errors since the GPU's last reset (NVML volatile count)",
            labels=_GPU_LABELS,
        )
        for gpu_labels, value in sorted(self.ecc.items()):
            fam.add_metric(list(gpu_labels), value)
        yield fam


class AgentMetrics:
    """Per-GPU and per-port gauges, fault counters, check durations and timestamps."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        r = self.registry
        gpu = _GPU_LABELS
        self.gpu_temp = Gauge(
            "gpufleet_gpu_temperature_celsius", "GPU temperature", gpu, registry=r
        )
        self.gpu_power = Gauge("gpufleet_gpu_power_watts", "GPU power draw", gpu, registry=r)
        self.hardware_counters = HardwareCounters()
        r.register(self.hardware_counters)
        self.gpu_remap = Gauge(
            "gpufleet_gpu_row_remap_pending", "1 when a row remap is pending", gpu, registry=r
        )
        self.gpu_reasons = Gauge(
            "gpufleet_gpu_clocks_event_reasons",
            "NVML clocks event reasons bitmask",
            gpu,
            registry=r,
        )
        self.gpu_nvlink = Gauge(
            "gpufleet_gpu_nvlink_active", "Active NVLink links", gpu, registry=r
        )
        self.gpu_pcie_width = Gauge(
            "gpufleet_gpu_pcie_link_width", "Current PCIe link width", gpu, registry=r
        )
        port = _PORT_LABELS
        self.ib_up = Gauge(
            "gpufleet_ib_port_active", "1 when the HCA port is ACTIVE", port, registry=r
        )
        self.ib_rate = Gauge(
            "gpufleet_ib_port_rate_bytes_per_second",
            "HCA port link rate (sysfs rate, in bytes per second)",
            port,
            registry=r,
        )
        self.faults = Counter(
            "gpufleet_agent_faults_observed_total",
            "Faults the agent's monitors observed on this node, by fault key and subsystem"
            " (before any policy: the controller's decisions are gpufleet_controller_faults_total)",
            ["node", "fault", "subsystem"],
            registry=r,
        )
        self.condition = Gauge(
            "gpufleet_condition",
            "1 when a problem condition is raised",
            ["node", "condition"],
            registry=r,
        )
        self.unparsed = Counter(
            "gpufleet_kmsg_unparsed_lines_total",
            "Kernel log lines about XIDs/lockups that did not parse",
            ["node"],
            registry=r,
        )
        self.foreign = Counter(
            "gpufleet_kmsg_foreign_records_total",
            "Kernel log records that look like driver reports but did not come from the "
            "kernel (a process wrote them to /dev/kmsg); never faults",
            ["node"],
            registry=r,
        )
        self.source_up = Gauge(
            "gpufleet_source_readable",
            "1 when a hardware source was readable",
            ["node", "source"],
            registry=r,
        )
        self.check_seconds = Gauge(
            "gpufleet_check_duration_seconds",
            "Duration of the last check",
            ["node", "check"],
            registry=r,
        )
        self.check_last = Gauge(
            "gpufleet_check_last_timestamp_seconds",
            "When the check last ran",
            ["node", "check"],
            registry=r,
        )
        self.check_ok = Gauge(
            "gpufleet_check_passed", "1 passed, 0 failed, -1 unknown", ["node", "check"], registry=r
        )
        self.check_value = Gauge(
            "gpufleet_check_measured",
            "Measured value of the last check",
            ["node", "check"],
            registry=r,
        )
        self.job_slowdown = Gauge(
            "gpufleet_job_slowdown_ratio",
            "This node's compute per step over its peers' median, in its slowest running "
            "job (job telemetry; 1 = on par, 0 = no comparison)",
            ["node"],
            registry=r,
        )
        self.requests = Counter(
            "gpufleet_agent_requests_total",
            "Controller requests (checks, gpu-reset) carried out or refused (refused: not"
            " bound to the node's current decision, or work on the node)",
            ["node", "kind", "outcome"],
            registry=r,
        )
        self.policy_read = Gauge(
            "gpufleet_agent_policy_read",
            "1 when the agent judges with the FleetPolicy the controller obeys; 0 while none"
            " was ever read (fail closed: every fault raises its condition)",
            ["node"],
            registry=r,
        )
        self.policy_valid = Gauge(
            "gpufleet_agent_policy_valid",
            "1 when the FleetPolicy as last read is valid; 0 when it is invalid (the last"
            " valid one is kept)",
            ["node"],
            registry=r,
        )
        self._server: Any = None

    def observe(self, snap: Snapshot) -> None:
        n = self.node
        for g in snap.gpus:
            labels = (n, str(g.index), g.uuid or "", g.pci_bus_id or "")
            if "temperature_c" in g.nums:
                self.gpu_temp.labels(*labels).set(g.nums["temperature_c"])
            if "power_mw" in g.nums:
                self.gpu_power.labels(*labels).set(g.nums["power_mw"] / 1000)
            if (v := g.get("ecc_uncorrected_volatile")) is not None:
                self.hardware_counters.ecc[labels] = int(v)
            if g.remap_pending is not None:
                self.gpu_remap.labels(*labels).set(int(g.remap_pending))
            if (v := g.get("clocks_event_reasons")) is not None:
                self.gpu_reasons.labels(*labels).set(v)
            if g.nvlink_state is not None:
                self.gpu_nvlink.labels(*labels).set(sum(g.nvlink_state))
            if (v := g.get("pcie_width")) is not None:
                self.gpu_pcie_width.labels(*labels).set(v)
        for p in snap.ports:
            port = (n, p.hca, str(p.port))
            if p.state is not None:
                self.ib_up.labels(*port).set(int(p.state == "ACTIVE"))
            if p.rate_gbps is not None:
                self.ib_rate.labels(*port).set(p.rate_gbps * 1e9 / 8)
            self.hardware_counters.ports[port] = {
                name: value for name, value in p.counters.items() if value is not None
            }
        for f in snap.faults():
            self.faults.labels(n, f.key, f.subsystem.value).inc()
        if snap.kernel_unparsed:
            self.unparsed.labels(n).inc(snap.kernel_unparsed)
        if snap.kernel_foreign:
            self.foreign.labels(n).inc(snap.kernel_foreign)
        for source in ("nvml", "kmsg"):
            self.source_up.labels(n, source).set(0 if source in snap.errors else 1)

    def check(self, result: CheckResult, at: float) -> None:
        n = self.node
        self.check_seconds.labels(n, result.name).set(result.duration_s)
        self.check_last.labels(n, result.name).set(at)
        self.check_ok.labels(n, result.name).set(
            -1 if result.status.label == "unknown" else int(not result.failed)
        )
        if result.measured is not None:
            self.check_value.labels(n, result.name).set(result.measured)

    def serve(self, port: int = DEFAULT_PORT, address: str = "127.0.0.1") -> int:
        """Serve /metrics; returns the bound port (0 picks a free one)."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        self._server = server
        bound: int = server.server_address[1]
        return bound

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
