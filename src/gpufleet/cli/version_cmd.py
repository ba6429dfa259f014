"""``gpufleet version`` and ``gpufleet --version``: the installed package's version."""

from __future__ import annotations

import platform

import typer

from gpufleet.cli.output import Format, OutputOpt, emit


def package_version() -> str:
    """gpufleet's version: ``gpufleet.__version__``, the one source the distribution's
    version is read from too (read here without importlib.metadata, which costs a
    twentieth of a second of start-up, docs/cli.md)."""
    import gpufleet

    return gpufleet.__version__


def print_version(value: bool) -> None:
    """``--version``: print and stop (an eager option, so nothing else runs)."""
    if value:
        typer.echo(f"gpufleet {package_version()}")
        raise typer.Exit()


def version(output: OutputOpt = Format.TABLE) -> None:
    """Print gpufleet's version (and Python's, with -o wide, json or yaml).

    Example:

        gpufleet version -o json
    """
    data = {"gpufleet": package_version(), "python": platform.python_version()}
    emit(
        output,
        data,
        lambda wide: (
            f"gpufleet {data['gpufleet']}" + (f" (Python {data['python']})" if wide else "")
        ),
    )
