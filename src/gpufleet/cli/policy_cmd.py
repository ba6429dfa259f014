"""``gpufleet policy``: explain, validate and show remediation policies."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from gpufleet.cli.errors import EXIT_NO, warn
from gpufleet.cli.options import KubeconfigOpt, PolicyFileOpt
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
    node: str | None = typer.Option(
        None,
        "--node",
        help="A Node of the cluster: which FleetPolicy override applies to it and why "
        "(its labels are read with --kubeconfig/--context; the policy is --policy, else the "
        "cluster's FleetPolicy).",
        metavar="NAME",
    ),
    labels: str | None = typer.Option(
        None,
        "--labels",
        help="A node's labels, offline: k=v,k=v (instead of --node).",
        metavar="K=V,...",
    ),
    fleet_policy: str = typer.Option(
        "default", "--fleet-policy", help="The FleetPolicy --node reads when --policy is not given."
    ),
    kubeconfig: KubeconfigOpt = None,
    policy: PolicyFileOpt = None,
    as_json: JsonOpt = False,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Show how a fault is classified and the remediation that follows.

    An XID that is not in gpufleet's catalogue is explained too (the policy's rule for
    unknown XIDs), with a warning on stderr and exit code 1. -o json and -o yaml print
    the explanation as data (--json is -o json). With --node (or --labels), say which
    override of the policy applies to that node and why, its ladder and budgets, and what
    the fault does there.

    Examples:

        gpufleet policy explain --xid 79

        gpufleet policy explain --xid 13 --policy my-policy.yaml

        gpufleet policy explain --fault ib-link-flap -o json

        gpufleet policy explain --slurm-reason "NHC: check_hw_ib: mlx5_0 port 1 down"

        gpufleet policy explain --node gpu-0042 --xid 79

        gpufleet policy explain --labels gpufleet.io/pool=gb200 --policy my-policy.yaml
    """
    from gpufleet.domain.explain import explain

    fmt = chosen(output, as_json)
    if node is not None or labels is not None:
        _explain_node(node, labels, xid, fault, fleet_policy, kubeconfig, policy, fmt)
        return
    if sum(x is not None for x in (xid, fault, slurm_reason)) != 1:
        err.print("[red]give exactly one of --xid N, --fault NAME or --slurm-reason TEXT[/red]")
        raise typer.Exit(2)
    if slurm_reason is not None:
        _explain_slurm_reason(load_or_exit(policy), slurm_reason, fmt)
        return
    kind = _fault_kind(fault) if fault is not None else None
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


def _fault_kind(fault: str) -> FaultKind:
    try:
        kind = FaultKind(fault)
    except ValueError:
        err.print(f"[red]unknown fault {fault!r}; known faults: {_FAULT_NAMES}[/red]")
        raise typer.Exit(2) from None
    if kind is FaultKind.XID:
        err.print("[red]use --xid N for XIDs[/red]")
        raise typer.Exit(2)
    return kind


def _parse_labels(text: str) -> dict[str, str]:
    """``k=v,k=v`` -> labels; a malformed pair is a one-line error and exit 2."""
    from gpufleet.domain.selectors import key_problem, value_problem

    found: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = pair.partition("=")
        problem = "not k=v" if not eq else key_problem(key) or value_problem(value)
        if problem:
            err.print(f"[red]--labels: {escape(pair)}: {escape(problem)}[/red]")
            raise typer.Exit(2)
        found[key] = value
    return found


def _cluster_node(
    name: str, fleet_policy: str, kubeconfig: Path | None, read_policy: bool
) -> tuple[dict[str, str], dict[str, Any] | None, list[str]]:
    """The Node's labels, (when ``read_policy``) the FleetPolicy's spec, None if absent, and
    the GPUs its record says are quarantined (``GPU 3 (xid-94) since ...``)."""
    import asyncio

    from gpufleet.api.nodedata import trusted_record
    from gpufleet.cli.options import kubeconfig_arg
    from gpufleet.domain.enrollment import rfc3339
    from gpufleet.kubeapi import NODES, ApiError, KubeApi, NotFound, custom

    async def read() -> tuple[dict[str, str], dict[str, Any] | None, list[str]]:
        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))
        body = await client.get(NODES, name)
        spec = None
        if read_policy:
            try:
                spec = (await client.get(custom("fleetpolicies"), fleet_policy)).get("spec")
            except NotFound:
                spec = None
        record = trusted_record(body)
        gpus = [
            f"GPU {q.index} ({q.fault}) since {rfc3339(q.since)}"
            for q in (record.quarantined_gpus if record is not None else ())
        ]
        return dict((body.get("metadata") or {}).get("labels") or {}), spec, gpus

    try:
        return asyncio.run(read())
    except NotFound:
        err.print(f"[red]no Node {escape(name)} in the cluster[/red]")
        raise typer.Exit(2) from None
    except ApiError as exc:
        err.print(f"[red]cannot read Node {escape(name)}: {escape(str(exc))}[/red]")
        raise typer.Exit(2) from None


def _explain_node(
    node: str | None,
    labels: str | None,
    xid: int | None,
    fault: str | None,
    fleet_policy: str,
    kubeconfig: Path | None,
    policy_file: Path | None,
    fmt: Format,
) -> None:
    import yaml

    from gpufleet.domain.explain import explain_node
    from gpufleet.domain.policy import PolicyError, load_policy

    if (node is None) == (labels is None) or (xid is not None and fault is not None):
        err.print(
            "[red]give one of --node NAME or --labels K=V,..., and at most one of --xid "
            "or --fault[/red]"
        )
        raise typer.Exit(2)
    kind = _fault_kind(fault) if fault is not None else None
    source = "--policy" if policy_file is not None else "the built-in default policy"
    quarantined: list[str] = []
    if node is not None:
        node_labels, spec, quarantined = _cluster_node(
            node, fleet_policy, kubeconfig, policy_file is None
        )
    else:
        node_labels, spec = _parse_labels(labels or ""), None
    if spec is not None:
        source = f"FleetPolicy {fleet_policy}"
        try:
            chosen_policy = load_policy(yaml.safe_dump(dict(spec)), source)
        except PolicyError as exc:
            err.print(f"[red]{escape(str(exc))}[/red]")
            raise typer.Exit(2) from None
    else:
        chosen_policy = load_or_exit(policy_file)
    found = explain_node(chosen_policy, node_labels, xid=xid, fault=kind, node=node or "")
    data = {
        "node": node,
        "labels": node_labels,
        "policy": source,
        **dataclasses.asdict(found),
        "quarantinedGpus": quarantined,
    }
    if structured(fmt):
        print_data(fmt, data)
        return
    who = f"Node {node}" if node is not None else "a node with these labels"
    group = f"override {found.override}" if found.override else "the fleet-wide policy"
    out.print(f"[bold]{escape(who)}: {escape(group)} ({escape(source)})[/bold]")
    for line in found.why:
        out.print(f"  {escape(line)}")
    if found.rules:
        out.print("[bold]Rules of the override[/bold]")
        for line in found.rules:
            out.print(f"  - {escape(line)}")
    out.print("[bold]Ladder[/bold]")
    for i, line in enumerate(found.ladder, 1):
        out.print(f"  {i}. {escape(line)}")
    out.print("[bold]Budgets (each must allow a node out)[/bold]")
    for line in found.budgets:
        out.print(f"  - {escape(line)}")
    if found.domain_faults:
        out.print("[bold]Fabric faults (judged with the NVLink domain)[/bold]")
        for line in found.domain_faults:
            out.print(f"  - {escape(line)}")
    if quarantined:
        out.print("[bold]GPUs quarantined now (the node serves on the others)[/bold]")
        for line in quarantined:
            out.print(f"  - {escape(line)}")
    if found.fault is not None:
        _render(found.fault)


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
    if e.gpu_quarantine:
        out.print(f"  GPU quarantine: {escape(e.gpu_quarantine)}")
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
