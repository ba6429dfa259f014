"""Operator verbs: ``gpufleet node return|triage|rma|maintenance|dismiss`` and
``gpufleet breaker reset``.

The CLI never decides and never changes a node. It writes a request (an
annotation naming the verb, the reason and the user the apiserver says we are)
and waits for the lifecycle controller's answer: the controller removes the
request and posts an Event that says whether it was carried out and why
(docs/operations.md, docs/decisions/0075).
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from gpufleet.cli import output
from gpufleet.cli.options import EventNamespaceOpt
from gpufleet.domain import well_known
from gpufleet.kubeapi import (
    EVENTS,
    NODES,
    ApiError,
    Conflict,
    KubeconfigError,
    KubePort,
    NotFound,
    Resource,
    Unreachable,
    contexts,
    custom,
)

# The client (kr8s), the CRD models and yaml are imported where a request is sent: the
# verbs' --help needs none of them (docs/cli.md, start-up).

ReasonOpt = Annotated[
    str,
    typer.Option(
        "--reason",
        "-r",
        help="Why (required): recorded in the node's history and the Event, with your name.",
    ),
]
NoWaitOpt = Annotated[
    bool,
    typer.Option("--no-wait", help="Write the request and return; do not wait for the answer."),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for the controller's answer.")
]
EventNsOpt = EventNamespaceOpt

GV = f"{well_known.GROUP}/{well_known.VERSION}"


class NoAnswer(Exception):
    """The controller did not answer in time (the request may still be handled later)."""


# ------------------------------------------------------------------ identity


async def whoami(client: KubePort, kubeconfig: Path | None) -> str:
    """The user the apiserver says we are; else the kubeconfig's user name.

    SelfSubjectReview (``authentication.k8s.io/v1``) needs no permission and
    returns the authenticated name, which is what an audit trail wants; older
    apiservers lack it, so the kubeconfig context's user is the fallback.
    """
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        data = await client.create(Resource("selfsubjectreviews", "authentication.k8s.io/v1"), body)
        name = (data.get("status") or {}).get("userInfo", {}).get("username")
        if name:
            return str(name)
    except ApiError:
        pass
    return kubeconfig_user(kubeconfig) or f"{getpass.getuser()} (local account)"


def kubeconfig_user(kubeconfig: Path | None) -> str | None:
    """The user name of the kubeconfig's context in use (``--context``, else the current
    one), if it can be read."""
    import yaml

    paths = [kubeconfig] if kubeconfig else []
    if not paths:
        env = os.environ.get("KUBECONFIG")
        paths = [Path(p) for p in env.split(os.pathsep) if p] if env else []
        paths = paths or [Path.home() / ".kube" / "config"]
    for path in paths:
        try:
            cfg = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        current = contexts.name_in(cfg)
        for ctx in cfg.get("contexts") or []:
            if ctx.get("name") == current and (ctx.get("context") or {}).get("user"):
                return str(ctx["context"]["user"])
    return None


def _reason(reason: str) -> str:
    from gpufleet.domain.operator import MAX_REASON

    text = reason.strip()
    if not text:
        raise typer.BadParameter("say why: --reason must not be empty", param_hint="--reason")
    if len(text) > MAX_REASON:
        raise typer.BadParameter(
            f"--reason is longer than {MAX_REASON} characters", param_hint="--reason"
        )
    return text


async def _poll(check: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise NoAnswer
        await asyncio.sleep(0.2)


async def _answer_event(
    client: KubePort, namespace: str, kind: str, name: str, reason: str, rid: str, timeout: float
) -> dict[str, Any]:
    """The controller's Event answering request ``rid`` (its message starts with ``[rid]``)."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name},reason={reason}"

    async def find() -> dict[str, Any] | None:
        listing = await client.list(EVENTS, namespace=namespace, field_selector=selector)
        for item in listing.items:
            if str(item.get("message", "")).startswith(f"[{rid}] "):
                return dict(item)
        return None

    found: dict[str, Any] = await _poll(find, timeout)
    return found


def _finish(console: Console, event: dict[str, Any]) -> None:
    message = str(event.get("message", ""))
    ok = event.get("type") == "Normal"
    console.print(("[green]" if ok else "[red]") + escape(message) + "[/]")
    if not ok:
        raise typer.Exit(1)


# ---------------------------------------------------------------- node verbs


async def _send_node_request(
    kubeconfig: Path | None,
    node: str,
    verb: str,
    reason: str,
    *,
    hardware_replaced: bool,
    wait: bool,
    timeout: float,
    event_namespace: str,
    console: Console,
) -> dict[str, Any] | None:
    from gpufleet.domain.operator import OperatorRequest
    from gpufleet.kubeapi import KubeApi

    client = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
    body = await client.get(NODES, node)
    meta = body.get("metadata") or {}
    waiting = (meta.get("annotations") or {}).get(well_known.ANNOTATION_OPERATOR_REQUEST)
    if waiting:
        console.print(
            f"[red]{node} already has a request waiting for the controller: {waiting}[/]\n"
            "Wait for its answer (is the controller running?) or remove it with\n"
            f"  kubectl annotate node {node} {well_known.ANNOTATION_OPERATOR_REQUEST}-"
        )
        raise typer.Exit(2)
    request = OperatorRequest(
        verb=verb,
        reason=reason,
        by=await whoami(client, kubeconfig),
        at=time.time(),
        id=secrets.token_hex(4),
        hardware_replaced=hardware_replaced,
    )
    patch = {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {well_known.ANNOTATION_OPERATOR_REQUEST: request.encode()},
        }
    }
    try:
        await client.patch(NODES, node, patch)
    except Conflict:
        console.print(f"[red]{node} changed while the request was written: run it again[/]")
        raise typer.Exit(2) from None
    console.print(f"request {request.id}: {verb} {node} by {request.by}: {reason}")
    if not wait:
        return None

    async def handled() -> bool:
        ann = (await client.get(NODES, node))["metadata"].get("annotations") or {}
        value = ann.get(well_known.ANNOTATION_OPERATOR_REQUEST)
        return value is None or f'"id":"{request.id}"' not in value

    await _poll(handled, timeout)
    return await _answer_event(
        client, event_namespace, "Node", node, "OperatorRequest", request.id, max(timeout, 5.0)
    )


def node_request(
    verb: str,
    node: str,
    reason: str,
    kubeconfig: Path | None,
    *,
    no_wait: bool,
    timeout: float,
    event_namespace: str,
    hardware_replaced: bool = False,
) -> None:
    """Write the request, wait for the answer, print it; exit 1 if it was refused."""
    console = output.console()
    text = _reason(reason)
    _carry_out(
        console,
        _send_node_request(
            kubeconfig,
            node,
            verb,
            text,
            hardware_replaced=hardware_replaced,
            wait=not no_wait,
            timeout=timeout,
            event_namespace=event_namespace,
            console=console,
        ),
        missing=f"no Node named {node}",
        unanswered=(
            f"no answer from the lifecycle controller within {timeout:g}s; the request "
            f"stays on the Node and is decided when the controller runs "
            f"(kubectl describe node {node}: Events 'OperatorRequest')"
        ),
    )


def _carry_out(
    console: Console,
    send: Coroutine[Any, Any, dict[str, Any] | None],
    *,
    missing: str,
    unanswered: str,
) -> None:
    """Run one operator request and print its answer. Exit codes: 1 refused (by
    ``_finish``), 2 the object is missing or the apiserver refused, 3 no answer in time."""
    import asyncio

    try:
        event = asyncio.run(send)
    except NotFound:
        console.print(f"[red]{missing}[/]")
        raise typer.Exit(2) from None
    except NoAnswer:
        console.print(f"[yellow]{unanswered}[/]")
        raise typer.Exit(3) from None
    except (KubeconfigError, Unreachable):
        raise  # cli.errors: the kubeconfig's hint, exit 2; no answer, exit 3
    except ApiError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    if event is not None:
        _finish(console, event)


# ------------------------------------------------------------------- breaker


async def _send_breaker_reset(
    kubeconfig: Path | None,
    policy: str,
    reason: str,
    *,
    wait: bool,
    timeout: float,
    event_namespace: str,
    console: Console,
) -> dict[str, Any] | None:
    from gpufleet.kubeapi import KubeApi
    from gpufleet.lifecycle import crds

    client = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
    obj = await client.get(custom(crds.FLEET_POLICY_PLURAL), policy)
    breaker = (obj.get("status") or {}).get("breaker") or {}
    console.print(
        f"FleetPolicy {policy}: breaker {'open' if breaker.get('open') else 'closed'}, "
        f"{breaker.get('faultingNodes', 0)} faulting nodes in the window"
    )
    rid = secrets.token_hex(4)
    request = {
        "at": time.time(),
        "by": await whoami(client, kubeconfig),
        "reason": reason,
        "id": rid,
    }
    value = json.dumps(request, separators=(",", ":"))
    await client.patch(
        custom(crds.FLEET_POLICY_PLURAL),
        policy,
        {"metadata": {"annotations": {well_known.ANNOTATION_BREAKER_RESET: value}}},
    )
    console.print(f"request {rid}: breaker reset by {request['by']}: {reason}")
    if not wait:
        return None
    return await _answer_event(
        client, event_namespace, "FleetPolicy", policy, "BreakerReset", rid, timeout
    )


def breaker_reset(
    policy: str,
    reason: str,
    kubeconfig: Path | None,
    *,
    no_wait: bool,
    timeout: float,
    event_namespace: str,
) -> None:
    """Ask the controller to close the breaker; print its answer; exit 1 if refused."""
    console = output.console()
    text = _reason(reason)
    _carry_out(
        console,
        _send_breaker_reset(
            kubeconfig,
            policy,
            text,
            wait=not no_wait,
            timeout=timeout,
            event_namespace=event_namespace,
            console=console,
        ),
        missing=f"no FleetPolicy named {policy}",
        unanswered=(
            f"no answer from the lifecycle controller within {timeout:g}s; the request "
            f"stays on the FleetPolicy and is applied when the controller runs"
        ),
    )
