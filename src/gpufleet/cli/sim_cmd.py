"""``gpufleet sim``: what a policy does to goodput on a simulated fleet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufleet.cli.errors import fail
from gpufleet.cli.options import PolicyFileOpt
from gpufleet.cli.output import Format, JsonOpt, OutputOpt, chosen, emit

if TYPE_CHECKING:  # the simulator, numpy and the models: imported when a simulation runs
    from rich.console import RenderableType

    from gpufleet.domain.policy import Policy
    from gpufleet.sim import RunResult
    from gpufleet.sim.model import Model


def _read_policy(path: Path | None) -> Policy:
    from gpufleet.cli.policy_cmd import read_policy
    from gpufleet.domain.policy import default_policy

    if path is None:
        return default_policy()
    return read_policy(path)  # bounded: size, depth, UTF-8 (docs/decisions/0071)


def _read_model(path: Path | None) -> Model:
    from gpufleet.sim.model import default_model, load_model

    if path is None:
        return default_model()
    return load_model(path.read_text(encoding="utf-8"), str(path))


def sim(
    gpus: Annotated[int, typer.Option(min=1, help="GPUs of the training job.")] = 3504,
    days: Annotated[float, typer.Option(min=0.001, help="Simulated days.")] = 30.0,
    policy: PolicyFileOpt = None,
    model: Annotated[
        Path | None, typer.Option(help="Fleet model YAML; default: built-in (Llama 3 mix).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed of the first run.")] = 0,
    runs: Annotated[
        int, typer.Option(min=1, help="Runs (seeds seed..seed+runs-1); mean and 95% CI.")
    ] = 1,
    as_json: JsonOpt = False,
    output: OutputOpt = Format.TABLE,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG report (timeline and loss waterfall).")
    ] = None,
) -> None:
    """Simulate a fleet running one large training job under a policy.

    Prints the effective training time ratio (ETTR) and where the rest of the time
    went. The model (failure rates, detection and repair times, checkpointing) and
    the policy (the same file the controller uses) are YAML files; without them the
    built-in defaults are used (docs/simulator.md).

    -o wide adds each run's ETTR; -o json and -o yaml print every figure (--json is -o json).

    Example:

        gpufleet sim --gpus 3504 --days 30 --seed 1 -o json

        gpufleet sim --gpus 16384 --days 54 --runs 10 --policy my-policy.yaml --plot out.png
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gpufleet.domain.policy import PolicyError
    from gpufleet.sim import simulate, summarize
    from gpufleet.sim.model import ModelError

    fmt = chosen(output, as_json)
    try:
        pol = _read_policy(policy)
        mod = _read_model(model)
    except PolicyError as exc:
        fail(str(exc), hint=f"check it with: gpufleet policy validate {policy}")
    except ModelError as exc:
        fail(str(exc), hint="the model's fields are in docs/simulator.md")

    err = Console(stderr=True)
    results: list[RunResult] = []
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("simulating", total=float(runs))
        for k in range(runs):

            def tick(fraction: float, base: float = float(k)) -> None:
                bar.update(task, completed=base + fraction)

            results.append(
                simulate(
                    mod,
                    pol,
                    gpus=gpus,
                    days=days,
                    seed=seed + k,
                    progress=tick,
                )
            )
    if plot is not None:
        from gpufleet.sim.report import write_report

        write_report(plot, results)

    data = (
        results[0].to_dict()
        if runs == 1
        else {"summary": summarize(results), "runs": [r.to_dict() for r in results]}
    )
    emit(fmt, data, lambda wide: _draw(results, wide))


def _draw(results: list[RunResult], wide: bool) -> list[RenderableType]:
    from rich.table import Table

    from gpufleet.sim.result import BUCKETS, Estimate

    first = results[0]
    ettr = Estimate.of([r.ettr for r in results])
    ci = f" (95% CI {ettr.low * 100:.2f}-{ettr.high * 100:.2f}%)" if len(results) > 1 else ""
    out: list[RenderableType] = [
        f"{first.gpus} GPUs ({first.job_nodes} nodes + {first.spare_nodes} spare), "
        f"{first.days:g} days, {len(results)} run(s); checkpoint every "
        f"{first.checkpoint_interval_seconds / 60:.1f} min",
        f"[bold]ETTR {ettr.mean * 100:.2f}%[/bold]{ci}",
    ]
    table = Table("where the time went", "% of wall time", "hours")
    for k in BUCKETS:
        frac = sum(r.fractions()[k] for r in results) / len(results)
        hours = sum(r.buckets[k] for r in results) / len(results) / 3600.0
        table.add_row(k, f"{frac * 100:.2f}", f"{hours:.1f}")
    out.append(table)
    inter = Table("job interruptions (run 1)", "count")
    for name, n in first.interruptions.items():
        inter.add_row(name, str(n))
    out.append(inter)
    if wide and len(results) > 1:
        per_run = Table("run", "seed", "ETTR %")
        for i, r in enumerate(results, 1):
            per_run.add_row(str(i), str(r.seed), f"{r.ettr * 100:.2f}")
        out.append(per_run)
    out.append(
        f"decisions {first.decisions}, held by safety rails {first.held}, "
        f"actions by people {first.human_actions}"
    )
    return out
