"""``gpufleet demo``: a GPU fault and its recovery, end to end, on this machine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from gpufleet.demo.policy import DEMO_TIMES
from gpufleet.demo.scenario_names import NAMES

# The demo, its scenarios and the local cluster are imported when it runs: its --help
# needs only the names and the times (docs/cli.md, start-up).
if TYPE_CHECKING:
    from gpufleet.demo.runner import Demo

DEMO_NAME = "demo"


def _scenario_help() -> str:
    return "; ".join(NAMES)


def demo(
    scenario: Annotated[
        str, typer.Option("--scenario", "-s", help=f"One of: {_scenario_help()}.")
    ] = "xid79",
    nodes: Annotated[int, typer.Option("--nodes", "-n", min=4, max=8, help="GPU nodes.")] = 4,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the cluster running afterwards, to explore.")
    ] = False,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Run directory (logs of every component). Default: /tmp/gpufleet/demo."),
    ] = None,
) -> None:
    """Start a local GPU cluster, run a training job through Slurm, inject a fault and
    show gpufleet detect, isolate and repair it, with a live timeline and a summary.

    Starts: etcd, kube-apiserver, scheduler, controller-manager, KWOK GPU nodes,
    Slurm (slurmctld, one slurmd per node, slurmrestd), one Redfish BMC per node,
    one gpufleet agent per node (simulated GPUs), the lifecycle controller and the
    Slurm syncer. The FleetPolicy it applies is the default policy with shorter
    timeouts (every ladder step {ladder}s, verification {verify}s, drain
    {drain}s, a condition clears {clear}s after the fault stops).

    two-tenants starts instead Slurm 24.11 with accounting (slurmdbd, MariaDB) enforcing
    the tenants' limits and the tenant controller, with no agent, controller or syncer.

    Example:

        gpufleet demo --scenario controller-crash-mid-remediation --keep
    """
    from gpufleet.demo.runner import SCENARIOS, Demo
    from gpufleet.demo.timeline import StepMissed
    from gpufleet.local.binaries import MissingBinaryError
    from gpufleet.local.cluster import default_run_dir
    from gpufleet.local.processes import ComponentError, terminate_on_signals

    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"unknown scenario {scenario!r}; known: {_scenario_help()}")
    out = Console(highlight=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=120)
    err = Console(stderr=True, highlight=False)
    path = run_dir or default_run_dir(DEMO_NAME)
    started = time.monotonic()
    demo_: Demo | None = None
    ok = False
    try:
        with terminate_on_signals():
            chosen = SCENARIOS[scenario]
            demo_ = Demo.start(
                nodes=nodes,
                run_dir=path,
                console=out,
                machines=chosen.machines,
                tenants=chosen.tenants,
            )
            ready = time.monotonic()
            demo_.run(scenario)
            ok = True
            out.print(
                f"\n[bold green]Scenario {scenario} completed[/bold green] in "
                f"{time.monotonic() - ready:.1f} s after set-up "
                f"({time.monotonic() - started:.1f} s in all)."
            )
    except (StepMissed, ComponentError) as exc:
        err.print(f"\n[red]demo failed:[/red] {exc}")
        err.print(f"every component's log is in {path / 'logs'}")
    except MissingBinaryError as exc:
        err.print(f"[red]error:[/red] {exc}\nrun scripts/bootstrap-system.sh first")
    except KeyboardInterrupt:
        err.print("\ninterrupted; stopping everything")
    finally:
        if demo_ is not None:
            if keep and ok:
                demo_.fleet.detach()
                _print_keep(out, path)
            else:
                demo_.stop()
    if not ok:
        raise typer.Exit(1)


def _print_keep(out: Console, path: Path) -> None:
    from gpufleet.local.cluster import default_run_dir

    args = "--name demo" if path == default_run_dir(DEMO_NAME) else f"--run-dir {path}"
    out.print("\nThe cluster is still running. Explore it:")
    out.print(f'  eval "$(gpufleet local env {args})"')
    out.print("  kubectl get nodes -L gpufleet.io/state")
    out.print("  kubectl get fleetpolicies,noderemediations")
    out.print("  sinfo; squeue")
    out.print(f"  gpufleet status {args}")
    out.print(f"  gpufleet nodes --kubeconfig {path}/kube/kubeconfig")
    out.print(f"Stop it with: gpufleet local down {args}")


demo.__doc__ = (demo.__doc__ or "").format(
    ladder=DEMO_TIMES["ladder.*.timeoutSeconds"],
    verify=DEMO_TIMES["checks.verificationTimeoutSeconds"],
    drain=DEMO_TIMES["drain.timeoutSeconds"],
    clear=DEMO_TIMES["detection.clearAfterSeconds"],
)
