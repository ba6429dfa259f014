"""Options that several commands share, defined once: the same name, default and
words wherever they appear (``--kubeconfig``, a local cluster's ``--name`` and
``--run-dir``, ``--node``, ``--verbose``). A command takes one by annotation::

    def nodes(kubeconfig: KubeconfigOpt = None, ...) -> None:
        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))

Output options (``-o``) are in :mod:`gpufleet.cli.output`; failures in
:mod:`gpufleet.cli.errors`.
"""

from __future__ import annotations

import enum
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.errors import fail

if TYPE_CHECKING:
    from gpufleet.local.cluster import ClusterInfo

KUBECONFIG_HELP = (
    "kubeconfig file; default: $KUBECONFIG, else ~/.kube/config, else the Pod's "
    "service account (in a cluster)."
)
KubeconfigOpt = Annotated[Path | None, typer.Option("--kubeconfig", help=KUBECONFIG_HELP)]


def kubeconfig_arg(kubeconfig: Path | None) -> str | None:
    """What :meth:`gpufleet.kubeapi.KubeApi.connect` takes."""
    return str(kubeconfig) if kubeconfig is not None else None


def _use_context(value: str | None) -> str | None:
    if value:
        from gpufleet.kubeapi import contexts

        contexts.use(value)
    return value


ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context",
        callback=_use_context,
        expose_value=False,
        help="The kubeconfig context to use, as kubectl's --context; default: "
        "$GPUFLEET_CONTEXT, else the kubeconfig's current-context.",
    ),
]
"""Every command that takes ``--kubeconfig`` takes this too: the root group adds it
(:func:`with_context`), so a command declares only ``--kubeconfig``. Its value is put
where every reader of the kubeconfig in this process looks (:mod:`gpufleet.kubeapi.contexts`)."""


def with_context(command: Any) -> None:
    """Give ``command`` and each command under it that takes ``--kubeconfig`` a
    ``--context`` right after it."""
    for sub in (getattr(command, "commands", None) or {}).values():
        with_context(sub)
    opts = [list(getattr(p, "opts", ())) for p in command.params]
    where = [i for i, names in enumerate(opts) if "--kubeconfig" in names]
    if where and not any("--context" in names for names in opts):
        command.params.insert(where[0] + 1, _context_param())


def _context_param() -> Any:
    single = typer.Typer(add_completion=False)

    @single.command()
    def placeholder(context: ContextOpt = None) -> None:
        """Never run: it only turns :data:`ContextOpt` into an option object."""

    return typer.main.get_command(single).params[0]


LOCAL_NAME = "default"
"""The local cluster every command means when none is named (``gpufleet local up``'s)."""
LocalNameOpt = Annotated[
    str,
    typer.Option(
        "--name",
        help="Local cluster name (its run directory is /tmp/gpufleet/<name>); "
        "`gpufleet demo` names its cluster demo.",
    ),
]
RunDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--run-dir",
        help="Local cluster run directory (logs, pki, kubeconfig, slurm.conf); "
        "default: /tmp/gpufleet/<name>.",
    ),
]


def local_run_dir(name: str, run_dir: Path | None) -> Path:
    """``--run-dir`` if given, else the named cluster's directory."""
    from gpufleet.local.cluster import default_run_dir

    return run_dir if run_dir is not None else default_run_dir(name)


def local_cluster(name: str, run_dir: Path | None) -> ClusterInfo:
    """The local cluster's description; if there is none, fail naming those there are."""
    from gpufleet.local.cluster import STATE_FILE, default_run_dir, load_info

    path = local_run_dir(name, run_dir)
    try:
        return load_info(path)
    except FileNotFoundError as err:
        found = sorted(p.parent.name for p in default_run_dir(name).parent.glob(f"*/{STATE_FILE}"))
        hint = (
            "local clusters here: " + ", ".join(f"--name {n}" for n in found)
            if found
            else "start one with: gpufleet local up (or gpufleet demo --keep)"
        )
        fail(str(err), hint=hint)


NodeNameOpt = Annotated[
    str | None,
    typer.Option(
        "--node",
        envvar="NODE_NAME",
        show_envvar=False,
        help="This node's Kubernetes Node name; default: $NODE_NAME, else this host's name.",
    ),
]


def node_name(node: str | None) -> str:
    """The ``--node`` value, or this host's name (read when the command runs, so that
    ``--help`` does not show the name of the machine it was built on)."""
    return node or socket.gethostname()


class Backend(enum.StrEnum):
    """Where health data comes from."""

    REAL = "real"
    SIMULATED = "simulated"


BackendOpt = Annotated[
    Backend,
    typer.Option(
        "--backend",
        case_sensitive=False,
        help="Hardware backend: real (NVML, sysfs, the kernel log) or simulated.",
    ),
]

PolicyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        help="Policy YAML file (a FleetPolicy or its spec); default: the built-in policy.",
    ),
]

EVENT_NAMESPACE = "default"
EventNamespaceOpt = Annotated[
    str,
    typer.Option(
        "--event-namespace",
        help="Namespace of the lifecycle controller's Events about cluster-scoped objects "
        "(Nodes, FleetPolicies): the controller's --event-namespace.",
    ),
]

VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")]

MetricsPortOpt = Annotated[
    int, typer.Option(help="Port of the Prometheus /metrics endpoint; 0 (default) turns it off.")
]
MetricsAddressOpt = Annotated[
    str,
    typer.Option(help="Address /metrics listens on (0.0.0.0 for a Prometheus off the host)."),
]

LeaseNamespaceOpt = Annotated[
    str,
    typer.Option(envvar="POD_NAMESPACE", help="Namespace of the Lease; default: the pod's."),
]
"""Where a Lease-led service's replicas meet (the chart passes the release's namespace)."""

BmcCaBundleOpt = Annotated[
    Path | None,
    typer.Option(
        "--bmc-ca-bundle",
        envvar="GPUFLEET_BMC_CA_BUNDLE",
        help="CA certificates (PEM) that BMC certificates are verified against when a BMC's"
        " Secret has no ca.crt of its own; read at each BMC connection, so a rotated bundle"
        " counts at once (docs/security.md, 'TLS to BMCs').",
    ),
]
