"""``gpufleet controller``: run the lifecycle and remediation controller."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli import logs
from gpufleet.cli.options import (
    EVENT_NAMESPACE,
    BmcCaBundleOpt,
    KubeconfigOpt,
    VerboseOpt,
    kubeconfig_arg,
)


def controller(
    kubeconfig: KubeconfigOpt = None,
    namespace: Annotated[
        str,
        typer.Option(
            "--event-namespace",
            "--namespace",
            help="Namespace of its Events about cluster-scoped objects (Nodes, FleetPolicies).",
        ),
    ] = EVENT_NAMESPACE,
    metrics_port: Annotated[
        int, typer.Option(help="Port of the Prometheus /metrics endpoint; 0 turns it off.")
    ] = 29441,
    metrics_address: Annotated[
        str,
        typer.Option(help="Address /metrics listens on (0.0.0.0 for a Prometheus off the host)."),
    ] = "127.0.0.1",
    policy_name: Annotated[str, typer.Option(help="The FleetPolicy object to obey.")] = "default",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and report (Events, logs), change nothing.")
    ] = False,
    lease: Annotated[
        str,
        typer.Option(
            help="The Lease the replicas share: only its holder acts (created in --namespace"
            " if absent; docs/decisions/0141)."
        ),
    ] = "gpufleet-controller",
    lease_duration: Annotated[
        float,
        typer.Option(
            min=2.0,
            help="Seconds the Lease holds without a renewal: how long a standby waits before"
            " it takes over from a replica that stopped without letting go.",
        ),
    ] = 30.0,
    identity: Annotated[
        str,
        typer.Option(help="This replica's name in the Lease; default: host name + random."),
    ] = "",
    graceful_settle: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds a GracefulRestart whose answer was lost is given to show (the OS"
            " shuts down first); nothing else is posted for that attempt meanwhile.",
        ),
    ] = 300.0,
    lease_namespace: Annotated[
        str | None,
        typer.Option(
            envvar="POD_NAMESPACE",
            show_envvar=True,
            help="Namespace of the Lease and the signing key Secret (the chart: the"
            " release's); default: --namespace.",
        ),
    ] = None,
    key_secret: Annotated[
        str,
        typer.Option(
            help="Secret (in --namespace) with the key records are signed with; created if"
            " absent (docs/decisions/0144)."
        ),
    ] = "gpufleet-record-key",
    tick: Annotated[
        float, typer.Option(min=0.1, help="Seconds between retries of held decisions.")
    ] = 2.0,
    ticket_webhook: Annotated[
        str | None,
        typer.Option(
            help="URL RMA tickets are POSTed to when a node reaches triage or rma, and "
            "closed at (docs/schemas/rma-ticket.schema.json); unset: no tickets."
        ),
    ] = None,
    ticket_auth_file: Annotated[
        Path | None,
        typer.Option(help="File holding the webhook's Authorization header value (a Secret)."),
    ] = None,
    ticket_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds to wait for one webhook answer.")
    ] = 10.0,
    ticket_retry: Annotated[
        float, typer.Option(min=0.1, help="Pause before a failed ticket call is retried.")
    ] = 5.0,
    ticket_retry_max: Annotated[
        float, typer.Option(min=0.1, help="Longest pause between retries of a ticket call.")
    ] = 300.0,
    evidence_namespace: Annotated[
        str | None,
        typer.Option(help="Namespace of the evidence ConfigMaps; default: the event namespace."),
    ] = None,
    adoption_rate: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="First writes per second of healthy nodes it has never seen (their state "
            "label and record; they are acted on at once); 0: each at once.",
        ),
    ] = 50.0,
    node_selector: Annotated[
        str,
        typer.Option(
            help="key=value[,key=value]: manage only the Nodes with these labels (e.g. "
            "nvidia.com/gpu.present=true); '' manages every Node."
        ),
    ] = "",
    generate_secret: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME:KEY:LENGTH: create Secret NAME (in the Lease's namespace) with KEY of"
            " LENGTH random letters and digits if it does not exist; an existing one is"
            " never read or changed (repeatable; the chart's Slurm keys, docs/decisions/0188)."
            " Example: --generate-secret gpufleet-munge-key:munge.key:1024",
        ),
    ] = None,
    bmc_address_map: Annotated[
        str,
        typer.Option(
            help="FROM=TO[,...]: reach a BMC named at host FROM (in Machines and BMC Secrets) "
            "at host TO instead, when this controller's network sees the BMCs at other "
            "addresses than the provisioning network does (a NAT)."
        ),
    ] = "",
    bmc_ca_bundle: BmcCaBundleOpt = None,
    dra_device_taints: Annotated[
        bool,
        typer.Option(
            "--dra-device-taints",
            help="Keep one DRA DeviceTaintRule (NoExecute) per quarantined GPU, selecting the"
            " device the agent publishes (agent --dra-publish): pods holding that GPU are"
            " evicted, the node's others keep theirs. Needs DeviceTaintRules served"
            " (Kubernetes 1.36: the DRADeviceTaintRules gate; docs/install.md).",
        ),
    ] = False,
    verbose: VerboseOpt = False,
    log_format: logs.LogFormatOpt = logs.LogFormat.TEXT,
) -> None:
    """Run the lifecycle controller: faults -> cordon, drain, remediation ladder, verification.

    Replicas share a Lease (--lease): only its holder decides and acts; another takes
    over --lease-duration seconds after the holder stopped renewing (at once if it let
    go). Every disruptive act goes through the gate: a fresh proof that the node is
    empty, the rails, a compare-and-swap mark (docs/decisions/0139, 0141).

    With --ticket-webhook, a node that reaches triage or rma gets an evidence bundle
    (a ConfigMap) and a ticket opened through the webhook, retried until acknowledged;
    ``gpufleet machines rearm`` closes it (docs/operations.md, "RMA tickets").

    Example:

        gpufleet controller --kubeconfig ~/.kube/config --policy-name default --metrics-port 29441

        gpufleet controller --node-selector nvidia.com/gpu.present=true

        gpufleet controller --lease gpufleet-controller --lease-namespace gpufleet-system

        gpufleet controller --bmc-address-map 10.0.0.5=192.168.100.5

        gpufleet controller --bmc-ca-bundle /etc/gpufleet/bmc-ca/ca.crt

        gpufleet controller --dra-device-taints

        gpufleet controller --ticket-webhook https://tickets.example.com/gpufleet \\
            --ticket-auth-file /etc/gpufleet/ticket/authorization
    """
    import asyncio

    if ticket_webhook is not None and not ticket_webhook.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"must be an http(s) URL, got {ticket_webhook!r}", param_hint="--ticket-webhook"
        )
    try:
        selector = parse_node_selector(node_selector)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--node-selector") from None
    from gpufleet.remediate import redfish

    try:
        redfish.set_address_map(redfish.parse_address_map(bmc_address_map))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--bmc-address-map") from None
    from gpufleet.lifecycle.generated_secrets import GeneratedSecret

    try:
        generated = tuple(GeneratedSecret.parse(t) for t in generate_secret or ())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--generate-secret") from None
    logs.configure(verbose, log_format)
    # Imported here: kopf and the controller take a second to import, which
    # every other gpufleet command would pay at start-up.
    from gpufleet.lifecycle.controller import ControllerSettings
    from gpufleet.lifecycle.operator import RunOptions, run

    settings = ControllerSettings(
        policy_name=policy_name,
        dry_run=dry_run,
        tick_s=tick,
        event_namespace=namespace,
        ticket_webhook=ticket_webhook,
        ticket_auth_file=str(ticket_auth_file) if ticket_auth_file else None,
        ticket_timeout_s=ticket_timeout,
        ticket_retry_s=ticket_retry,
        ticket_retry_max_s=max(ticket_retry_max, ticket_retry),
        evidence_namespace=evidence_namespace,
        adoption_writes_per_s=adoption_rate,
        node_selector=selector,
        lease=lease,
        lease_duration_s=lease_duration,
        identity=identity,
        key_secret=key_secret,
        key_namespace=lease_namespace,
        generated_secrets=generated,
        lease_namespace=lease_namespace,
        graceful_settle_s=graceful_settle,
        bmc_ca_file=str(bmc_ca_bundle) if bmc_ca_bundle else None,
        device_taints=dra_device_taints,
    )
    options = RunOptions(
        kubeconfig=kubeconfig_arg(kubeconfig),
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
    asyncio.run(run(settings, options))


_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")


def parse_node_selector(text: str) -> dict[str, str]:
    """``key=value,...`` -> labels; ValueError naming what is wrong (only equality: kopf
    filters the watch by exact label values, the list by the same selector)."""
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            raise ValueError(f"{part!r}: expected key=value with a label's key and value")
        if key in labels:
            raise ValueError(f"{key!r} given twice")
        labels[key] = value
    return labels
