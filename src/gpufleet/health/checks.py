"""The checks: passive ones from one monitor poll, active ones that measure.

Each check has a stable name (used in ``--checks``, metrics and killswitches)
and returns a :class:`~gpufleet.health.results.CheckResult`. The judging is
pure: :func:`judge_passive`, :func:`judge_gemm`, :func:`judge_hbm`,
:func:`judge_allreduce` and :func:`judge_dcgm` take raw measurements and a
SKU profile; :func:`run_checks` gathers the measurements from a
:class:`~gpufleet.health.hardware.Hardware`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from gpufleet.domain import profiles as prof
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.health import compute, tool_output
from gpufleet.health.check_names import ACTIVE as ACTIVE
from gpufleet.health.check_names import ALL as ALL
from gpufleet.health.check_names import PASSIVE as PASSIVE
from gpufleet.health.hardware import Hardware, HardwareError
from gpufleet.health.monitors import PassiveMonitors, Snapshot
from gpufleet.health.results import CheckResult, CheckStatus, from_faults


def judge_passive(name: str, snaps: Sequence[Snapshot]) -> CheckResult:
    """A passive check from one or more polls (instant faults of all, states of the last)."""
    kinds, subsystem, ok = PASSIVE[name]
    last = snaps[-1]
    faults = [f for f in last.faults() if f.kind in kinds]
    for earlier in snaps[:-1]:
        faults.extend(
            f for o in earlier.observations.values() for f in o.instant if f.kind in kinds
        )
    faults.sort(key=lambda f: (f.key, f.evidence.scope()))
    if not faults and subsystem is not None:
        obs = last.observations.get(subsystem)
        if obs is not None and not obs.readable:
            return CheckResult(name, CheckStatus.UNKNOWN, obs.unreadable_reason)
    return from_faults(name, faults, ok, measured=float(len(faults)), threshold=0.0, unit="faults")


def _fault(kind: FaultKind, node: str, now: float, **ev: object) -> FaultEvent:
    return FaultEvent(kind, node, now, evidence=Evidence(**ev))  # type: ignore[arg-type]


def _rate_faults(
    values: dict[int, float],
    *,
    minimum: float,
    peer_tolerance: float,
    kind: FaultKind,
    what: str,
    unit: str,
    counter: str,
    node: str,
    now: float,
) -> list[FaultEvent]:
    """Faults for per-GPU rates (GEMM TFLOP/s, HBM GB/s): below the profile's
    minimum, or (if not already) well below the median of the GPU's peers."""
    faults: list[FaultEvent] = []
    for i, value in sorted(values.items()):
        j = prof.at_least(value, minimum, f"GPU {i} {what}", unit)
        if j.verdict is prof.Verdict.FAIL:
            faults.append(
                _fault(
                    kind,
                    node,
                    now,
                    gpu_index=i,
                    counters={counter: round(value, 3), "threshold": minimum},
                    message=j.detail,
                )
            )
    for i, ratio in prof.laggards(values, peer_tolerance).items():
        if not any(f.evidence.gpu_index == i for f in faults):
            faults.append(
                _fault(
                    kind,
                    node,
                    now,
                    gpu_index=i,
                    counters={counter: round(values[i], 3), "ratio_to_median": round(ratio, 3)},
                    message=f"GPU {i} {what} {ratio:.0%} of the median of its peers",
                )
            )
    return faults


def judge_gemm(
    runs: dict[int, compute.GemmRun], profile: prof.SkuProfile, *, node: str, now: float
) -> CheckResult:
    """GEMM throughput per GPU against the profile and against the GPU's peers."""
    if not runs:
        return CheckResult("gemm", CheckStatus.UNKNOWN, "no device to run on")
    tflops = {i: r.tflops for i, r in runs.items()}
    faults = _rate_faults(
        tflops,
        minimum=profile.gemm_bf16_tflops_min,
        peer_tolerance=profile.peer_tolerance,
        kind=FaultKind.GEMM_BELOW_THRESHOLD,
        what="GEMM",
        unit="TFLOP/s",
        counter="tflops",
        node=node,
        now=now,
    )
    lowest = min(tflops.values())
    return from_faults(
        "gemm",
        faults,
        f"{len(runs)} GPU(s), lowest {lowest:.1f} TFLOP/s",
        measured=lowest,
        threshold=profile.gemm_bf16_tflops_min,
        unit="TFLOP/s",
        details={
            "tflops": {str(i): round(v, 4) for i, v in tflops.items()},
            "n": next(iter(runs.values())).n,
            "dtype": next(iter(runs.values())).dtype,
        },
    )


def judge_sdc(
    runs: dict[int, compute.GemmRun],
    reference: Callable[[compute.GemmRun], np.ndarray],
    profile: prof.SkuProfile,
    *,
    node: str,
    now: float,
) -> CheckResult:
    """Each GPU's GEMM result against a float64 CPU reference and against its peers."""
    if not runs:
        return CheckResult("sdc", CheckStatus.UNKNOWN, "no device to run on")
    errors = {i: compute.relative_error(r.rows, reference(r)) for i, r in runs.items()}
    faults = [
        _fault(
            FaultKind.SDC_MISMATCH,
            node,
            now,
            gpu_index=i,
            counters={
                "relative_error": err if np.isfinite(err) else -1.0,
                "tolerance": profile.sdc_rtol,
            },
            message=f"GPU {i} GEMM result differs from the reference (error {err:.3g})",
        )
        for i, err in sorted(errors.items())
        if not err <= profile.sdc_rtol
    ]
    shapes = {r.rows.shape for r in runs.values()}
    if len(runs) >= 3 and len(shapes) == 1:
        median = np.median(np.stack([r.rows for r in runs.values()]), axis=0)
        peer_tol = profile.sdc_rtol / 10
        for i, r in sorted(runs.items()):
            dev = compute.relative_error(r.rows, median)
            if not dev <= peer_tol and not any(f.evidence.gpu_index == i for f in faults):
                faults.append(
                    _fault(
                        FaultKind.SDC_MISMATCH,
                        node,
                        now,
                        gpu_index=i,
                        counters={"peer_deviation": dev if np.isfinite(dev) else -1.0},
                        message=f"GPU {i} GEMM result differs from its peers",
                    )
                )
    worst_err = max(errors.values())
    return from_faults(
        "sdc",
        faults,
        f"{len(runs)} GPU(s) agree with the reference",
        measured=worst_err,
        threshold=profile.sdc_rtol,
        unit="rel. error",
        details={"relative_error": {str(i): float(e) for i, e in errors.items()}},
    )


def judge_hbm(
    runs: dict[int, compute.CopyRun], profile: prof.SkuProfile, *, node: str, now: float
) -> CheckResult:
    """Device memory bandwidth per GPU against the profile and its peers."""
    if not runs:
        return CheckResult("hbm", CheckStatus.UNKNOWN, "no device to run on")
    gbps = {i: r.gbps for i, r in runs.items()}
    faults = _rate_faults(
        gbps,
        minimum=profile.hbm_gbps_min,
        peer_tolerance=profile.peer_tolerance,
        kind=FaultKind.HBM_BELOW_THRESHOLD,
        what="memory copy",
        unit="GB/s",
        counter="gbps",
        node=node,
        now=now,
    )
    lowest = min(gbps.values())
    return from_faults(
        "hbm",
        faults,
        f"{len(runs)} GPU(s), lowest {lowest:.1f} GB/s",
        measured=lowest,
        threshold=profile.hbm_gbps_min,
        unit="GB/s",
        details={"gbps": {str(i): round(v, 3) for i, v in gbps.items()}},
    )


def judge_allreduce(
    run: compute.AllReduceRun | None,
    profile: prof.SkuProfile,
    *,
    node: str,
    now: float,
    why_not: str = "needs at least two GPUs",
) -> CheckResult:
    """Intra-node all-reduce bus bandwidth against the profile; wrong sums are corruption."""
    if run is None:
        return CheckResult("allreduce", CheckStatus.UNKNOWN, f"not run: {why_not}")
    details = {
        "world": run.world,
        "bytes": run.nbytes,
        "backend": run.backend,
        "algbw_gbps": round(run.algbw_gbps, 4),
    }
    if not run.correct:
        f = _fault(
            FaultKind.SDC_MISMATCH,
            node,
            now,
            message=f"all-reduce over {run.world} ranks returned a wrong sum",
        )
        return from_faults(
            "allreduce",
            [f],
            "",
            measured=run.busbw_gbps,
            threshold=profile.allreduce_busbw_gbps_min,
            unit="GB/s",
            details=details,
        )
    j = prof.at_least(run.busbw_gbps, profile.allreduce_busbw_gbps_min, "all-reduce busbw", "GB/s")
    faults = []
    if j.verdict is prof.Verdict.FAIL:
        faults.append(
            _fault(
                FaultKind.NCCL_BELOW_THRESHOLD,
                node,
                now,
                counters={
                    "busbw_gbps": round(run.busbw_gbps, 3),
                    "threshold": profile.allreduce_busbw_gbps_min,
                    "world": run.world,
                },
                message=f"{j.detail} ({run.backend}, {run.world} ranks)",
            )
        )
    return from_faults(
        "allreduce",
        faults,
        j.detail,
        measured=run.busbw_gbps,
        threshold=profile.allreduce_busbw_gbps_min,
        unit="GB/s",
        details=details,
    )


def judge_dcgm(output: str | None, *, level: int, node: str, now: float) -> CheckResult:
    """``dcgmi diag`` results: any failed test is a fault on its GPU."""
    if output is None:
        return CheckResult("dcgm", CheckStatus.UNKNOWN, "not run: DCGM (dcgmi) is not installed")
    report = tool_output.parse_dcgmi_diag(output)
    if report is None:
        return CheckResult(
            "dcgm",
            CheckStatus.UNKNOWN,
            f"dcgmi diag -r {level} output is not the expected JSON: {output[:120]!r}",
        )
    faults = [
        _fault(
            FaultKind.DCGM_DIAG_FAILED,
            node,
            now,
            gpu_index=f.gpu,
            message=f"dcgmi diag -r {level}: {f.test} {f.status}: {f.message}".rstrip(": "),
        )
        for f in report.failures
    ]
    return from_faults(
        "dcgm",
        faults,
        f"dcgmi diag -r {level}: {report.tests_run} results passed",
        measured=float(len(faults)),
        threshold=0.0,
        unit="failed tests",
        details={"level": level, "version": report.version},
    )


def reference_for(run: compute.GemmRun, seed: int) -> np.ndarray:
    """The float64 reference rows for a GEMM run (inputs rounded like the device's)."""
    a, b = compute.inputs(run.n, seed)
    if run.dtype.startswith("bfloat16") and "simulated" not in run.dtype:
        a, b = compute.round_bf16(a), compute.round_bf16(b)
    return compute.reference_rows(a, b)


def idle_guard(hw: Hardware) -> Callable[[], str | None]:
    """A ``guard`` for :func:`run_checks`: no active check while GPU processes run,
    nor while NVML cannot say (fail closed: unknown is not idle)."""

    def why_not() -> str | None:
        try:
            busy = hw.busy()
        except HardwareError as exc:
            return f"GPU processes could not be read ({exc}); failing closed"
        return "GPU processes are running" if busy else None

    return why_not


def run_checks(
    hw: Hardware,
    profile: prof.SkuProfile,
    names: Sequence[str],
    *,
    node: str,
    clock: Callable[[], float] = time.time,
    between_polls: Callable[[], None] = lambda: None,
    dcgm_level: int = 1,
    iters: int = 3,
    seed: int = 1234,
    guard: Callable[[], str | None] | None = None,
) -> list[CheckResult]:
    """Run the named checks once. Passive checks poll twice (counters need a baseline);
    ``between_polls`` runs in between (the CLI injects simulated faults there).

    ``guard`` is asked before each active check; a reason from it makes that check
    UNKNOWN ("not run: ...") instead of running (:func:`idle_guard`: a stress test
    never starts while GPU processes run or while that cannot be read)."""
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    out: list[CheckResult] = []
    passive = [n for n in names if n in PASSIVE]
    if passive:
        monitors = PassiveMonitors(hw, profile, node=node)
        t0 = time.perf_counter()
        first = monitors.poll(clock())
        between_polls()
        second = monitors.poll(clock())
        spent = (time.perf_counter() - t0) / len(passive)
        out.extend(replace(judge_passive(n, [first, second]), duration_s=spent) for n in passive)
    else:
        between_polls()

    def timed(name: str, fn: Callable[[], CheckResult]) -> CheckResult:
        t0 = time.perf_counter()
        try:
            result = fn()
        except HardwareError as exc:
            result = CheckResult(name, CheckStatus.UNKNOWN, str(exc))
        return replace(result, duration_s=time.perf_counter() - t0)

    gemm_runs: dict[int, compute.GemmRun] | None = None

    def gemm_runs_once() -> dict[int, compute.GemmRun]:
        nonlocal gemm_runs
        if gemm_runs is None:
            gemm_runs = hw.run_gemm(profile.gemm_size, iters, seed)
        return gemm_runs

    for name in names:
        now = clock()
        if name in ACTIVE and guard is not None:
            why = guard()
            if why is not None:
                out.append(CheckResult(name, CheckStatus.UNKNOWN, f"not run: {why}"))
                continue
        if name == "gemm":
            out.append(
                timed(name, lambda: judge_gemm(gemm_runs_once(), profile, node=node, now=now))  # noqa: B023
            )
        elif name == "sdc":
            out.append(
                timed(
                    name,
                    lambda: judge_sdc(
                        gemm_runs_once(),
                        lambda r: reference_for(r, seed),
                        profile,
                        node=node,
                        now=now,  # noqa: B023
                    ),
                )
            )
        elif name == "hbm":
            out.append(
                timed(
                    name,
                    lambda: judge_hbm(
                        hw.run_copy(profile.hbm_bytes, iters),
                        profile,
                        node=node,
                        now=now,  # noqa: B023
                    ),
                )
            )
        elif name == "allreduce":
            out.append(
                timed(
                    name,
                    lambda: judge_allreduce(
                        hw.allreduce(profile.allreduce_bytes, iters),
                        profile,
                        node=node,
                        now=now,  # noqa: B023
                        why_not=getattr(hw, "allreduce_unavailable", "needs at least two GPUs"),
                    ),
                )
            )
        elif name == "dcgm":
            out.append(
                timed(
                    name,
                    lambda: judge_dcgm(
                        hw.dcgm_diag(dcgm_level, 600.0),
                        level=dcgm_level,
                        node=node,
                        now=now,  # noqa: B023
                    ),
                )
            )
    return out
