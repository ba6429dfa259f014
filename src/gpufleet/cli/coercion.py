"""Typer's option coercion, built only for a value that needs it.

typer 0.29 converts each option's value with a pydantic ``TypeAdapter`` that it builds
the first time the option is processed, even when there is no value to convert (an
option not given, without a default: ``None``). Every command passes through the root
group's ``--help``, ``--install-completion`` and ``--show-completion``, none given, so
``gpufleet <command> --help`` imported pydantic (a twentieth of a second, a quarter of
what is left of its start-up) only to turn ``None`` into ``None``; and ``gpufleet
version`` did, to find that its default ``-o table`` is ``Format.TABLE``.

:func:`defer` makes typer build the converter on the first value that needs it. Three
values are answered as typer's own converter answers them, without it: ``None`` (``()``
for an option taking several values, else ``None``), a choice of an enum option (a
default, or a word such as ``-o json``: typer's own choice check, which its converter
runs inside pydantic; a word that is no choice goes to typer's converter, which words
the refusal), and a ``str`` for a ``str`` option (typer's converter returns it as it
is). So no command sees a difference (decision 0215; ``tests/unit/cli/test_coercion.py``
compares both on each kind of value).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

import typer.core

try:  # typer's private parts, as of 0.29: another typer defers nothing (see _BUILD)
    from typer._param_types import coerce_cli_choice
except ImportError:  # pragma: no cover - depends on the installed typer
    coerce_cli_choice = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from typer._click.core import Context
    from typer._coercion import RuntimeParam, TypeDescriptor
    from typer.core import _TyperParameter

_BUILD = getattr(typer.core, "build_runtime_param", None) if coerce_cli_choice is not None else None
"""typer's own: the converter of one option (``RuntimeParam``), pydantic inside; ``None``
in a typer that no longer has it (then nothing is deferred, and a unit test says so)."""


class Deferred:
    """What typer keeps as an option's converter until a value needs the real one."""

    def __init__(self, descriptor: TypeDescriptor) -> None:
        self.descriptor = descriptor
        self.built: RuntimeParam | None = None

    def coerce(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        several = param.multiple or param.nargs == -1
        if value is None:  # as typer's RuntimeParam.coerce answers it, without pydantic
            return () if several else None
        if not several and self.descriptor.parameter_info.parser is None:
            kind = self.descriptor.annotation
            if isinstance(kind, type) and issubclass(kind, Enum):
                if isinstance(value, kind):
                    return value  # typer's choice check returns its own member as it is
                if type(value) is str:
                    try:  # the check typer's converter runs; pydantic only wraps it
                        return coerce_cli_choice(
                            value,
                            choices=tuple(kind),
                            case_sensitive=self.descriptor.parameter_info.case_sensitive,
                            ctx=ctx,
                        )
                    except ValueError:
                        pass  # typer's converter words the refusal
            if kind is str and type(value) is str:
                return value  # typer's str converter: str(value), then pydantic's lax str
        if self.built is None:
            assert _BUILD is not None  # defer() installs this class only beside it
            self.built = _BUILD(self.descriptor)
        return self.built.coerce(value, param=param, ctx=ctx)


def defer() -> None:
    """Make every typer option in this process build its converter on first use."""
    if _BUILD is not None:
        typer.core.build_runtime_param = Deferred  # type: ignore[attr-defined,assignment]
