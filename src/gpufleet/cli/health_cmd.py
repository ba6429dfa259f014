"""``gpufleet health``: run the node checks once, inject simulated faults."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.text import Text

from gpufleet.cli.errors import EXIT_NO, EXIT_NO_ANSWER, fail, warn
from gpufleet.cli.options import Backend, BackendOpt, NodeNameOpt, node_name
from gpufleet.cli.output import (
    Cell,
    Column,
    Format,
    JsonOpt,
    OutputOpt,
    chosen,
    emit,
    structured,
    table,
)
from gpufleet.health import check_names, results, slurm_hook

# The checks themselves (numpy), the backends and httpx are imported by the commands
# that run them: each command's --help needs only the names (docs/cli.md, start-up).
if TYPE_CHECKING:
    from gpufleet.health.hardware import Hardware

app = typer.Typer(help="Run node health checks and inject simulated faults.", no_args_is_help=True)

DEFAULT_CHECKS = ",".join(check_names.ALL)


@app.command("check")
def check(
    backend: BackendOpt = Backend.REAL,
    checks_: str = typer.Option(
        DEFAULT_CHECKS, "--checks", help="Comma-separated check names (default: all)."
    ),
    inject: list[str] = typer.Option(
        [],
        "--inject",
        help="Simulated backend only: a fault to inject, e.g. xid=79,gpu=3 (repeatable).",
    ),
    sku: str = typer.Option(
        "", help="SKU profile (h100-sxm, h200, a100-sxm, cpu); default: from the GPU name."
    ),
    profiles_file: Path | None = typer.Option(None, "--profiles", help="Profiles YAML file."),
    node: NodeNameOpt = None,
    dcgm_level: int = typer.Option(1, help="dcgmi diag level for the dcgm check (1-4)."),
    iters: int = typer.Option(3, help="Timed iterations of the active checks."),
    as_json: JsonOpt = False,
    output: OutputOpt = Format.TABLE,
    slurm: slurm_hook.Mode | None = typer.Option(
        None,
        "--slurm",
        help="Run as Slurm's HealthCheckProgram (health), Prolog or Epilog: bounded by "
        "--timeout; a failed check drains the node 'gpufleet: health ...'.",
    ),
    timeout: float = typer.Option(
        20.0, "--timeout", min=1.0, max=600.0, help="With --slurm: seconds the checks may take."
    ),
    preflight: bool = typer.Option(
        False,
        "--preflight",
        help="With --slurm prolog: for a multi-node job, all-reduce across its nodes first "
        "(needs PrologFlags=Alloc); a node that fails is excluded and the job requeued.",
    ),
    preflight_timeout: float = typer.Option(
        20.0, "--preflight-timeout", min=1.0, max=120.0, help="Seconds the all-reduce may take."
    ),
    preflight_port: int = typer.Option(
        29600,
        "--preflight-port",
        min=1024,
        max=64535,
        help="Rendezvous port base (+ job % 1000); the default range 29600-30599 misses "
        "torchrun's 29400, torch's MASTER_PORT 29500 and the agent's metrics port 29440.",
    ),
    allow_busy: bool = typer.Option(
        False,
        "--allow-busy",
        help="Run the active checks (gemm, sdc, hbm, allreduce, dcgm) even while GPU "
        "processes run or cannot be read; by default they are skipped (unknown) then.",
    ),
) -> None:
    """Run the checks once and print pass/fail, measured value, threshold and evidence.

    Exit code: 0 all passed, 1 a warning, 2 a check failed, 3 no GPU found
    (Nagios plugin codes). Checks that cannot run here (no DCGM, one GPU)
    are shown as "unknown" and do not fail the run; so are the active checks
    while GPU processes run or NVML cannot tell (--allow-busy runs them anyway).
    -o wide adds the faults each check reports; --json is -o json.

    Example:

        gpufleet health check --backend simulated --inject xid=79,gpu=3 -o json

    With --slurm (docs/slurm.md, "Slurm's own health checks") the checks run in a
    child process killed after --timeout seconds; a failed check drains the node
    (SLURMD_NODENAME) with reason 'gpufleet: health <check>: <why>'; a check that
    hangs, crashes or cannot tell drains nothing. A prolog exits 1 only for a
    failed check (Slurm requeues the job elsewhere); an epilog always exits 0:

        gpufleet health check --slurm prolog --timeout 20 --checks gpu-count,gpu-xid
    """
    from gpufleet.health import backends, checks, skus
    from gpufleet.health.hardware import NoGpuFound

    fmt = chosen(output, as_json)
    node = os.environ.get("SLURMD_NODENAME") or node_name(node) if slurm else node_name(node)
    names = [n.strip() for n in checks_.split(",") if n.strip()]
    if inject and backend != "simulated":
        raise typer.BadParameter("--inject needs --backend simulated", param_hint="--inject")
    if slurm is not None:
        args = ["--backend", str(backend), "--checks", checks_, "--node", node]
        args += ["--iters", str(iters), "--dcgm-level", str(dcgm_level)]
        args += [a for spec in inject for a in ("--inject", spec)]
        args += ["--sku", sku] if sku else []
        args += ["--allow-busy"] if allow_busy else []
        args += ["--profiles", str(profiles_file)] if profiles_file is not None else []
        result = slurm_hook.run_hook(slurm, node, _checks_once(args), timeout_s=timeout)
        typer.echo(slurm_hook.log_line(slurm, node, result), err=True)
        if preflight and slurm is slurm_hook.Mode.PROLOG and result.exit_code == 0:
            absent = backend == Backend.SIMULATED and any(
                spec.split(",")[0] == "nic-down" for spec in inject
            )
            typer.echo(_preflight(preflight_timeout, preflight_port, absent), err=True)
        raise typer.Exit(result.exit_code)
    try:
        hw = backends.open_backend(backend, node=node)
    except NoGpuFound as exc:
        _no_gpu(str(exc), fmt)
        raise typer.Exit(3) from None
    try:
        gpu_names = [str(g.get("name", "")) for g in _safe_gpus(hw)]
        profile = skus.choose(skus.load(profiles_file), sku=sku or None, gpu_names=gpu_names)

        def apply_injections() -> None:
            from gpufleet.health.backend_sim import InjectionError, SimulatedHardware

            assert isinstance(hw, SimulatedHardware) or not inject
            for spec in inject:
                try:
                    hw.inject(spec)  # type: ignore[attr-defined]
                except InjectionError as exc:
                    raise typer.BadParameter(str(exc), param_hint="--inject") from None

        try:
            found = checks.run_checks(
                hw,
                profile,
                names,
                node=node,
                between_polls=apply_injections,
                dcgm_level=dcgm_level,
                iters=iters,
                guard=None if allow_busy else checks.idle_guard(hw),
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--checks") from None
    finally:
        hw.close()
    if (
        backend == "real"
        and all(
            r.status is results.CheckStatus.UNKNOWN
            for r in found
            if r.name in ("gpu-count", "gemm")
        )
        and any(r.name in ("gpu-count", "gemm") for r in found)
    ):
        note = next((r.reason for r in found if r.name in ("gpu-count", "gemm")), "")
        if "no GPU" in note or "NVML" in note:
            _no_gpu(note, fmt)
            raise typer.Exit(3)
    _print(found, profile.name, backend, fmt)
    status = results.worst([r.status for r in found if r.status is not results.CheckStatus.UNKNOWN])
    raise typer.Exit(int(status))


def _checks_once(args: list[str]) -> Callable[[], object]:
    """This command without --slurm, printing JSON (run in the hook's forked child)."""

    def body() -> object:
        from gpufleet.cli.main import app

        return app(args=["health", "check", "-o", "json", *args], standalone_mode=False)

    return body


def _preflight(timeout: float, base_port: int, absent: bool) -> str:
    """The gang preflight of a multi-node job (never fails the prolog); one log line."""
    from gpufleet.health import preflight

    try:
        gang = preflight.gang_from_env(os.environ, base_port=base_port)
    except (KeyError, ValueError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"gpufleet preflight: not run: {exc}"
    if gang is None:
        return "gpufleet preflight: one node, nothing to check"
    found = preflight.run(gang, timeout_s=timeout, absent=absent)
    where = f"job={gang.job_id} rank={gang.rank}/{gang.world} seconds={found.seconds:.2f}"
    if found.ok or not found.ran or not found.bad:
        return f"gpufleet preflight: {where} ok={found.ok} {found.detail}".rstrip()
    try:
        done = preflight.requeue_without(gang, found.bad)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        done = [f"requeue failed: {exc}"]
    return f"gpufleet preflight: {where} failed on {','.join(found.bad)}: {'; '.join(done)}"


def _safe_gpus(hw: Hardware) -> list[dict[str, Any]]:
    try:
        return hw.gpus()
    except Exception:
        return []


def _no_gpu(why: str, fmt: Format) -> None:
    text = f"no GPU found: {why}"
    if structured(fmt):
        emit(fmt, {"status": "unknown", "reason": text, "checks": []}, lambda wide: "")
    else:
        warn(text)


_COLORS = {"pass": "green", "warn": "yellow", "fail": "red", "unknown": "dim"}
CHECK_COLUMNS = (
    Column("CHECK"),
    Column("STATUS"),
    Column("MEASURED"),
    Column("THRESHOLD"),
    Column("SECONDS"),
    Column("EVIDENCE"),
    Column("FAULTS", wide=True),
)


def _cells(r: results.CheckResult) -> list[Cell]:
    measured = "" if r.measured is None else f"{r.measured:.4g} {r.unit}".strip()
    label = r.status.label
    return [
        r.name,
        Text(label, _COLORS[label]),
        measured,
        "" if r.threshold is None else f"{r.threshold:g}",
        f"{r.duration_s:.3f}",
        r.reason,
        ", ".join(f.kind.value + (f"-{f.xid}" if f.xid else "") for f in r.faults) or "-",
    ]


def _print(found: list[results.CheckResult], sku: str, backend: str, fmt: Format) -> None:
    overall = results.worst(
        [r.status for r in found if r.status is not results.CheckStatus.UNKNOWN]
    )
    doc = {
        "status": overall.label,
        "sku": sku,
        "backend": str(backend),
        "checks": [r.as_json() for r in found],
    }
    title = f"gpufleet health check ({backend}, profile {sku})"
    emit(fmt, doc, lambda wide: table(CHECK_COLUMNS, map(_cells, found), wide=wide, title=title))


@app.command("scan-log")
def scan_log(
    file: Path = typer.Argument(
        ...,
        help="A kernel log: dmesg, dmesg -T, dmesg --time-format iso, journalctl -k, "
        "/var/log/kern.log or /dev/kmsg records; - reads stdin.",
        allow_dash=True,
    ),
    policy: Path | None = typer.Option(
        None, "--policy", help="Policy YAML file (default: the built-in policy)."
    ),
    as_json: JsonOpt = False,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Find the faults in a saved kernel log (offline: reads the file only): XIDs,
    MIG-attributed XIDs, NVSwitch SXids, GPUs fallen off the bus, soft lockups and
    hung tasks, each with what the policy does with one occurrence.

    Lines that mention a driver report but do not parse are counted as unparsed;
    records that did not come from the kernel (another program's journal line, a
    /dev/kmsg record of another facility) are counted as foreign, never faults.
    Exit code: 0 no fault, 1 faults found, 2 the file cannot be read.

    Example:

        journalctl -k -b -1 | gpufleet health scan-log - -o wide
    """
    from gpufleet.cli.policy_cmd import load_or_exit
    from gpufleet.domain import conditions
    from gpufleet.health import kmsg

    fmt = chosen(output, as_json)
    rules = load_or_exit(policy)
    try:
        if str(file) == "-":
            import sys

            text = sys.stdin.read()
        else:
            text = file.read_text(errors="replace")
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror}", code=2)
    found = kmsg.scan(text.splitlines(), node=node_name(None), now=0.0)
    rows = [
        {
            "fault": f.key,
            "reason": conditions.reason_of(f),
            "where": f.evidence.scope(),
            "pci": f.evidence.pci_bus_id or "",
            "policy": rules.rule_for(f).action.value,
            "evidence": f.evidence.summary(),
        }
        for f in found.faults
    ]
    data = {
        "faults": rows,
        "records": found.records,
        "unparsed": found.unparsed,
        "foreign": found.foreign,
    }
    emit(
        fmt,
        data,
        lambda wide: [
            table(
                [
                    "FAULT",
                    "WHERE",
                    "PCI",
                    "POLICY",
                    Column("EVIDENCE", cut=70),
                ],
                [[r["fault"], r["where"], r["pci"], r["policy"], r["evidence"]] for r in rows],
                wide=wide,
            ),
            Text(
                f"{len(rows)} fault(s) in {found.records} record(s); "
                f"{found.unparsed} unparsed, {found.foreign} not from the kernel"
            ),
        ],
    )
    if rows:
        raise typer.Exit(1)


@app.command("inject")
def inject_cmd(
    fault: str = typer.Argument(
        ..., help="Fault to inject, e.g. xid=79,gpu=3; 'recover' heals all."
    ),
    url: str = typer.Option("http://127.0.0.1:9401", help="The agent's injection API."),
) -> None:
    """Inject a fault into a running agent on the simulated backend (loopback HTTP API).

    Example:

        gpufleet health inject --url http://127.0.0.1:9401 xid=79,gpu=3
        gpufleet health inject --url http://127.0.0.1:9401 recover
    """
    import httpx

    path = "/recover" if fault == "recover" else "/inject"
    try:
        resp = httpx.post(url.rstrip("/") + path, json={"fault": fault}, timeout=5.0)
    except httpx.HTTPError as exc:
        fail(
            f"cannot reach the agent at {url}: {type(exc).__name__}: {exc}",
            hint="is the agent running with --backend simulated --inject-port?",
            code=EXIT_NO_ANSWER,
        )
    if resp.status_code != 200:
        fail(f"the agent refused: HTTP {resp.status_code}: {resp.text.strip()}", code=EXIT_NO)
    typer.echo(resp.text)
