"""Entry point of the ``gpufleet`` command.

Each command group lives in its own module and is named here with one line of
:data:`COMMANDS`, so that groups stay independent of each other. A module is
imported only when its command runs (or when ``--help`` lists them all): a pod
that runs ``gpufleet controller`` does not import the demo, the local cluster or
the health checks, which costs seconds of start-up on a slow or emulated core
(docs/cli.md, "Start-up time").
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import typer
from typer._click.core import Command, Context
from typer._click.formatting import HelpFormatter
from typer._click.shell_completion import CompletionItem
from typer.core import TyperCommand

from gpufleet.cli import coercion, options
from gpufleet.cli.errors import Group

coercion.defer()  # no pydantic for options not given (start-up, decision 0215)


@dataclass(frozen=True)
class Entry:
    """One command of ``gpufleet``: ``module:attribute``, a Typer app (a group of
    commands) or a function (one command), and the line ``gpufleet --help`` shows for
    it without importing the module (a test checks it is the command's own first line)."""

    module: str
    attribute: str
    summary: str

    def load(self, name: str) -> Command:
        target = getattr(importlib.import_module(f"gpufleet.cli.{self.module}"), self.attribute)
        if isinstance(target, typer.Typer):
            command: Command = typer.main.get_group(target)
        else:
            # Completion is offered once, by the root group (--install-completion).
            single = typer.Typer(add_completion=False)
            single.command(name)(target)
            command = typer.main.get_command(single)
        command.name = name
        options.with_context(command)
        return command

    def stub(self, name: str) -> Command:
        """A stand-in that only names the command and says what it does (help, completion)."""
        return TyperCommand(name, help=self.summary, short_help=self.summary)


COMMANDS: dict[str, Entry] = {
    "policy": Entry("policy_cmd", "app", "Explain, validate and show remediation policies."),
    "slurm": Entry(
        "slurm_cmd",
        "app",
        "Slurm on Kubernetes: render configs, print the CRD, run the operator.",
    ),
    "syncer": Entry(
        "slurm_cmd",
        "syncer_app",
        "The Kubernetes <-> Slurm syncer (drains, resumes, requeues, lends nodes).",
    ),
    "pod-scheduler": Entry(
        "pod_scheduler_cmd",
        "pod_scheduler",
        "Let Slurm schedule the pods whose spec.schedulerName is gpufleet-slurm.",
    ),
    "sim": Entry(
        "sim_cmd", "sim", "Simulate a fleet running one large training job under a policy."
    ),
    "goodput": Entry(
        "goodput_cmd",
        "goodput",
        "The goodput ledger: every GPU-second a training lost, per incident and category.",
    ),
    "health": Entry("health_cmd", "app", "Run node health checks and inject simulated faults."),
    "agent": Entry(
        "agent_cmd",
        "app",
        "Watch GPUs, InfiniBand and the kernel; report Node conditions, Events and metrics.",
    ),
    "local": Entry(
        "local_cmd",
        "app",
        "Run a whole GPU cluster on this machine: Kubernetes + KWOK GPU nodes, Slurm, BMCs.",
    ),
    "demo": Entry(
        "demo_cmd",
        "demo",
        "Start a local GPU cluster, run a training job through Slurm, inject a fault and show "
        "gpufleet detect, isolate and repair it, with a live timeline and a summary.",
    ),
    "status": Entry(
        "status_cmd",
        "status",
        "Nodes by state, nodes out and why, active remediations, Slurm and the circuit "
        "breaker (-o wide: nothing cut).",
    ),
    "controller": Entry(
        "controller_cmd",
        "controller",
        "Run the lifecycle controller: faults -> cordon, drain, remediation ladder, verification.",
    ),
    "nodes": Entry(
        "nodes_cmd",
        "nodes_table",
        "A table of nodes: state (``production (spare)`` for a hot spare), since when, why, "
        "the current remediation step and the lemon score (decayed to now, with the worst GPU's; "
        "-o wide adds the incident, the cordon, the pool and the time of the change).",
    ),
    "node": Entry(
        "nodes_cmd",
        "node_app",
        "One node: show it (gpufleet node NAME), or ask the lifecycle controller to return, "
        "triage, rma, maintain it or dismiss its held fault.",
    ),
    "topology": Entry(
        "topology_cmd",
        "topology",
        "Show the fabric topology: spine, leaf switch, block and NVLink domain per node.",
    ),
    "burn-in": Entry(
        "burnin_cmd",
        "app",
        "Burn in an NVLink domain as a unit: an all-reduce across its trays, as a Slurm job.",
    ),
    "breaker": Entry(
        "breaker_cmd",
        "app",
        "The circuit breaker of the lifecycle controller (FleetPolicy status.breaker): it opens "
        "when too many nodes fault at once and stops automatic disruption.",
    ),
    "maintenance": Entry(
        "maintenance_cmd",
        "app",
        "Rolling maintenance (MaintenancePlan): reimage, reboot, run a node command or "
        "drain-verify-return nodes in batches bounded by the disruption budget and failure "
        "domains.",
    ),
    "tenant-controller": Entry(
        "tenant_cmd",
        "tenant_controller",
        "Run the tenant controller: each Tenant's quota, bindings, policies and Slurm account.",
    ),
    "tenant": Entry(
        "tenant_cmd",
        "app",
        "Tenants (Tenant objects): check a Tenant YAML offline before applying it.",
    ),
    "provision": Entry(
        "provision_cmd",
        "app",
        "Day 0: network boot, cloud-init and join tokens for known machines.",
    ),
    "machines": Entry(
        "provision_cmd", "machines_app", "The machine inventory (Machine objects); alone: a table."
    ),
    "cleanup": Entry(
        "cleanup_cmd",
        "cleanup",
        "Before removing gpufleet: stop its controllers and agents, then take its labels, "
        "annotations, taints, conditions and cordons off every Node it may release.",
    ),
    "version": Entry(
        "version_cmd",
        "version",
        "Print gpufleet's version (and Python's, with -o wide, json or yaml).",
    ),
}
"""Every top-level command, in the order ``gpufleet --help`` lists them."""

LISTING = "gpufleet.listing"
"""``ctx.meta`` key: set while the root group only lists its commands (help, completion)."""


class LazyGroup(Group):
    """The root group, loading a command's module the first time it runs.

    Listing the commands (``gpufleet --help``, completing ``gpufleet <TAB>``) shows each
    one's :attr:`Entry.summary` and imports nothing: loading every module took seconds.
    """

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            if ctx.meta.get(LISTING):
                return COMMANDS[cmd_name].stub(cmd_name)
            self.add_command(COMMANDS[cmd_name].load(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        with _listing(ctx):
            super().format_help(ctx, formatter)

    def shell_complete(self, ctx: Context, incomplete: str) -> list[CompletionItem]:
        with _listing(ctx):
            return super().shell_complete(ctx, incomplete)

    def all_commands(self, ctx: Context) -> dict[str, Command]:
        """Every command, loaded (for the tests and docs that walk the tree)."""
        for name in self.list_commands(ctx):
            self.get_command(ctx, name)
        return dict(self.commands)


@contextmanager
def _listing(ctx: Context) -> Iterator[None]:
    ctx.meta[LISTING] = True
    try:
        yield
    finally:
        ctx.meta.pop(LISTING, None)


app = typer.Typer(
    name="gpufleet",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=LazyGroup,
)


def _print_version(value: bool) -> None:
    if value:  # the module (and Rich) only when asked: every command passes through here
        from gpufleet.cli import version_cmd

        version_cmd.print_version(value)


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version and exit.",
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        help="On an error, print the traceback too (also GPUFLEET_DEBUG=1; accepted anywhere "
        "on the command line).",
    ),
) -> None:
    """Run GPU training clusters on Kubernetes: health checks, remediation, Slurm sync, simulation.

    Listing commands take -o table|wide|json|yaml. Errors: one line and a hint.

    Exit codes: 1 the answer is no, 2 wrong input or refused, 3 no answer (docs/cli.md).

    Example:

        gpufleet nodes --out -o wide
    """


def main(prog_name: str | None = None) -> None:
    """Console-script entry point."""
    # kr8s 0.20 lists Kubernetes 1.28-1.35 and warns on newer servers; the calls we
    # make (core/v1, CRDs, watch, eviction) are stable across them.
    warnings.filterwarnings(
        "ignore", message="Kubernetes version .* is not supported", category=UserWarning
    )
    app(prog_name=prog_name)


def kubectl_plugin() -> None:
    """``kubectl-gpufleet``: the same command, run by kubectl as ``kubectl gpufleet ...``
    (kubectl finds ``kubectl-<name>`` on PATH and passes it the rest of the line). Help
    and errors say ``kubectl gpufleet``, as the user typed it."""
    main(prog_name=PLUGIN_NAME)


PLUGIN_NAME = "kubectl gpufleet"


def command_tree() -> Any:
    """The root click group with every command loaded (tests and docs walk it)."""
    root_group = typer.main.get_command(app)
    assert isinstance(root_group, LazyGroup)
    root_group.all_commands(Context(root_group))
    return root_group


if __name__ == "__main__":
    main()
