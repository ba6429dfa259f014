"""``-o table|wide|json|yaml`` for every command that lists or reports, and tables
that fit where they are printed.

A command builds two things from what it read: the data (plain dicts and lists,
the same for json and yaml) and a function that draws it for a person (given
``wide``: more columns, nothing cut). :func:`emit` prints the one the user asked
for. Tables go through :func:`show`: on a terminal Rich uses the terminal's
width; into a pipe or a file a table is as wide as its content, so ``gpufleet
nodes | grep`` sees one line per node instead of rows wrapped at 80 columns.

Adopting it in a command::

    def things(output: OutputOpt = Format.TABLE) -> None:
        rows = [...]                        # read once
        emit(output, {"things": rows}, lambda wide: table(COLUMNS, cells(rows), wide=wide))
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpufleet.cli.errors import fail


class Format(enum.StrEnum):
    """What ``-o`` prints."""

    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


OutputOpt = Annotated[
    Format,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table, wide (more columns, nothing cut), json or yaml.",
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Same as -o json (kept for existing scripts; prefer -o json)."),
]


def chosen(output: Format, as_json: bool = False) -> Format:
    """The format, with the older ``--json`` flag read as ``-o json``."""
    if not as_json:
        return output
    if output not in (Format.TABLE, Format.JSON):
        fail(
            f"--json and -o {output} disagree",
            hint="give one of them (-o json is the same as --json)",
        )
    return Format.JSON


def structured(fmt: Format) -> bool:
    """Whether the format is for a program (json, yaml) rather than a person."""
    return fmt in (Format.JSON, Format.YAML)


Draw = Callable[[bool], RenderableType | Sequence[RenderableType]]


def emit(fmt: Format, data: Any, draw: Draw) -> None:
    """Print ``data`` as json or yaml, or ``draw(wide)`` for a person."""
    if structured(fmt):
        print_data(fmt, data)
    else:
        drawn = draw(fmt is Format.WIDE)
        show(*(drawn if isinstance(drawn, Sequence) and not isinstance(drawn, str) else [drawn]))


def print_data(fmt: Format, data: Any) -> None:
    """``data`` as json, or as yaml for ``-o yaml``."""
    if fmt is Format.YAML:
        typer.echo(dump_yaml(data), nl=False)
    else:
        typer.echo(dump_json(data))


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


def dump_yaml(data: Any) -> str:
    import yaml  # here: a command that prints no yaml starts without it

    # Through JSON first, so that yaml shows exactly what json shows (no Python tags).
    plain = json.loads(json.dumps(data, default=str))
    return yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, allow_unicode=True)


# ------------------------------------------------------------------ tables


@dataclass(frozen=True)
class Column:
    """One table column. ``wide``: only in ``-o wide``. ``cut``: in ``-o table``, text
    longer than this is shortened (``-o wide`` shows it whole)."""

    header: str
    wide: bool = False
    cut: int | None = None
    justify: Literal["left", "right"] = "left"


Cell = str | Text


def table(
    columns: Sequence[Column | str],
    rows: Iterable[Sequence[Cell]],
    *,
    wide: bool,
    title: str | None = None,
) -> Table:
    """A kubectl-like table (no box, upper-case headers as given). Each row has one
    cell per column, wide-only ones included; plain strings are shown as they are
    (no Rich markup), :class:`Text` keeps its style."""
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    shown = [i for i, c in enumerate(cols) if wide or not c.wide]
    out = Table(box=None, title=title, title_justify="left", pad_edge=False)
    for i in shown:
        out.add_column(cols[i].header, justify=cols[i].justify)
    for row in rows:
        cells: list[RenderableType] = []
        for i in shown:
            cell = row[i]
            if isinstance(cell, str):
                limit = cols[i].cut
                if limit is not None and not wide and len(cell) > limit:
                    cell = cell[: max(1, limit - 3)] + "..."
                cell = Text(cell)
            cells.append(cell)
        out.add_row(*cells)
    return out


# ------------------------------------------------------------------ printing


def console() -> Console:
    """stdout for a person: the terminal's width on a terminal; into a pipe or a file,
    lines are never wrapped (long lines stay long)."""
    out = Console(highlight=False)
    if out.is_terminal:
        return out
    return Console(highlight=False, soft_wrap=True)


def show(*renderables: RenderableType) -> None:
    """Print tables and panels: at the terminal's width on a terminal, otherwise as
    wide as the content (nothing wraps at 80 columns in a pipe)."""
    out = Console(highlight=False)
    if out.is_terminal:
        out.print(*renderables)
        return
    out = Console(highlight=False, width=max(20, *(natural_width(r) for r in renderables)))
    with out.capture() as captured:
        out.print(*renderables)
    # Rich pads every line to the table's width; a pipe gets the text without the padding.
    typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


_MEASURE_WIDTH = 100_000


def natural_width(renderable: RenderableType) -> int:
    """The columns ``renderable`` takes when nothing limits it."""
    wide = Console(width=_MEASURE_WIDTH, highlight=False)
    return min(_MEASURE_WIDTH, Measurement.get(wide, wide.options, renderable).maximum)
