"""The simulated hardware backend: in-memory GPUs, HCAs and kernel log.

Used by the local cluster (one agent per simulated node), the demo and the
tests. It produces the raw formats the real parsers read: NVML value sets,
``/dev/kmsg`` records with real NVRM XID wording, and a sysfs tree written
under a private directory. Faults are injected with :meth:`SimulatedHardware.inject`
(from the CLI ``--inject`` flag or the loopback HTTP API) and removed with
:meth:`SimulatedHardware.recover`.

Active checks on simulated GPUs run a real (small, numpy) GEMM so that the
result comparison is exercised, and report *modelled* throughput: the SKU's
nominal figure times the GPU's injected slowdown.

Jobs on simulated nodes have no GPU to be slowed by, so the hardware
publishes its speed: with ``publish_dir``, every change writes
``<publish_dir>/<node>.json`` (``{"node", "speed", "gpus": [{"index", "speed"}]}``,
speed 1.0 = nominal; the node's speed is its slowest GPU's, as a data-parallel
step waits for it). ``examples/slurm-ddp/train.py`` scales its simulated
compute by it (``GPUFLEET_SIM_GPUS``), which is how a slow GPU becomes a
straggler in the demo's training job. A silent corruption injected with
``sdc-silent,gpu=G,step=K`` adds ``"sdc_flip_at_step": K`` (to the file and to the
GPU's entry): a job rank on the node flips one bit of one weight right after step
K's update and trains on, so the replica groups' fingerprints disagree
(:mod:`gpufleet.domain.sdc_vote`); the GPU's own SDC check fails from then on too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import weakref
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.domain import nvlink5, xids
from gpufleet.domain.faults import FaultKind
from gpufleet.health import compute, ib_neighbours, kmsg, sysfs
from gpufleet.health.hardware import Hardware, HardwareError

SIM_FABRICS = ("hgx", "nvl72", "none")
NVSWITCH_BUSES = ("c3", "c4", "c5", "c6")
GPU_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
HCA_BUSES = ("0c", "1f", "47", "4e", "8c", "9f", "c6", "cd")
NOMINAL = {"gemm_tflops": 750.0, "hbm_gbps": 3000.0, "busbw_gbps": 450.0}
"""What a healthy simulated H100 SXM measures."""
SIM_GEMM_SIZE = 128
"""Matrix size the simulated devices really compute (for the fingerprint)."""

XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f1c_4c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 6, subpartition 0.",
    63: "Row Remapper: New row (0x0000000000a1b2c3) marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x0000000000a1b2c3).",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20801702 0x4).",
}
RECOVERY_TEXT = {
    "gpu-reset": "0x1 (GPU Reset Required)",
    "node-reboot": "0x2 (Node Reboot Required)",
    "drain-p2p": "0x3 (Drain P2P)",
    "drain-and-reset": "0x4 (Drain and Reset)",
}
EXTRA_FAULTS = ("kmsg-garbage", "busy", "hang", "crash", "nic-down", "sdc-silent")
"""Injectable conditions that are not fault kinds: malformed log lines, a running
workload, two failures of the check program itself, with which the bounds of
``gpufleet health check --slurm`` are tested (``hang``: the next hardware read
never returns, as NVML does on a wedged GPU; ``crash``: the check code raises),
``nic-down``: the node never joins a job's gang preflight (a broken NIC), and
``sdc-silent,gpu=G,step=K``: the GPU corrupts silently, seen by a job's weights from
step K (the published file) and by the SDC check, never by a counter or the kernel log."""


NVLINK5_DEFAULT = {
    144: ("SAW_MVB", "Fatal", "0x00000021", "0x00000002"),
    145: ("RLW_REMAP", "Fatal", "0x00000082", "0x00000040"),
    146: ("TLW_CTRL", "Fatal", "0x00000123", "0x00000004"),
    147: ("TREX", "Nonfatal", "0x00000184", "0x00000001"),
    148: ("NVLPW_CTRL", "Nonfatal", "0x00000005", "0x80000000"),
    149: ("NETIR_LINK_EVT", "Fatal", "0x025001c6", "0x00000000"),
    150: ("MSE_WATCHDOG", "Fatal", "0x00000000", "0x00000000"),
}
"""A fatal (or, for 147/148, the only) case of each NVLink5 XID in NVIDIA's decode:
sub-unit, severity, intrInfo, error status. ``unit=``, ``severity=``, ``intr=`` and
``status=`` override them (``xid=145,unit=RLW_RXPIPE,severity=Nonfatal,status=0x8``)."""


def _nvlink5_text(code: int, spec: FaultSpec) -> str:
    unit, severity, intr, status = NVLINK5_DEFAULT[code]
    p = spec.params
    head = f"{p.get('unit', unit)} {p.get('severity', severity)} XC0 i0"
    regs = f"{p.get('intr', intr)} {p.get('status', status)}" + " 0x00000000" * 4
    return f"{head} Link {spec.int('link', 1):02d} ({regs})"


class InjectionError(ValueError):
    """A fault specification the simulator does not understand."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """``xid=79,gpu=3`` or ``ib-port-down,hca=mlx5_1``: a kind and its parameters."""

    kind: str
    params: dict[str, str]

    def int(self, key: str, default: int) -> int:
        raw = self.params.get(key)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise InjectionError(f"{key}={raw!r} is not a whole number") from None


KINDS = tuple(k.value for k in FaultKind if k is not FaultKind.SLURM_DRAIN) + EXTRA_FAULTS
"""Every fault kind the agent can observe (``slurm-drain`` is Slurm's, not the hardware's)."""


def parse_spec(text: str) -> FaultSpec:
    """Parse a fault specification; errors list the known kinds."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InjectionError("empty fault specification")
    params: dict[str, str] = {}
    kind, sep, value = parts[0].partition("=")
    if kind not in KINDS or (sep and kind != "xid"):
        raise InjectionError(f"unknown fault {parts[0]!r}; known: {', '.join(KINDS)}")
    if kind == "xid":
        params["xid"] = value
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep:
            raise InjectionError(f"expected key=value, got {part!r}")
        params[key] = value
    if kind == "xid" and not params.get("xid", "").isdigit():
        raise InjectionError("give the XID number: xid=79,gpu=3")
    return FaultSpec(kind, params)


@dataclass
class SimGpu:
    """One simulated GPU's NVML-visible state and its check behaviour."""

    index: int
    bus: str
    present: bool = True
    ecc_dbe: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired: int = 0
    reasons: int = 0x1  # idle
    temperature: float = 38.0
    width: int = 16
    gen: int = 5
    links_down: set[int] = field(default_factory=set)
    gemm_factor: float = 1.0
    hbm_factor: float = 1.0
    sdc: bool = False
    sdc_flip_at_step: int | None = None
    """``sdc-silent``: the training step after which a job on this GPU flips a weight."""
    dcgm_fail: bool = False
    fabric_state: int = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
    fabric_status: int | str = 0  # NVML_SUCCESS
    fabric_degraded: bool = False

    def raw(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": f"GPU-5a1c0de0-0000-4000-8000-0000000000{self.index:02d}",
            "pci_bus_id": f"00000000:{self.bus.upper()}:00.0",
            "memory_total_bytes": 81559 * 2**20,  # an H100 80GB's, as NVML reports it
            "ecc_uncorrected_volatile": self.ecc_dbe,
            "ecc_uncorrected_aggregate": self.ecc_dbe,
            "ecc_corrected_volatile": 0,
            "remapped_rows": [
                0,
                1 if self.remap_pending else 0,
                int(self.remap_pending),
                int(self.remap_failure),
            ],
            "retired_pages_sbe": self.retired,
            "retired_pages_dbe": 0,
            "retired_pages_pending": 0,
            "clocks_event_reasons": self.reasons,
            "temperature_c": self.temperature,
            "power_mw": 72000 if self.reasons & 0x1 else 690000,
            "power_limit_mw": 700000,
            "pcie_gen": self.gen,
            "pcie_gen_max": 5,
            "pcie_width": self.width,
            "pcie_width_max": 16,
            "nvlink_state": [0 if i in self.links_down else 1 for i in range(18)],
        }


@dataclass
class SimHca:
    """One simulated HCA with one port."""

    name: str
    bus: str
    state: str = "ACTIVE"
    rate: float = 400.0
    link_downed: int = 0
    symbol_error: int = 0


class SimDevice:
    """A simulated GPU for the active checks."""

    def __init__(self, gpu: SimGpu) -> None:
        self.gpu = gpu
        self.index = gpu.index
        self.label = f"sim:{gpu.index}"

    def gemm(self, n: int, iters: int, seed: int) -> compute.GemmRun:
        n = min(n, SIM_GEMM_SIZE)
        a, b = compute.inputs(n, seed)
        rows = (a[: compute.SAMPLE_ROWS] @ b).astype(np.float64)
        if self.gpu.sdc:
            rows[0, 0] += 1000.0  # a flipped exponent bit
        tflops = NOMINAL["gemm_tflops"] * self.gpu.gemm_factor
        seconds = 2.0 * n**3 * iters / (tflops * 1e12)
        return compute.GemmRun(n, iters, seconds, rows, "bfloat16 (simulated)")

    def copy(self, nbytes: int, iters: int) -> compute.CopyRun:
        gbps = NOMINAL["hbm_gbps"] * self.gpu.hbm_factor
        return compute.CopyRun(nbytes, iters, 2.0 * nbytes * iters / (gbps * 1e9))


def _factor(spec: FaultSpec) -> float:
    raw = spec.params.get("factor", "0.5")
    try:
        value = float(raw)
    except ValueError:
        raise InjectionError(f"factor={raw!r} is not a number") from None
    if not 0 < value <= 1:
        raise InjectionError(f"factor={raw}: give a speed in (0, 1], e.g. factor=0.5")
    return value


class SimulatedHardware(Hardware):
    """An HGX H100 node in memory: 8 GPUs, 8 HCAs, a kernel log.

    Implements :class:`Hardware` (declared, so mypy checks it against the interface):
    it is the backend the unit and integration tests and the demo use where there is no GPU.
    """

    name = "simulated"

    def __init__(
        self,
        *,
        node: str = "sim-node",
        gpus: int = 8,
        hcas: int = 8,
        publish_dir: Path | None = None,
        fabric: str = "hgx",
        nvlink_cluster: str = "9c6f5af3-53bf-49b5-a436-b66766c413c3",
        clique: int = 1,
        ib_leaf: str | None = None,
        ib_leaf_name: str | None = None,
        rail_optimized: bool = True,
        hardware_serial: int = 0,
    ) -> None:
        """``fabric``: ``hgx`` (NVSwitch in one node, as HGX H100: registration
        completes, no cluster UUID, no IMEX), ``nvl72`` (a multi-node NVLink
        domain, as GB200 NVL72: ``nvlink_cluster`` and ``clique`` are the GPUs'
        registration, and the host runs IMEX) or ``none`` (no fabric, as PCIe GPUs).

        ``ib_leaf``: the node GUID (``0x...``) of the InfiniBand switch rail 0 is cabled
        to, named ``ib_leaf_name`` in its NodeDescription; the other rails are on the
        next switches (``rail_optimized``) or on the same one. None: no switch answers
        (the leaf is unknown). ``hardware_serial`` sets the HCAs' node GUIDs (another
        serial: replaced hardware)."""
        if fabric not in SIM_FABRICS:
            raise ValueError(f"fabric={fabric!r}: choose one of {', '.join(SIM_FABRICS)}")
        self.node = node
        self.publish_dir = publish_dir
        self.fabric = fabric
        self._cluster = (
            nvlink_cluster if fabric == "nvl72" else "00000000-0000-0000-0000-000000000000"
        )
        self._clique = clique if fabric == "nvl72" else 0
        self._imex = "READY"
        self._ib_leaf = ib_leaf
        self._ib_leaf_name = ib_leaf_name
        self._rail_optimized = rail_optimized
        self._hca_guid = 0xFC6A1C0300000000 | (zlib.crc32(node.encode()) & 0xFFFF) << 16
        self._hca_guid |= (hardware_serial & 0xFF) << 8
        self._lock = threading.Lock()
        self._gpus = [SimGpu(i, GPU_BUSES[i % len(GPU_BUSES)]) for i in range(gpus)]
        self._hcas = [SimHca(f"mlx5_{i}", HCA_BUSES[i % len(HCA_BUSES)]) for i in range(hcas)]
        self._kernel: list[str] = []
        self._read_upto = 0
        self._seq = 0
        self._booted = time.monotonic()
        self._busy = False
        self._hang = False
        self._nccl_factor = 1.0
        self._dir = Path(tempfile.mkdtemp(prefix="gpufleet-sim-"))
        self.sysfs_root = self._dir
        # The sysfs tree goes with the object, or at exit, even when nobody calls close():
        # short-lived simulators (tests, the simulator's nodes) would otherwise fill /tmp.
        self._remove_dir = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self.injected: list[str] = []
        self.resets = 0
        """GPU resets carried out (tests assert that a refused request did none)."""
        self._write_sysfs()

    # ------------------------------------------------------------------ Hardware

    def gpus(self) -> list[dict[str, Any]]:
        if self._hang:  # injected "hang": never returns, like NVML on a wedged GPU
            threading.Event().wait()
        with self._lock:
            return [{**g.raw(), **self._fabric_raw(g)} for g in self._gpus if g.present]

    def _fabric_raw(self, g: SimGpu) -> dict[str, Any]:
        """NVML's GpuFabricInfo v3 of one GPU, as the real backend reads it."""
        if self.fabric == "none":
            return {"fabric_state": 0}
        registered = g.fabric_state == 3 and g.fabric_status == 0
        return {
            "fabric_state": g.fabric_state,
            "fabric_status": g.fabric_status,
            "fabric_clique_id": self._clique if registered else 0,
            "fabric_cluster_uuid": self._cluster
            if registered
            else "00000000-0000-0000-0000-000000000000",
            "fabric_health_mask": 1 if g.fabric_degraded else 2,
            "fabric_health_summary": (2 if g.fabric_degraded else 1)
            if self.fabric == "nvl72"
            else 0,
        }

    def imex_status(self) -> str | None:
        with self._lock:
            return self._imex if self.fabric == "nvl72" else None

    def ib_neighbour(self, hca: str, port: int) -> tuple[str, str | None]:
        """The switch of this HCA's rail, in ``smpquery``'s output format; the switch
        port is the same for every rail and stable per node."""
        with self._lock:
            leaf, name = self._ib_leaf, self._ib_leaf_name
            rail = next((i for i, h in enumerate(self._hcas) if h.name == hca), None)
        if leaf is None or rail is None:
            raise HardwareError(f"{hca}/{port}: no answer by directed route 0,{port}")
        guid = int(leaf, 16) + (rail if self._rail_optimized else 0)
        desc = name if name is None or rail == 0 or not self._rail_optimized else f"{name}-{rail}"
        switch_port = zlib.crc32(self.node.encode()) % 32 + 1
        info = ib_neighbours.render_nodeinfo(f"0x{guid:016x}", switch_port)
        text = ib_neighbours.render_nodedesc(
            f"MF0;{desc}:MQM9700/U1" if desc else "Quantum Mellanox Technologies"
        )
        return info, text

    def cable_to(self, leaf: str | None, name: str | None = None) -> None:
        """Move the node to another leaf switch (its rail 0 is cabled there now)."""
        with self._lock:
            self._ib_leaf, self._ib_leaf_name = leaf, name

    def kernel_lines(self) -> list[str]:
        with self._lock:
            lines = self._kernel[self._read_upto :]
            self._read_upto = len(self._kernel)
            return lines

    def dcgm_diag(self, level: int, timeout_s: float) -> str | None:
        with self._lock:
            gpus = [g for g in self._gpus if g.present]
        results = [
            {
                "gpu_ids": str(g.index),
                "status": "Fail" if g.dcgm_fail else "Pass",
                **(
                    {"warnings": f"GPU {g.index}: memory test found 12 bad addresses"}
                    if g.dcgm_fail
                    else {}
                ),
            }
            for g in gpus
        ]
        tests = [{"name": "Memory", "results": results}]
        if level >= 2:
            tests.append(
                {
                    "name": "Diagnostic",
                    "results": [{"gpu_ids": str(g.index), "status": "Pass"} for g in gpus],
                }
            )
        doc = {
            "DCGM GPU Diagnostic": {
                "test_categories": [
                    {
                        "category": "Deployment",
                        "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}],
                    },
                    {"category": "Hardware", "tests": tests},
                ],
                "version": "3.3.5 (simulated)",
            }
        }
        return json.dumps(doc)

    def compute_devices(self) -> list[compute.ComputeDevice]:
        """The present GPUs as devices for the active checks (tests replace them
        with :class:`compute.NumpyDevice` to measure the CPU)."""
        with self._lock:
            return [SimDevice(g) for g in self._gpus if g.present]

    def run_gemm(self, n: int, iters: int, seed: int) -> dict[int, compute.GemmRun]:
        return {d.index: d.gemm(n, iters, seed) for d in self.compute_devices()}

    def run_copy(self, nbytes: int, iters: int) -> dict[int, compute.CopyRun]:
        return {d.index: d.copy(nbytes, iters) for d in self.compute_devices()}

    def allreduce(self, nbytes: int, iters: int) -> compute.AllReduceRun | None:
        world = len(self.compute_devices())
        if world < 2:
            return None
        busbw = NOMINAL["busbw_gbps"] * self._nccl_factor
        algbw = busbw * world / (2.0 * (world - 1))
        seconds = nbytes * iters / (algbw * 1e9)
        return compute.AllReduceRun(world, nbytes, iters, seconds, "simulated", True)

    def busy(self) -> bool:
        return self._busy

    def reset_gpu(self, index: int | None) -> str:
        """A reset brings a GPU back to healthy, as a real reset does for transient faults.

        A GPU marked ``missing`` (fallen off the bus) does not come back from a reset.
        """
        with self._lock:
            targets = [g for g in self._gpus if index is None or g.index == index]
            if not targets:
                raise HardwareError(f"no GPU {index} on this node")
            gone = [g.index for g in targets if not g.present]
            if gone:
                raise HardwareError(f"GPU {gone[0]} is not on the bus: a reset cannot reach it")
            for g in targets:
                self._gpus[g.index] = SimGpu(g.index, g.bus)
            self.resets += 1
            self._write_sysfs()
        which = "every GPU" if index is None else f"GPU {index}"
        return f"simulated reset of {which}"

    def close(self) -> None:
        self._remove_dir()

    # ----------------------------------------------------------------- injection

    def inject(self, text: str) -> FaultSpec:
        """Inject one fault (see :data:`KINDS`); returns the parsed spec."""
        spec = parse_spec(text)
        with self._lock:
            self._apply(spec)
            self.injected.append(text)
            self._write_sysfs()
        return spec

    def recover(self) -> None:
        """Heal everything: GPUs, HCAs and checks back to healthy (counters keep their values)."""
        with self._lock:
            counters = {h.name: (h.link_downed, h.symbol_error) for h in self._hcas}
            self._gpus = [SimGpu(g.index, g.bus) for g in self._gpus]
            self._hcas = [
                SimHca(
                    h.name, h.bus, link_downed=counters[h.name][0], symbol_error=counters[h.name][1]
                )
                for h in self._hcas
            ]
            self._busy = False
            self._nccl_factor = 1.0
            self._imex = "READY"
            self.injected.clear()
            self._write_sysfs()

    def _gpu(self, spec: FaultSpec) -> SimGpu:
        i = spec.int("gpu", 0)
        if not 0 <= i < len(self._gpus):
            raise InjectionError(f"gpu={i}: this node has GPUs 0..{len(self._gpus) - 1}")
        return self._gpus[i]

    def _hca(self, spec: FaultSpec) -> SimHca:
        name = spec.params.get("hca", "mlx5_0")
        for h in self._hcas:
            if h.name == name:
                return h
        raise InjectionError(f"hca={name}: known {', '.join(h.name for h in self._hcas)}")

    def _log(self, text: str) -> None:
        self._seq += 1
        usec = int((time.monotonic() - self._booted) * 1e6) + 5_000_000
        self._kernel.append(kmsg.kmsg_line(text, seq=self._seq, usec=usec))

    def _apply(self, spec: FaultSpec) -> None:
        k, K = spec.kind, FaultKind
        if k == K.XID:
            g = self._gpu(spec)
            code = spec.int("xid", 0)
            bus = f"PCI:0000:{g.bus}:00"
            if code == 154:
                action = spec.params.get("action", "gpu-reset")
                if action not in RECOVERY_TEXT:
                    raise InjectionError(f"action={action}: known {', '.join(RECOVERY_TEXT)}")
                self._log(
                    f"NVRM: Xid ({bus}): 154, GPU recovery action changed from 0x0 "
                    f"(None) to {RECOVERY_TEXT[action]}"
                )
                return
            if code in nvlink5.FAMILY:  # printed without pid and name (GB200 drivers)
                self._log(f"NVRM: Xid ({bus}): {code}, {_nvlink5_text(code, spec)}")
                return
            info = xids.XIDS.get(code)
            text = XID_TEXT.get(code, info.meaning if info else "Unknown error")
            self._log(f"NVRM: Xid ({bus}): {code}, pid=4242, name=python3, {text}")
        elif k == K.ECC_UNCORRECTABLE:
            self._gpu(spec).ecc_dbe += spec.int("count", 1)
        elif k == K.ROW_REMAP_PENDING:
            self._gpu(spec).remap_pending = True
        elif k == K.ROW_REMAP_FAILED:
            self._gpu(spec).remap_failure = True
        elif k == K.RETIRED_PAGES_LIMIT:
            self._gpu(spec).retired = spec.int("count", 64)
        elif k == K.NVLINK_DOWN:
            self._gpu(spec).links_down.add(spec.int("link", 0))
        elif k == K.IB_PORT_DOWN:
            self._hca(spec).state = "DOWN"
        elif k == K.IB_LINK_FLAP:
            self._hca(spec).link_downed += spec.int("count", 1)
        elif k == K.IB_RATE_DEGRADED:
            self._hca(spec).rate = float(spec.int("rate", 200))
        elif k == K.IB_SYMBOL_ERRORS:
            self._hca(spec).symbol_error += spec.int("count", 100)
        elif k == K.PCIE_DEGRADED:
            self._gpu(spec).width = spec.int("width", 8)
        elif k == K.GPU_MISSING:
            self._gpu(spec).present = False
        elif k == K.THERMAL_THROTTLE:
            g = self._gpu(spec)
            g.reasons, g.temperature = 0x40, 92.0
        elif k == K.POWER_THROTTLE:
            self._gpu(spec).reasons = 0x80
        elif k == K.KERNEL_SOFT_LOCKUP:
            self._log(
                f"watchdog: BUG: soft lockup - CPU#{spec.int('cpu', 12)} stuck for 23s! "
                "[python3:4242]"
            )
        elif k == K.KERNEL_HUNG_TASK:
            self._log("INFO: task python3:4242 blocked for more than 122 seconds.")
        elif k in (K.GEMM_BELOW_THRESHOLD, K.STRAGGLER):
            # A GPU that computes slowly: the GEMM check sees it when the node is
            # idle, the job's telemetry when it is busy (published speed).
            self._gpu(spec).gemm_factor = _factor(spec)
        elif k == K.HBM_BELOW_THRESHOLD:
            self._gpu(spec).hbm_factor = _factor(spec)
        elif k == K.NCCL_BELOW_THRESHOLD:
            self._nccl_factor = _factor(spec)
        elif k == K.SDC_MISMATCH:
            self._gpu(spec).sdc = True
        elif k == K.DCGM_DIAG_FAILED:
            self._gpu(spec).dcgm_fail = True
        elif k in (K.NVSWITCH_FATAL, K.NVSWITCH_NONFATAL):
            sw, link = spec.int("switch", 0), spec.int("link", 12)
            bus = NVSWITCH_BUSES[sw % len(NVSWITCH_BUSES)]
            sxid, severity, text = (
                (24007, "Fatal", "sourcetrack timeout error")
                if k == K.NVSWITCH_FATAL
                else (20009, "Non-fatal", "RX Short Error Rate")
            )
            self._log(
                f"nvidia-nvswitch{sw}: SXid (PCI:0000:{bus}:00.0): {spec.int('sxid', sxid):05d}, "
                f"{severity}, Link {link:02d} {text}"
            )
        elif k == K.FABRIC_NOT_READY:
            if self.fabric == "none":
                raise InjectionError("this simulated node has no NVLink fabric (fabric=none)")
            g = self._gpu(spec)
            if spec.params.get("state", "failed") == "in-progress":
                g.fabric_state = 2
            else:
                g.fabric_status = "NVML_ERROR_INSUFFICIENT_RESOURCES"
        elif k == K.FABRIC_DEGRADED:
            if self.fabric == "none":
                raise InjectionError("this simulated node has no NVLink fabric (fabric=none)")
            self._gpu(spec).fabric_degraded = True
        elif k == K.IMEX_NOT_READY:
            if self.fabric != "nvl72":
                raise InjectionError("this simulated node runs no IMEX (only fabric=nvl72 does)")
            self._imex = spec.params.get("answer", "NOT_READY")
        elif k == "kmsg-garbage":
            self._kernel.append("6,17,garbage;NVRM: Xid (PCI:0000:3a")
            self._kernel.append("NVRM: Xid (PCI:zz:zz): seventy-nine")
        elif k == "hang":
            self._hang = True
        elif k == "sdc-silent":
            if "step" not in spec.params:
                raise InjectionError("give the step after which a job flips a weight: step=K")
            step = spec.int("step", 0)
            if step < 0:
                raise InjectionError(f"step={step}: give a training step, 0 or more")
            g = self._gpu(spec)
            g.sdc, g.sdc_flip_at_step = True, step
        elif k == "nic-down":
            pass  # seen by the gang preflight (gpufleet.health.preflight), not by a check
        elif k == "crash":
            raise RuntimeError("simulated crash inside the check code")
        elif k == "busy":
            self._busy = True
            for g in self._gpus:
                g.reasons &= ~0x1
        else:
            raise InjectionError(f"the simulator cannot inject {k!r}")

    def speeds(self) -> list[float]:
        """Each GPU's speed for jobs (1.0 = nominal; a GPU off the bus: 0)."""
        return [g.gemm_factor if g.present else 0.0 for g in self._gpus]

    def _publish(self) -> None:
        """Write the node's speed for jobs (atomically: a job may be reading it)."""
        if self.publish_dir is None:
            return
        speeds = self.speeds()
        gpus: list[dict[str, Any]] = []
        for g, v in zip(self._gpus, speeds, strict=True):
            entry: dict[str, Any] = {"index": g.index, "speed": v}
            if g.sdc_flip_at_step is not None:
                entry["sdc_flip_at_step"] = g.sdc_flip_at_step
            gpus.append(entry)
        doc: dict[str, Any] = {"node": self.node, "speed": min(speeds, default=1.0), "gpus": gpus}
        flips = [g.sdc_flip_at_step for g in self._gpus if g.sdc_flip_at_step is not None]
        if flips:
            doc["sdc_flip_at_step"] = min(flips)
        self.publish_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.publish_dir / f".{self.node}.json.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.publish_dir / f"{self.node}.json")

    def _write_sysfs(self) -> None:
        self._publish()
        for i, h in enumerate(self._hcas):
            port = sysfs.IbPort(
                hca=h.name,
                port=1,
                state=h.state,
                phys_state="LINKUP" if h.state == "ACTIVE" else "POLLING",
                rate_gbps=h.rate,
                link_layer="InfiniBand",
                counters={
                    "link_downed": h.link_downed,
                    "symbol_error": h.symbol_error,
                    "link_error_recovery": 0,
                    "port_rcv_errors": 0,
                },
                node_guid=f"0x{self._hca_guid | i:016x}",
                sm_lid=1,
            )
            sysfs.write_ib_port(self._dir, port)
            addr = f"0000:{h.bus}:00.0"
            dev = self._dir / sysfs.PCI_DEVICES / addr
            dev.mkdir(parents=True, exist_ok=True)
            for name, value in (
                ("current_link_speed", "32.0 GT/s PCIe"),
                ("max_link_speed", "32.0 GT/s PCIe"),
                ("current_link_width", "16"),
                ("max_link_width", "16"),
            ):
                (dev / name).write_text(value + "\n")
            link = self._dir / sysfs.IB_CLASS / h.name / "device"
            if not link.is_symlink():
                link.symlink_to(dev)
