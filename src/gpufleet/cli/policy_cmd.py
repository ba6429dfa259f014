"""``gpufleet policy``: explain, validate and show remediation policies."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from gpufleet.cli.errors import EXIT_NO, warn
from gpufleet.cli.options import PolicyFileOpt
from gpufleet.cli.output import (
    Column,
    Format,
    JsonOpt,
    OutputOpt,
    chosen,
    emit,
    print_data,
    structured,
    table,
)
from gpufleet.domain import xids
from gpufleet.domain.faults import FaultKind

if TYPE_CHECKING:  # the policy models: built when a command reads a policy, not for --help
    from gpufleet.domain.explain import Explanation
    from gpufleet.domain.policy import Policy

app = typer.Typer(
    help="Explain, validate and show remediation policies.",
    no_args_is_help=True,
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

_FAULT_NAMES = ", ".join(k.value for k in FaultKind if k is not FaultKind.XID)


def read_policy(path: Path) -> Policy:
    """A policy file, read and parsed within :data:`yamldoc.LIMITS`.

    At most ``max_bytes + 1`` bytes are read, so a huge file (or a device) is
    refused at once; bytes that are not UTF-8 are a :class:`PolicyError` like
    any other problem. Raises OSError if the file cannot be read.
    """
    from gpufleet.domain import yamldoc
    from gpufleet.domain.policy import PolicyError, load_policy

    with path.open("rb") as f:
        data = f.read(yamldoc.LIMITS.max_bytes + 1)
    try:
        text = yamldoc.decode(data)
    except yamldoc.DocumentError as exc:
        raise PolicyError(str(path), exc.issues) from None
    return load_policy(text, str(path))


def load_or_exit(path: Path | None) -> Policy:
    """The policy file (or the default), or a one-line error and exit 2: for every command
    that takes ``--policy``."""
    from gpufleet.domain.policy import PolicyError, default_policy

    if path is None:
        return default_policy()
    try:
        policy = read_policy(path)
    except OSError as exc:
        err.print(f"[red]cannot read policy file {escape(str(path))}: {exc.strerror}[/red]")
        raise typer.Exit(2) from exc
    except PolicyError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        err.print(f"Check it with: gpufleet policy validate {escape(str(path))}")
        raise typer.Exit(2) from exc
    for deprecation in policy.deprecations:  # an earlier version's field: said, then used
        warn(f"{path}: {deprecation.message()}")
    return policy


@app.command("explain")
def explain_cmd(
    xid: int | None = typer.Option(
        None, "--xid", min=1, max=xids.MAX_XID, help="An NVIDIA XID number, e.g. 79."
    ),
    fault: str | None = typer.Option(
        None, "--fault", help=f"A non-XID fault: {_FAULT_NAMES}.", metavar="NAME"
    ),
    slurm_reason: str | None = typer.Option(
        None,
        "--slurm-reason",
        help="A Slurm drain reason set by someone else, e.g. 'NHC: check_hw_ib failed'.",
        metavar="TEXT",
    ),
    policy: PolicyFileOpt = None,
    as_json: JsonOpt = False,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Show how a fault is classified and the remediation that follows.

    An XID that is not in gpufleet's catalogue is explained too (the policy's rule for
    unknown XIDs), with a warning on stderr and exit code 1. -o json and -o yaml print
    the explanation as data (--json is -o json).

    Examples:

        gpufleet policy explain --xid 79

        gpufleet policy explain --xid 13 --policy my-policy.yaml

        gpufleet policy explain --fault ib-link-flap -o json

        gpufleet policy explain --slurm-reason "NHC: check_hw_ib: mlx5_0 port 1 down"
    """
    from gpufleet.domain.explain import explain

    fmt = chosen(output, as_json)
    if sum(x is not None for x in (xid, fault, slurm_reason)) != 1:
        err.print("[red]give exactly one of --xid N, --fault NAME or --slurm-reason TEXT[/red]")
        raise typer.Exit(2)
    if slurm_reason is not None:
        _explain_slurm_reason(load_or_exit(policy), slurm_reason, fmt)
        return
    kind: FaultKind | None = None
    if fault is not None:
        try:
            kind = FaultKind(fault)
        except ValueError:
            err.print(f"[red]unknown fault {fault!r}; known faults: {_FAULT_NAMES}[/red]")
            raise typer.Exit(2) from None
        if kind is FaultKind.XID:
            err.print("[red]use --xid N for XIDs[/red]")
            raise typer.Exit(2)
    result = explain(load_or_exit(policy), xid=xid, fault=kind)
    if structured(fmt):
        print_data(fmt, dataclasses.asdict(result))
    else:
        _render(result)
    if xid is not None and xid not in xids.XIDS:
        warn(
            f"XID {xid} is not in gpufleet's catalogue; shown is what the policy does with an "
            "XID it does not know",
            hint="NVIDIA's list of XIDs: https://docs.nvidia.com/deploy/xid-errors/",
        )
        raise typer.Exit(EXIT_NO)


def _explain_slurm_reason(policy: Policy, reason: str, fmt: Format) -> None:
    from gpufleet.domain.explain import explain_slurm_reason

    found = explain_slurm_reason(policy, reason)
    if structured(fmt):
        print_data(fmt, dataclasses.asdict(found))
        return
    out.print(f"[bold]Slurm drain reason {escape(repr(found.reason))}[/bold]")
    out.print(f"  verdict:    [bold]{found.verdict}[/bold] ({escape(found.source)})")
    if found.note:
        out.print(f"  pattern:    {escape(found.note)}")
    out.print(f"  gpufleet:   {escape(found.outcome)}")
    if found.fault is not None:
        _render(found.fault)


def _render(e: Explanation) -> None:
    out.print(f"[bold]{e.title}[/bold]")
    out.print(f"  meaning:    {e.meaning}")
    if e.nvidia_action:
        out.print(f"  NVIDIA:     {e.nvidia_action} (class: {e.xid_class})")
    out.print(f"  reported:   Node condition {e.condition} (subsystem {e.subsystem})")
    out.print(f"  rule:       {e.source}")
    out.print(f"  one occurrence: [bold]{e.first}[/bold] - {e.first_text}")
    if e.repeat:
        out.print(f"  repeats:    {e.repeat}")
    if not e.takes_node_out and not e.repeat_takes_node_out:
        out.print("  This fault never takes the node out of production under this policy.")
    if e.isolation:
        when = "When the node is taken out" if e.takes_node_out else "When repeats take it out"
        out.print(f"[bold]{when}[/bold]")
        for line in e.isolation:
            out.print(f"  - {line}")
        out.print("[bold]Remediation ladder[/bold]")
        for i, line in enumerate(e.ladder, 1):
            out.print(f"  {i}. {line}")
        out.print(f"  lemon: {e.lemon}")
        out.print("[bold]Safety rails[/bold]")
        for line in e.safety:
            out.print(f"  - {line}")
    if e.note:
        out.print(f"  note: {e.note}")


@app.command("validate")
def validate_cmd(
    files: list[Path] = typer.Argument(..., help="Policy files (YAML; a FleetPolicy or its spec)."),
    output: OutputOpt = Format.TABLE,
) -> None:
    """Check policy files and report every problem with its line and field.

    Exits 1 if any file is invalid. Files are bounded (1 MiB, 32 levels of
    nesting, 100,000 values); a file over a bound, not UTF-8 or not YAML is
    reported in one line. -o json and -o yaml print each file's problems and
    warnings as data.

    Example:

        gpufleet policy show > my-policy.yaml
        gpufleet policy validate my-policy.yaml
    """
    checked = [_check(path) for path in files]
    if structured(output):
        print_data(output, {"files": [c for c, _ in checked]})
    else:
        for c, one_line in checked:
            name = escape(c["file"])
            if c["valid"]:
                out.print(f"{c['file']}: valid")
            elif one_line:
                err.print(f"[red]{name}: {escape(c['problems'][0])}[/red]")
            else:
                err.print(f"[red]{name}: {len(c['problems'])} problem(s)[/red]")
                for problem in c["problems"]:
                    err.print(f"  {escape(problem)}")
            for warning in c["warnings"]:
                err.print(f"[yellow]{name}: warning: {escape(warning)}[/yellow]")
    if not all(c["valid"] for c, _ in checked):
        raise typer.Exit(1)


def _check(path: Path) -> tuple[dict[str, Any], bool]:
    """One file's verdict (valid, problems, warnings), and whether it is one line (the
    file could not be read, or is not a YAML mapping at all)."""
    from gpufleet.domain.policy import PolicyError

    result: dict[str, Any] = {"file": str(path), "valid": False, "problems": [], "warnings": []}
    try:
        loaded = read_policy(path)
    except OSError as exc:
        result["problems"] = [f"cannot read: {exc.strerror}"]
        return result, True
    except PolicyError as exc:
        result["problems"] = [str(issue) for issue in exc.issues]
        return result, len(exc.issues) == 1 and exc.issues[0].location == "(file)"
    result.update(valid=True, warnings=list(loaded.warnings()))
    return result, False


@app.command("show")
def show_cmd() -> None:
    """Print the built-in policy as YAML, to start your own from.

    Example:

        gpufleet policy show > my-policy.yaml
    """
    from gpufleet.domain.defaults import DEFAULT_POLICY_YAML

    typer.echo(DEFAULT_POLICY_YAML, nl=False)


TABLE_COLUMNS = (
    Column("FAULT"),
    Column("ONE OCCURRENCE"),
    Column("REPEATS"),
    Column("CONDITION"),
    Column("RULE", wide=True),
    Column("MEANING", wide=True),
)


@app.command("table")
def table_cmd(
    policy: PolicyFileOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """List every fault and XID with what one occurrence and repeats do (-o wide adds
    the rule that decides and what the fault means).

    Example:

        gpufleet policy table --policy my-policy.yaml -o wide
    """
    from gpufleet.domain.explain import explain

    p = load_or_exit(policy)
    rows = [explain(p, xid=x) for x in sorted(xids.XIDS)]
    rows += [explain(p, fault=k) for k in FaultKind if k is not FaultKind.XID]
    data = {
        "faults": [
            {
                "fault": e.key,
                "first": e.first,
                "repeat": e.repeat or None,
                "condition": e.condition,
                "rule": e.source,
                "meaning": e.meaning,
            }
            for e in rows
        ]
    }
    cells = [(e.key, e.first, e.repeat or "", e.condition, e.source, e.meaning) for e in rows]
    emit(output, data, lambda wide: table(TABLE_COLUMNS, cells, wide=wide))
