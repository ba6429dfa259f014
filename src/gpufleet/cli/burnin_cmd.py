"""``gpufleet burn-in domain NAME``: burn in an NVLink domain as a unit (decision 0246).

One all-reduce across the domain's trays and one over each pair of ring neighbours, as
one Slurm job (:mod:`gpufleet.slurm.domain_burnin`), judged by
:func:`gpufleet.domain.domain_burnin.judge`; the verdict is printed and kept on every
tray's Node, where the lifecycle controller reads it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.options import KubeconfigOpt, kubeconfig_arg
from gpufleet.cli.output import Format, OutputOpt, emit

app = typer.Typer(
    no_args_is_help=True,
    help="Burn in an NVLink domain as a unit: an all-reduce across its trays, as a Slurm job.",
)

ALLOWED_STATES = ("burn-in", "verifying", "triage")
"""States whose trays carry no production work: the only ones the burn-in runs on."""

DEFAULT_SIZES = "1048576,8388608"
SLOW_S = 0.5
"""What --inject-slow adds to each timed all-reduce of the tray (a slow NVLink port)."""


@app.command("domain")
def domain(
    name: Annotated[str, typer.Argument(help="The NVLink domain (as gpufleet topology shows it).")],
    kubeconfig: KubeconfigOpt = None,
    nvlink_label: Annotated[
        str,
        typer.Option(
            help="The Node label an operator or Topograph sets to the NVLink domain (the "
            "FleetPolicy's safety.budget.perDomain.label)."
        ),
    ] = "network.topology.nvidia.com/accelerator",
    backend: Annotated[
        str,
        typer.Option(
            help="real: NCCL on the trays' GPUs; simulated: gloo on their CPUs (the local "
            "cluster), where --inject-slow and --inject-wrong work."
        ),
    ] = "real",
    ranks_per_node: Annotated[
        int, typer.Option(min=1, max=64, help="Ranks per tray (real: one per GPU).")
    ] = 1,
    sizes: Annotated[
        str, typer.Option(help="Message sizes in bytes, comma-separated; judged at the largest.")
    ] = DEFAULT_SIZES,
    iters: Annotated[int, typer.Option(min=1, max=1000, help="Timed iterations per size.")] = 5,
    min_busbw: Annotated[
        float,
        typer.Option(
            help="The all-reduce across the domain must reach this bus bandwidth, GB/s "
            "(0: none; the pairs are still compared with each other)."
        ),
    ] = 0.0,
    pair_tolerance: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            max=1.0,
            help="A pair slower than this fraction of the best pair is bad; default 0.5, "
            "0.1 with --backend simulated (CPU timings on a shared machine spread four "
            "times and more; an injected slow tray is a hundred times slower).",
        ),
    ] = None,
    python: Annotated[
        str,
        typer.Option(help="The Python with gpufleet and torch on the trays; default: this one."),
    ] = "",
    timeout: Annotated[
        float, typer.Option(min=10, max=7200, help="Seconds the all-reduce job may take.")
    ] = 300.0,
    base_port: Annotated[
        int, typer.Option(help="Rendezvous port base on the first tray (+ job id % 1000).")
    ] = 29700,
    inject_slow: Annotated[
        list[str] | None,
        typer.Option(help="simulated only: this tray adds 0.5 s to every timed all-reduce."),
    ] = None,
    inject_wrong: Annotated[
        list[str] | None,
        typer.Option(help="simulated only: this tray contributes a wrong value."),
    ] = None,
    record: Annotated[
        bool,
        typer.Option(help="Keep the verdict on every tray's Node (the controller reads it)."),
    ] = True,
    slurm_conf: Annotated[
        Path | None, typer.Option(help="slurm.conf for srun, squeue and scontrol.")
    ] = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Burn in an NVLink domain: all-reduce across its trays and over each pair of them.

    Runs only on trays in burn-in, verifying or triage, none running a Slurm job: a
    maintenance reservation holds them for the job (docs/controller.md, "Domain
    burn-in"). The domain fails on a wrong sum, a bus bandwidth under --min-busbw, or a
    pair slower than --pair-tolerance of the best pair; a tray bad in every pair it is in
    is named (it goes to the per-node repair path), the others stay held. Exit status: 0
    passed, 1 failed, 2 refused, 3 no result.

    Example:

        gpufleet burn-in domain nvl72-rack-07 --ranks-per-node 4 --min-busbw 600
    """
    import asyncio

    from gpufleet.cli.errors import EXIT_NO, EXIT_NO_ANSWER, fail
    from gpufleet.domain import domain_burnin as db
    from gpufleet.domain import nccl_tests, topology, well_known
    from gpufleet.slurm import domain_burnin as runner
    from gpufleet.slurm.errors import SlurmError
    from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig

    if backend not in ("real", "simulated"):
        fail(f"--backend must be real or simulated, not {backend!r}")
    if (inject_slow or inject_wrong) and backend != "simulated":
        fail("--inject-slow and --inject-wrong need --backend simulated")
    try:
        size_list = sorted({int(s) for s in sizes.split(",") if s.strip()})
    except ValueError:
        fail(f"--sizes must be byte counts separated by commas, not {sizes!r}")
    if not size_list or size_list[0] < 4:
        fail("--sizes needs at least one size of 4 bytes or more")
    nodes = _nodes(kubeconfig)
    trays = sorted(
        str(n["metadata"]["name"])
        for n in nodes
        if topology.nvlink_domain_of(
            str(n["metadata"]["name"]), n["metadata"].get("labels") or {}, nvlink_label
        )
        == name
    )
    if len(trays) < 2:
        fail(
            f"NVLink domain {name!r} has {len(trays)} tray(s): a domain burn-in needs two or more",
            hint="gpufleet topology shows each node's domain",
        )
    states = {
        str(n["metadata"]["name"]): (n["metadata"].get("labels") or {}).get(
            well_known.LABEL_STATE, ""
        )
        for n in nodes
    }
    busy = [f"{t} ({states[t] or 'no state'})" for t in trays if states[t] not in ALLOWED_STATES]
    if busy:
        fail(
            f"not started: tray(s) not out of production: {', '.join(busy)}",
            hint=f"the domain burn-in runs only on trays in {', '.join(ALLOWED_STATES)}",
        )
    faults: dict[str, dict[str, Any]] = {}
    for t in inject_slow or []:
        faults.setdefault(t, {})["slow_s"] = SLOW_S
    for t in inject_wrong or []:
        faults.setdefault(t, {})["wrong"] = True
    tolerance = pair_tolerance or (0.1 if backend == "simulated" else 0.5)
    env = {"SLURM_CONF": str(slurm_conf)} if slurm_conf else {}
    job = runner.Job(
        domain=name,
        trays=tuple(trays),
        program={
            "trays": trays,
            "sizes": size_list,
            "iters": iters,
            "timeout_s": timeout,
            "base_port": base_port,
            "faults": faults,
        },
        python=python or sys.executable,
        ranks_per_node=ranks_per_node,
        timeout_s=timeout,
        env=env,
    )
    scontrol = Scontrol(ScontrolConfig(env=env, timeout_s=30))
    try:
        ran = asyncio.run(runner.run(job, scontrol))
    except runner.Refused as exc:
        fail(str(exc))
    except SlurmError as exc:
        fail(f"no result: {exc}", code=EXIT_NO_ANSWER)
    verdict = db.judge(
        name,
        trays,
        nccl_tests.parse_runs(ran.output),
        db.Limits(min_busbw_gbps=min_busbw, pair_tolerance=tolerance),
    )
    if ran.exit_code != 0 and verdict.passed:  # a result, yet the job failed: not trusted
        verdict = db.Verdict(False, f"the all-reduce job exited {ran.exit_code}", ())
    data = {
        **verdict.to_json(),
        "domain": name,
        "trays": trays,
        "seconds": round(ran.seconds, 2),
        "exitCode": ran.exit_code,
    }
    if ran.exit_code != 0:
        data["stderr"] = ran.stderr.strip()[-2000:]
    if record:
        kept = db.Recorded(name, verdict.passed, time.time(), verdict.reason, verdict.bad)
        _record(kubeconfig, trays, kept.to_json())
    emit(output, data, lambda wide: _draw(data))
    if not verdict.passed:
        raise typer.Exit(EXIT_NO_ANSWER if verdict.busbw_gbps is None else EXIT_NO)


def _draw(data: dict[str, Any]) -> str:
    word = "passed" if data["passed"] else "FAILED"
    lines = [f"domain {data['domain']}: {word} ({data['seconds']} s)", data["reason"]]
    if data["bad"]:
        lines.append(f"named bad: {', '.join(data['bad'])}")
    for pair, bw in data["pairs"].items():
        lines.append(f"  {pair}: {'no result' if bw is None else f'{bw:.3g} GB/s'}")
    if data.get("stderr"):
        lines.append(data["stderr"])
    return "\n".join(lines)


def _nodes(kubeconfig: Path | None) -> list[dict[str, Any]]:
    import asyncio

    from gpufleet.kubeapi import NODES, KubeApi

    async def read() -> list[dict[str, Any]]:
        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
        return (await client.list(NODES)).items

    return asyncio.run(read())


def _record(kubeconfig: Path | None, trays: list[str], text: str) -> None:
    import asyncio

    from gpufleet.domain import well_known
    from gpufleet.kubeapi import NODES, KubeApi

    async def write() -> None:
        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
        for t in trays:
            patch = {"metadata": {"annotations": {well_known.ANNOTATION_DOMAIN_BURN_IN: text}}}
            await client.patch(NODES, t, patch)

    asyncio.run(write())
