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
from dataclasses import dataclass
from typing import Any

import typer
from typer._click.core import Command, Context

from gpufleet.cli import version_cmd
from gpufleet.cli.errors import Group


@dataclass(frozen=True)
class Entry:
    """One command of ``gpufleet``: ``module:attribute``, a Typer app (a group of
    commands) or a function (one command)."""

    module: str
    attribute: str

    def load(self, name: str) -> Command:
        target = getattr(importlib.import_module(f"gpufleet.cli.{self.module}"), self.attribute)
        if isinstance(target, typer.Typer):
            command: Command = typer.main.get_group(target)
        else:
            single = typer.Typer()
            single.command(name)(target)
            command = typer.main.get_command(single)
        command.name = name
        return command


COMMANDS: dict[str, Entry] = {
    "policy": Entry("policy_cmd", "app"),
    "slurm": Entry("slurm_cmd", "app"),
    "syncer": Entry("slurm_cmd", "syncer_app"),
    "sim": Entry("sim_cmd", "sim"),
    "health": Entry("health_cmd", "app"),
    "agent": Entry("agent_cmd", "app"),
    "local": Entry("local_cmd", "app"),
    "demo": Entry("demo_cmd", "demo"),
    "status": Entry("status_cmd", "status"),
    "controller": Entry("controller_cmd", "controller"),
    "nodes": Entry("nodes_cmd", "nodes_table"),
    "node": Entry("nodes_cmd", "node_app"),
    "breaker": Entry("breaker_cmd", "app"),
    "maintenance": Entry("maintenance_cmd", "app"),
    "provision": Entry("provision_cmd", "app"),
    "machines": Entry("provision_cmd", "machines_app"),
    "cleanup": Entry("cleanup_cmd", "cleanup"),
    "version": Entry("version_cmd", "version"),
}
"""Every top-level command, in the order ``gpufleet --help`` lists them."""


class LazyGroup(Group):
    """The root group, loading a command's module the first time it is asked for."""

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(COMMANDS[cmd_name].load(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def all_commands(self, ctx: Context) -> dict[str, Command]:
        """Every command, loaded (for ``--help`` and the tests that walk the tree)."""
        for name in self.list_commands(ctx):
            self.get_command(ctx, name)
        return dict(self.commands)


app = typer.Typer(
    name="gpufleet",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyGroup,
)


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=version_cmd.print_version,
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


def main() -> None:
    """Console-script entry point."""
    # kr8s 0.20 lists Kubernetes 1.28-1.35 and warns on newer servers; the calls we
    # make (core/v1, CRDs, watch, eviction) are stable across them.
    warnings.filterwarnings(
        "ignore", message="Kubernetes version .* is not supported", category=UserWarning
    )
    app()


def command_tree() -> Any:
    """The root click group with every command loaded (tests and docs walk it)."""
    root_group = typer.main.get_command(app)
    assert isinstance(root_group, LazyGroup)
    root_group.all_commands(Context(root_group))
    return root_group


if __name__ == "__main__":
    main()
