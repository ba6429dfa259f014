"""A node's hardware and its agent: the real :class:`~gpufleet.health.agent.Agent` with two seams.

The agent's request handling (the binding to the record, the refusal on a busy node,
the answer annotation, the retry of a refused request) and its reporting (debounced
conditions, Events) run as they are. Two parts are replaced, both because they read
hardware, not because their logic is under test here:

* the passive monitors (``agent.monitors``): :class:`FaultFeed` hands the agent the
  faults the scenario injected, as observations of their subsystem; the real
  monitors read NVML values, kmsg and a sysfs tree, which costs milliseconds a poll;
* the check profiles of a verification (``handle_request`` for ``checks``): they pass
  unless the machine still carries trouble that the steps taken so far did not fix
  (:attr:`NodeHardware.trouble`). GPU resets go through the real ``handle_request``;
  a MaintenancePlan's command passes (what it would flash is not modelled; the binding
  and the refusal on a busy node before it run as they are).

The agent's own threads (``asyncio.to_thread``) run inline on the deterministic loop
(:meth:`DstLoop.run_in_executor`); its clock is the world's virtual wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.domain import conditions
from gpufleet.domain.debounce import Observation
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.ladder import Step, severity
from gpufleet.domain.subsystems import AGENT_SUBSYSTEMS
from gpufleet.health import compute
from gpufleet.health.agent import Agent
from gpufleet.health.backend_sim import GPU_BUSES, SimGpu
from gpufleet.health.hardware import Hardware, HardwareError
from gpufleet.health.monitors import Snapshot

if TYPE_CHECKING:
    from gpufleet.dst.world import World


@dataclass(frozen=True)
class FaultKindSpec:
    """A fault the scenario can inject: the XID the kernel logs and what fixes the GPU."""

    xid: int
    fixed_by: Step | None
    """The least step that fixes the machine (None: nothing: triage)."""


FAULTS: dict[str, FaultKindSpec] = {
    "xid79": FaultKindSpec(79, Step.REBOOT),
    "xid79-stuck": FaultKindSpec(79, Step.POWER_CYCLE),
    "xid79-dead": FaultKindSpec(79, None),
    "xid48": FaultKindSpec(48, Step.GPU_RESET),
    "xid48-stuck": FaultKindSpec(48, Step.REBOOT),
    "xid13": FaultKindSpec(13, Step.GPU_RESET),
}


@dataclass
class NodeHardware(Hardware):
    """One machine's GPUs as the agent and the checks see them (implements ``Hardware``)."""

    world: World
    node: str
    name: str = "dst"
    sysfs_root: Path = Path("/nonexistent/gpufleet-dst-sysfs")
    pending: list[FaultEvent] = field(default_factory=list)
    """Faults logged since the agent's last poll (the kernel log's new lines)."""
    trouble: list[tuple[str, Step | None]] = field(default_factory=list)
    """(fault, the least step that fixes it) not fixed yet."""
    resets: int = 0

    def __post_init__(self) -> None:
        self._gpus = [SimGpu(i, GPU_BUSES[i]).raw() for i in range(8)]

    # -------------------------------------------------------------- Hardware

    def gpus(self) -> list[dict[str, Any]]:
        return [dict(g) for g in self._gpus]

    def kernel_lines(self) -> list[str]:
        return []

    def imex_status(self) -> str | None:
        return None

    def ib_neighbour(self, hca: str, port: int) -> tuple[str, str | None]:
        raise HardwareError("not modelled in the simulation")

    def dcgm_diag(self, level: int, timeout_s: float) -> str | None:
        return None

    def run_gemm(self, n: int, iters: int, seed: int) -> dict[int, compute.GemmRun]:
        raise HardwareError("not modelled in the simulation")

    def run_copy(self, nbytes: int, iters: int) -> dict[int, compute.CopyRun]:
        raise HardwareError("not modelled in the simulation")

    def allreduce(self, nbytes: int, iters: int) -> compute.AllReduceRun | None:
        return None

    def busy(self) -> bool:
        return self.world.gpu_busy(self.node)

    def reset_gpu(self, index: int | None) -> str:
        self.world.gpu_reset(self.node, index)
        self.resets += 1
        self.fixed(Step.GPU_RESET)
        return f"reset of {'every GPU' if index is None else f'GPU {index}'}"

    def close(self) -> None:
        return None

    # ------------------------------------------------------------- the model

    def inject(self, kind: str, at: float, gpu: int) -> FaultEvent:
        spec = FAULTS[kind]
        bus = f"0000:{GPU_BUSES[gpu]}:00"
        fault = FaultEvent(
            FaultKind.XID,
            self.node,
            at,
            xid=spec.xid,
            evidence=Evidence(
                gpu_index=gpu,
                pci_bus_id=bus,
                message=f"NVRM: Xid (PCI:{bus}): {spec.xid}, pid=4242, name=python3",
            ),
        )
        self.pending.append(fault)
        if spec.xid != 13:
            self.trouble.append((kind, spec.fixed_by))
        return fault

    def fixed(self, step: Step) -> None:
        """A step was carried out: the trouble it fixes is gone."""
        self.trouble = [
            (k, by) for k, by in self.trouble if by is None or severity(by) > severity(step)
        ]

    def verdict(self) -> tuple[bool, str]:
        if not self.trouble:
            return True, "14 checks passed"
        return False, "; ".join(f"gpu-xid failed: {k} not fixed" for k, _ in self.trouble)


class FaultFeed:
    """Stands in for :class:`~gpufleet.health.monitors.PassiveMonitors`: the injected faults."""

    def __init__(self, hw: NodeHardware) -> None:
        self.hw = hw

    def poll(self, now: float) -> Snapshot:
        new, self.hw.pending = self.hw.pending, []
        obs: dict[Subsystem, Observation] = {s: Observation(at=now) for s in AGENT_SUBSYSTEMS}
        for f in new:
            o = obs[f.subsystem]
            obs[f.subsystem] = Observation(at=now, instant=(*o.instant, f))
        return Snapshot(now, obs)


class DstAgent(Agent):
    """The real agent; a verification's checks are judged by the machine model."""

    hw: NodeHardware

    def handle_request(self, req: conditions.AgentRequest) -> conditions.AgentResult:
        if req.kind == "checks":
            passed, detail = self.hw.verdict()
            return conditions.AgentResult(req.id, passed=passed, detail=detail)
        if req.kind == "command":  # a MaintenancePlan's (the firmware it flashes is not modelled)
            return conditions.AgentResult(req.id, passed=True, detail=f"{req.command} done")
        return super().handle_request(req)
