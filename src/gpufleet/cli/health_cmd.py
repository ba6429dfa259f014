"""``gpufleet health``: run the node checks once, inject simulated faults."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from gpufleet.health import backends, checks, results, skus
from gpufleet.health.hardware import Hardware, NoGpuFound

app = typer.Typer(help="Run node health checks and inject simulated faults.", no_args_is_help=True)

DEFAULT_CHECKS = ",".join(checks.ALL)


@app.command("check")
def check(
    backend: str = typer.Option("real", help="Hardware backend: real or simulated."),
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
    node: str = typer.Option(socket.gethostname(), help="Node name used in the evidence."),
    dcgm_level: int = typer.Option(1, help="dcgmi diag level for the dcgm check (1-4)."),
    iters: int = typer.Option(3, help="Timed iterations of the active checks."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Run the checks once and print pass/fail, measured value, threshold and evidence.

    Exit code: 0 all passed, 1 a warning, 2 a check failed, 3 no GPU found
    (Nagios plugin codes). Checks that cannot run here (no DCGM, one GPU)
    are shown as "unknown" and do not fail the run.

    Example:

        gpufleet health check --backend simulated --inject xid=79,gpu=3 --json
    """
    names = [n.strip() for n in checks_.split(",") if n.strip()]
    if inject and backend != "simulated":
        raise typer.BadParameter("--inject needs --backend simulated", param_hint="--inject")
    try:
        hw = backends.open_backend(backend, node=node)
    except NoGpuFound as exc:
        _no_gpu(str(exc), as_json)
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
            _no_gpu(note, as_json)
            raise typer.Exit(3)
    _print(found, profile.name, backend, as_json)
    status = results.worst([r.status for r in found if r.status is not results.CheckStatus.UNKNOWN])
    raise typer.Exit(int(status))


def _safe_gpus(hw: Hardware) -> list[dict[str, Any]]:
    try:
        return hw.gpus()
    except Exception:
        return []


def _no_gpu(why: str, as_json: bool) -> None:
    text = f"no GPU found: {why}"
    if as_json:
        typer.echo(json.dumps({"status": "unknown", "reason": text, "checks": []}))
    else:
        Console(stderr=True).print(f"[yellow]{text}[/yellow]")


def _print(found: list[results.CheckResult], sku: str, backend: str, as_json: bool) -> None:
    overall = results.worst(
        [r.status for r in found if r.status is not results.CheckStatus.UNKNOWN]
    )
    if as_json:
        doc = {
            "status": overall.label,
            "sku": sku,
            "backend": backend,
            "checks": [r.as_json() for r in found],
        }
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    table = Table(title=f"gpufleet health check ({backend}, profile {sku})")
    for col in ("check", "status", "measured", "threshold", "seconds", "evidence"):
        table.add_column(col)
    colors = {"pass": "green", "warn": "yellow", "fail": "red", "unknown": "dim"}
    for r in found:
        measured = "" if r.measured is None else f"{r.measured:.4g} {r.unit}".strip()
        threshold = "" if r.threshold is None else f"{r.threshold:g}"
        label = r.status.label
        table.add_row(
            r.name,
            f"[{colors[label]}]{label}[/]",
            measured,
            threshold,
            f"{r.duration_s:.3f}",
            r.reason,
        )
    Console().print(table)


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
    path = "/recover" if fault == "recover" else "/inject"
    try:
        resp = httpx.post(url.rstrip("/") + path, json={"fault": fault}, timeout=5.0)
    except httpx.HTTPError as exc:
        typer.echo(f"cannot reach the agent at {url}: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(resp.text)
    if resp.status_code != 200:
        raise typer.Exit(1)
