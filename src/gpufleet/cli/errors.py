"""How every ``gpufleet`` command fails: one line that says what went wrong, a hint
that says what to do, and an exit code a script can act on.

Commands raise :class:`CliError` (or call :func:`fail`) for what they know is
the user's to fix; :class:`Group` turns that, the Kubernetes adapter's errors
and unreadable files into the same two lines on stderr. Anything else is a bug:
it gets one line too, and the traceback only with ``gpufleet --debug`` (or
``GPUFLEET_DEBUG=1``), where a person who reports it can copy it.

Exit codes (docs/cli.md): 0 done; 1 the command ran and the answer is no (a
refused request, a failed check, an unknown XID) or an unexpected error; 2 the
input was wrong (options, files, the kubeconfig) or the apiserver refused the
request (missing object, RBAC); 3 no answer (the apiserver or a service is not
reachable, a controller did not answer in time). Click's own usage errors exit
2 as well. ``gpufleet health check`` keeps the Nagios plugin codes.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, NoReturn

import typer

# typer carries its own copy of click (typer._click): its Context and exceptions
# are the ones raised here, not the click package's.
from typer._click.core import Context
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperGroup

EXIT_NO = 1
"""The command ran and the answer is no (or an unexpected error)."""
EXIT_INPUT = 2
"""Wrong input, or the apiserver refused the request."""
EXIT_NO_ANSWER = 3
"""Nothing answered: the apiserver or a service is not reachable, or did not answer in time."""

DEBUG_FLAG = "--debug"
DEBUG_ENV = "GPUFLEET_DEBUG"


class CliError(Exception):
    """A failure the user can do something about: ``message`` says what happened,
    ``hint`` what to do, ``code`` is the exit status (:data:`EXIT_INPUT` by default)."""

    def __init__(self, message: str, *, hint: str | None = None, code: int = EXIT_INPUT) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code


def fail(message: str, *, hint: str | None = None, code: int = EXIT_INPUT) -> NoReturn:
    """Stop the command with a one-line error (and a hint) on stderr."""
    raise CliError(message, hint=hint, code=code)


def warn(message: str, *, hint: str | None = None) -> None:
    """A one-line warning on stderr (the command goes on)."""
    _print("warning", "yellow", message, hint)


def _print(label: str, color: str, message: str, hint: str | None) -> None:
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    err.print(f"[{color}]{label}:[/] {escape(message)}")
    if hint:
        err.print(f"hint: {escape(hint)}")


KUBECONFIG_HINT = (
    'give --kubeconfig PATH or set KUBECONFIG (a local cluster\'s: eval "$(gpufleet local env)")'
)


def explain(exc: BaseException) -> CliError | None:
    """The user-facing error for an exception, or None if it is not one we know.

    The Kubernetes adapter, pydantic and yaml are imported here, on the way out, not
    at start: a command that never talks to a cluster starts without them.
    """
    if isinstance(exc, CliError):
        return exc
    import pydantic
    import yaml

    from gpufleet.kubeapi import (
        ApiError,
        Forbidden,
        KubeconfigError,
        NotFound,
        Unauthorized,
        Unreachable,
    )

    if isinstance(exc, KubeconfigError):
        return CliError(f"no usable kubeconfig: {exc}", hint=KUBECONFIG_HINT)
    if isinstance(exc, Unreachable):
        return CliError(
            f"cannot reach the Kubernetes apiserver: {exc}",
            hint="is the cluster running? (a local one: gpufleet local status); "
            "are --kubeconfig and --context the right ones?",
            code=EXIT_NO_ANSWER,
        )
    if isinstance(exc, Unauthorized):
        return CliError(
            f"the apiserver did not accept the credentials: {exc}",
            hint="the kubeconfig's token or certificate may have expired",
        )
    if isinstance(exc, Forbidden):
        return CliError(f"not allowed: {exc}", hint="ask for the RBAC role in docs/security.md")
    if isinstance(exc, NotFound):
        return CliError(
            f"not found: {exc}",
            hint="a gpufleet resource needs its CRD: kubectl apply -f deploy/crds",
        )
    if isinstance(exc, ApiError):
        return CliError(str(exc))
    if isinstance(exc, yaml.YAMLError):
        return CliError(f"not valid YAML: {_first_line(exc)}")
    if isinstance(exc, pydantic.ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]
        )
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        return CliError(f"invalid {exc.title}: {problems}{more}")
    if isinstance(exc, OSError) and exc.filename is not None:
        return CliError(f"cannot read {exc.filename}: {exc.strerror or exc}")
    return None


def debugging(ctx: Context) -> bool:
    """Whether ``--debug`` was given (or ``GPUFLEET_DEBUG`` is set)."""
    flagged = bool(ctx.find_root().meta.get(DEBUG_FLAG))
    return flagged or os.environ.get(DEBUG_ENV, "") not in ("", "0")


class Group(TyperGroup):
    """The root ``gpufleet`` group: every command's failures end here.

    ``--debug`` is taken from anywhere on the command line (``gpufleet nodes
    --debug`` as well as ``gpufleet --debug nodes``), since that is where a person
    adds it after seeing an error. Usage errors (a bad option value, a missing
    option) get the same one line and a hint instead of typer's boxed panel.
    """

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        head, sep, tail = _split_at_dashdash(args)
        if DEBUG_FLAG in head:
            ctx.meta[DEBUG_FLAG] = True
            head = [a for a in head if a != DEBUG_FLAG]
        try:
            return super().parse_args(ctx, head + sep + tail)
        except ClickException as exc:
            raise _usage(exc) from None

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except ClickException as exc:
            raise _usage(exc) from None
        except KeyboardInterrupt:
            if debugging(ctx):
                raise
            _print("interrupted", "yellow", "stopped by Ctrl-C", None)
            raise typer.Exit(130) from None
        except Exception as exc:
            if debugging(ctx):
                traceback.print_exc(file=sys.stderr)
            known = explain(exc)
            if known is None:
                known = CliError(
                    f"unexpected {type(exc).__name__}: {_first_line(exc)}"[:500],
                    hint=None if debugging(ctx) else "run it again with --debug for the traceback",
                    code=EXIT_NO,
                )
            _print("error", "red", known.message, known.hint)
            raise typer.Exit(known.code) from None


def _usage(exc: ClickException) -> BaseException:
    """A usage error as one line and a hint (``--help`` of the command it was for)."""
    if isinstance(exc, NoArgsIsHelpError):
        return exc  # prints the help, as asked
    ctx = getattr(exc, "ctx", None)
    where = f"{ctx.command_path} --help" if ctx is not None else "gpufleet --help"
    _print("error", "red", exc.format_message(), f"see {where}")
    return typer.Exit(exc.exit_code)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _split_at_dashdash(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    if "--" in args:
        i = args.index("--")
        return args[:i], ["--"], args[i + 1 :]
    return list(args), [], []
