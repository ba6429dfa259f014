"""The deferred option converter answers every value as typer's own converter does
(``gpufleet.cli.coercion``, decision 0215): only when typer's would be built is."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.core
from typer._click.core import Context
from typer._click.exceptions import BadParameter

from gpufleet.cli import coercion
from gpufleet.cli import main as cli_main


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


class Other(enum.StrEnum):
    RED = "red"


def _command() -> Any:
    app = typer.Typer(add_completion=False)

    @app.command()
    def every_kind(
        names: list[str] = typer.Argument(None),
        text: str = typer.Option("a"),
        maybe: str | None = typer.Option(None),
        color: Color = typer.Option(Color.RED, case_sensitive=False),
        exact: Color = typer.Option(Color.BLUE),
        count: int = typer.Option(1, min=0, max=5),
        ratio: float = typer.Option(0.5),
        flag: bool = typer.Option(False),
        path: Path | None = typer.Option(None),
        tags: list[str] = typer.Option([], "--tag"),
        parsed: str = typer.Option("x", parser=str.upper),
    ) -> None:
        """Never run: its parameters are the options under test."""

    return typer.main.get_command(app)


VALUES: list[Any] = [
    None,
    "",
    "red",
    "BLUE",
    "3",
    "7",
    "-1",
    "0.25",
    "true",
    "0",
    "x",
    "/tmp/p",
    Color.RED,
    Color.BLUE,
    Other.RED,
    3,
    True,
    ("a", "b"),
    ["c"],
    (),
]


def _answer(runtime: Any, value: Any, param: Any, ctx: Context) -> tuple[str, Any]:
    try:
        got = runtime.coerce(value, param=param, ctx=ctx)
    except BadParameter as exc:
        return "BadParameter", exc.format_message()
    except Exception as exc:  # a parser refusing the value: the same error either way
        return type(exc).__name__, str(exc)
    return type(got).__name__, got


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_each_value_gets_typers_own_answer(value: Any) -> None:
    assert coercion._BUILD is not None, "typer no longer builds its converters here"
    command = _command()
    ctx = Context(command)
    for param in command.params:
        ours = _answer(coercion.Deferred(param.type_descriptor), value, param, ctx)
        typers = _answer(coercion._BUILD(param.type_descriptor), value, param, ctx)
        assert ours == typers, f"--{param.name} given {value!r}"


def test_the_gpufleet_command_defers_and_help_builds_no_converter() -> None:
    """Importing the command installs it (`gpufleet --help` and each command's own help
    then import no pydantic: tests/unit/cli/test_help.py runs them)."""
    assert cli_main.coercion is coercion
    assert typer.core.build_runtime_param is coercion.Deferred
    deferred = coercion.Deferred(_command().params[1].type_descriptor)
    assert deferred.coerce("x", param=_command().params[1], ctx=Context(_command())) == "x"
    assert deferred.built is None
