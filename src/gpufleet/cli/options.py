"""Options that several commands share, defined once: the same name, default and
words wherever they appear (``--kubeconfig``, a local cluster's ``--name`` and
``--run-dir``, ``--node``, ``--verbose``). A command takes one by annotation::

    def nodes(kubeconfig: KubeconfigOpt = None, ...) -> None:
        client = await KubeApi.connect(kubeconfig_arg(kubeconfig))

Output options (``-o``) are in :mod:`gpufleet.cli.output`; failures in
:mod:`gpufleet.cli.errors`.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

KUBECONFIG_HELP = (
    "kubeconfig file; default: $KUBECONFIG, else ~/.kube/config, else the Pod's "
    "service account (in a cluster)."
)
KubeconfigOpt = Annotated[Path | None, typer.Option("--kubeconfig", help=KUBECONFIG_HELP)]


def kubeconfig_arg(kubeconfig: Path | None) -> str | None:
    """What :meth:`gpufleet.kubeapi.KubeApi.connect` takes."""
    return str(kubeconfig) if kubeconfig is not None else None


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


VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")]
