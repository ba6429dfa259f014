"""``gpufleet provision serve|render`` and ``gpufleet machines [import | power-on | rearm]``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli import logs
from gpufleet.cli.errors import fail
from gpufleet.cli.options import BmcCaBundleOpt, KubeconfigOpt
from gpufleet.cli.output import Column, Format, OutputOpt, emit, table
from gpufleet.kubeapi import ApiError, Conflict, NotFound

# The client (kr8s), the issuer (prometheus_client, the Machine model), the gate and the
# BMC clients are imported by the commands that use them: each --help needs none of them
# (docs/cli.md, start-up).

app = typer.Typer(help="Day 0: network boot, cloud-init and join tokens for known machines.")
machines_app = typer.Typer(
    help="The machine inventory (Machine objects); alone: a table.\n\n"
    "Example: gpufleet machines --kubeconfig ~/.kube/config",
    invoke_without_command=True,
)

CRD_HINT = "install the Machine CRD: kubectl apply -f deploy/crds/machines.yaml"


@app.command("serve")
def serve_cmd(
    kubeconfig: KubeconfigOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    public_url: Annotated[
        str | None, typer.Option(help="How machines reach this service (in the iPXE script).")
    ] = None,
    apiserver: Annotated[
        str | None, typer.Option(help="host:port nodes join; default: the kubeconfig's server.")
    ] = None,
    kernel_url: Annotated[str | None, typer.Option(help="Kernel URL for iPXE.")] = None,
    initrd_url: Annotated[str | None, typer.Option(help="initrd URL for iPXE.")] = None,
    image_url: Annotated[str | None, typer.Option(help="Root image URL (kernel arg).")] = None,
    images_url: Annotated[
        str,
        typer.Option(
            help="Base URL of named image versions: <URL>/<version>/{vmlinuz,initrd.img,"
            "rootfs.squashfs}. A machine re-imaged to a version (a MaintenancePlan's "
            "spec.image) boots it; without this option such a machine gets no script."
        ),
    ] = "",
    token_ttl: Annotated[
        float, typer.Option(min=1, help="Seconds a join token stays valid.")
    ] = 900.0,
    namespace: Annotated[str, typer.Option(help="Namespace for audit Events.")] = "default",
    boot_dir: Annotated[
        Path | None,
        typer.Option(
            help="Also serve the files of this directory (kernel, initrd, root image) at "
            "/boot/<name>; point --kernel-url etc. at them."
        ),
    ] = None,
    agent_wheel_url: Annotated[
        str,
        typer.Option(
            help="URL of the gpufleet wheel the node installs for its agent; the user-data "
            "then writes /etc/gpufleet/agent.env (empty: no agent)."
        ),
    ] = "",
    agent_wheel_sha256: Annotated[str, typer.Option(help="sha256 of that wheel.")] = "",
    agent_args: Annotated[
        str, typer.Option(help="Extra `gpufleet agent` arguments on the node.")
    ] = "",
    registry_mirror: Annotated[
        list[str] | None,
        typer.Option(
            help="REGISTRY=URL: the nodes' containerd pulls REGISTRY/... images from URL "
            "(repeatable), e.g. gpufleet.local=http://10.0.2.100:5000."
        ),
    ] = None,
    bmc_ca_bundle: BmcCaBundleOpt = None,
    log_format: logs.LogFormatOpt = logs.LogFormat.TEXT,
) -> None:
    """Serve iPXE scripts, cloud-init and single-use join tokens to known machines.

    Example:

        gpufleet provision serve --kubeconfig ~/.kube/config --host 0.0.0.0 --port 8080 \\
            --public-url http://10.0.0.2:8080 --kernel-url http://10.0.0.2/vmlinuz

    Serving the boot files too (the local cluster's machines boot this way):

        gpufleet provision serve --port 8080 --public-url http://10.0.2.100:8080 \\
            --boot-dir ~/.cache/gpufleet/node-image/KEY \\
            --kernel-url http://10.0.2.100:8080/boot/vmlinuz

    Pointing the nodes' containerd at a registry without TLS (the local cluster's):

        gpufleet provision serve --registry-mirror gpufleet.local=http://10.0.2.100:5000

    Serving named image versions for reimages (a MaintenancePlan with spec.image v2 boots
    http://10.0.0.2/images/v2/vmlinuz, initrd.img, rootfs.squashfs):

        gpufleet provision serve --public-url http://10.0.0.2:8080 \\
            --images-url http://10.0.0.2/images

    Checking the BMCs' certificates against a site CA (for BMC Secrets without ca.crt):

        gpufleet provision serve --bmc-ca-bundle /etc/gpufleet/bmc-ca/ca.crt
    """
    import asyncio

    logs.configure(log_format=log_format)
    from gpufleet.provision.issuer import ServiceSettings
    from gpufleet.provision.render import parse_registry_mirror
    from gpufleet.provision.server import ServeOptions, serve  # fastapi: slow to import

    try:
        mirrors = tuple(parse_registry_mirror(m) for m in registry_mirror or [])
    except ValueError as exc:
        fail(f"--registry-mirror {exc}")
    options = ServeOptions(
        kubeconfig=kubeconfig,
        host=host,
        port=port,
        public_url=public_url,
        apiserver=apiserver,
        kernel_url=kernel_url,
        initrd_url=initrd_url,
        image_url=image_url,
        images_url=images_url,
        boot_dir=boot_dir,
        agent_wheel_url=agent_wheel_url,
        agent_wheel_sha256=agent_wheel_sha256,
        agent_args=agent_args,
        registry_mirrors=mirrors,
    )
    if boot_dir is not None and not boot_dir.is_dir():
        fail(f"--boot-dir {boot_dir}: not a directory")
    settings = ServiceSettings(
        token_ttl_s=token_ttl,
        event_namespace=namespace,
        bmc_ca_file=str(bmc_ca_bundle) if bmc_ca_bundle else None,
    )
    asyncio.run(serve(options, settings))


@app.command("render")
def render_cmd(
    mac: Annotated[str, typer.Option(help="The booting NIC's MAC address.")],
    kubeconfig: KubeconfigOpt = None,
    public_url: Annotated[
        str, typer.Option(help="How machines reach the service.")
    ] = "http://127.0.0.1:8080",
) -> None:
    """Show what a machine would get: its iPXE script and user-data (no token is issued).

    Example:

        gpufleet provision render --mac aa:bb:cc:00:01:00 --kubeconfig ~/.kube/config
    """
    import asyncio

    from gpufleet.kubeapi import KubeApi
    from gpufleet.provision import machines, render
    from gpufleet.provision.issuer import machine_by_mac, token_state

    try:
        from gpufleet.provision.server import ServeOptions, boot_config

        config = boot_config(ServeOptions(kubeconfig=kubeconfig, public_url=public_url))
    except (OSError, ValueError) as exc:
        fail(f"cannot read the cluster from the kubeconfig: {exc}")

    async def find() -> dict[str, Any] | None:
        api = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
        return await machine_by_mac(api, mac)

    try:
        mac_n = machines.normalize_mac(mac)
        body = asyncio.run(find())
    except ValueError as exc:
        fail(str(exc))
    if body is None:
        fail(f"no Machine lists MAC {mac}: that machine would get 404")
    assert body is not None
    name = str(body["metadata"]["name"])
    spec = machines.spec_of(body)
    state = token_state(body)
    typer.echo(f"# machine {name}; armed: {'yes' if state.armed else 'no (no token)'}")
    typer.echo(f"# GET /ipxe?mac={mac_n}")
    typer.echo(render.ipxe(config, name, mac_n))
    typer.echo(f"# GET /cloud-init/{mac_n}/user-data (token shown as a placeholder)")
    typer.echo(render.user_data(config, name, spec, "<token-id>.<token-secret>"))


@machines_app.callback()
def machines_table(
    ctx: typer.Context, kubeconfig: KubeconfigOpt = None, output: OutputOpt = Format.TABLE
) -> None:
    """A table of machines: pool, GPUs, phase, armed, the Node it became (-o wide adds
    the HCAs and MACs).

    Example:

        gpufleet machines --kubeconfig ~/.kube/config -o wide
    """
    if ctx.invoked_subcommand is not None:
        return
    import asyncio

    from gpufleet.kubeapi import KubeApi
    from gpufleet.provision.issuer import MACHINES

    async def fetch() -> list[dict[str, Any]]:
        api = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
        return (await api.list(MACHINES)).items

    try:
        items = asyncio.run(fetch())
    except NotFound:
        fail("the apiserver has no Machine resource", hint=CRD_HINT)
    rows = [
        machine_summary(body) for body in sorted(items, key=lambda b: str(b["metadata"]["name"]))
    ]
    emit(
        output,
        {"machines": rows},
        lambda wide: table(MACHINE_COLUMNS, map(_machine_cells, rows), wide=wide),
    )


def machine_summary(body: dict[str, Any]) -> dict[str, Any]:
    """One row of ``gpufleet machines`` as data (what -o json and -o yaml print)."""
    from gpufleet.provision.issuer import token_state

    spec = body.get("spec") or {}
    hw = spec.get("hardware") or {}
    status = body.get("status") or {}
    return {
        "name": str(body["metadata"]["name"]),
        "pool": str(spec.get("pool", "")),
        "gpus": hw.get("gpuCount"),
        "gpuModel": hw.get("gpuModel"),
        "hcas": hw.get("hcaCount"),
        "macs": list(spec.get("macs") or []),
        "phase": str(status.get("phase") or "Registered"),
        "armed": token_state(body).armed,
        "node": status.get("node"),
        "boot": _boot_summary(status.get("boot")),
    }


def _boot_summary(boot: Any) -> str | None:
    """The boot watchdog's view in one cell: ``InProgress network-boot #2``, ``Failed
    ImageDidNotBoot #3``, ``Joined``; None when gpufleet never saw the machine boot."""
    if not isinstance(boot, dict) or not boot.get("outcome"):
        return None
    outcome = str(boot["outcome"])
    if outcome == "Joined":
        return outcome
    detail = boot.get("reason") if outcome == "Failed" else boot.get("stage")
    return f"{outcome} {detail or '?'} #{boot.get('attempt') or 1}"


MACHINE_COLUMNS = (
    Column("MACHINE"),
    Column("POOL"),
    Column("GPUS"),
    Column("HCAS", wide=True),
    Column("MACS", wide=True),
    Column("PHASE"),
    Column("ARMED"),
    Column("NODE"),
    Column("BOOT"),
)


def _machine_cells(m: dict[str, Any]) -> list[str]:
    def known(value: Any) -> str:
        return "?" if value is None else str(value)

    return [
        m["name"],
        m["pool"],
        f"{known(m['gpus'])}x {known(m['gpuModel'])}",
        known(m["hcas"]),
        ",".join(m["macs"]),
        m["phase"],
        "yes" if m["armed"] else "no",
        m["node"] or "-",
        m["boot"] or "-",
    ]


@machines_app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="Inventory file: .csv or .yaml.", exists=True)],
    kubeconfig: KubeconfigOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate the file only; create nothing.")
    ] = False,
) -> None:
    """Create or update Machine objects from an inventory file (all or nothing on errors).

    Example:

        gpufleet machines import racks/r12.csv --kubeconfig ~/.kube/config
    """
    import asyncio

    from gpufleet.kubeapi import KubeApi
    from gpufleet.provision import inventory, machines
    from gpufleet.provision.issuer import MACHINES

    try:
        entries = inventory.load(file)
    except inventory.InventoryError as exc:
        fail(str(exc))
    if dry_run:
        typer.echo(f"{file}: {len(entries)} machines, valid")
        return

    async def apply() -> list[str]:
        api = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
        out = []
        for e in entries:
            body = machines.manifest(e.name, e.spec)
            try:
                await api.create(MACHINES, body)
                out.append(f"created {e.name}")
            except Conflict:
                labels = body["metadata"]["labels"]
                await api.patch(
                    MACHINES, e.name, {"metadata": {"labels": labels}, "spec": body["spec"]}
                )
                out.append(f"updated {e.name}")
        return out

    try:
        for line in asyncio.run(apply()):
            typer.echo(line)
    except NotFound as exc:
        fail(str(exc), hint=CRD_HINT)


@machines_app.command("power-on")
def power_on_cmd(
    names: Annotated[list[str], typer.Argument(help="The Machines to power on.")],
    kubeconfig: KubeconfigOpt = None,
    bmc_ca_bundle: BmcCaBundleOpt = None,
) -> None:
    """Power machines on to network-boot and join (Day 0), each through its BMC.

    For each Machine: check that its BMC reports the Machine's serial, re-arm it
    (its boot gets a new single-use token), record the boot in its status, set a
    one-time network boot and press power (On, or ForceRestart if it was on). The
    lifecycle controller then watches the boot: a stage that stalls is retried by a
    power cycle, at most ``provisioning.bootAttempts`` power-ons, then the boot is
    Failed (``gpufleet machines`` shows it; docs/provisioning.md). A Machine that
    has joined as a Node is refused: its Node's lifecycle owns its power.

    Example:

        gpufleet machines power-on gpu-node-0100 gpu-node-0101
    """
    import asyncio

    from gpufleet.clock import SYSTEM_CLOCK
    from gpufleet.gate import Gate
    from gpufleet.kubeapi import KubeApi
    from gpufleet.kubeapi.machines import MachineStore
    from gpufleet.remediate import machine_power, redfish

    async def go() -> list[str]:
        api = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
        ca_file = str(bmc_ca_bundle) if bmc_ca_bundle else None
        gate = Gate.for_operator(api, by="admin", clock=SYSTEM_CLOCK, ca_file=ca_file)
        problems: list[str] = []
        for name in names:
            try:
                done = await gate.network_boot(MachineStore(api), name, by="admin", now=time.time())
            except (machine_power.PowerRefused, redfish.RedfishError, ApiError) as exc:
                problems.append(f"{name}: {exc}")
                continue
            typer.echo(f"{name}: {done.reset_type} with a one-time network boot (re-armed)")
        return problems

    try:
        problems = asyncio.run(go())
    except NotFound as exc:
        fail(str(exc), hint=CRD_HINT)
    if problems:
        fail("not powered on: " + "; ".join(problems))


@machines_app.command("rearm")
def rearm_cmd(
    name: Annotated[str, typer.Argument(help="The Machine to re-arm.")],
    reason: Annotated[str, typer.Option(help="Why (recorded in its status and an Event).")],
    kubeconfig: KubeconfigOpt = None,
    close_ticket: Annotated[
        bool,
        typer.Option(
            "--close-ticket/--keep-ticket",
            help="Also close the RMA ticket of the machine's Node (the hardware was "
            "replaced); --keep-ticket re-arms only.",
        ),
    ] = True,
) -> None:
    """Let a machine's next boot get a new join token (and revoke the previous one).

    After a hardware replacement this also closes the RMA ticket gpufleet opened for
    the machine's Node: the lifecycle controller sends the close to the ticket
    webhook (retried until acknowledged) and records it closed; the record and the
    evidence go when the node returns with ``gpufleet node return NODE
    --hardware-replaced`` (docs/operations.md, "RMA tickets").

    Example:

        gpufleet machines rearm gpu-node-0100 --reason "chassis replaced under RMA 4711"
    """
    import asyncio

    async def go() -> tuple[str, str] | None:
        from gpufleet.cli.operator_cmd import whoami
        from gpufleet.kubeapi import KubeApi
        from gpufleet.kubeapi.tickets import request_close
        from gpufleet.provision.issuer import MACHINES, rearm

        api = await KubeApi.connect(str(kubeconfig) if kubeconfig else None)
        await rearm(api, name, by="admin", reason=reason, now=time.time())
        if not close_ticket:
            return None
        machine = await api.get(MACHINES, name)
        who = await whoami(api, kubeconfig)
        return await request_close(api, machine, by=who, reason=reason, now=time.time())

    closing = asyncio.run(go())
    typer.echo(f"{name} re-armed: its next boot gets a new token")
    if closing is not None:
        node, key = closing
        typer.echo(f"RMA ticket {key} of node {node}: close requested (the controller sends it)")
