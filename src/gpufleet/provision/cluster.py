"""Where the cluster is, for the user-data: the apiserver endpoint and the CA hash,
read from a kubeconfig (the service's own, or an admin's for ``render``)."""

from __future__ import annotations

import base64
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from gpufleet.kubeapi import contexts as kube_contexts
from gpufleet.provision import render


def endpoint_and_ca(kubeconfig: Path) -> tuple[str, bytes]:
    """``(host:port, CA PEM)`` of the cluster of the context in use (``--context``, else
    the current one)."""
    config = yaml.safe_load(kubeconfig.read_text())
    current = kube_contexts.name_in(config)
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    try:
        cluster = clusters[contexts[current]["cluster"]]
    except KeyError:
        raise ValueError(f"{kubeconfig}: no cluster for the context {current!r}") from None
    url = urlsplit(str(cluster["server"]))
    port = url.port or 443
    if "certificate-authority-data" in cluster:
        ca = base64.b64decode(cluster["certificate-authority-data"])
    elif "certificate-authority" in cluster:
        path = Path(cluster["certificate-authority"])
        if not path.is_absolute():
            path = kubeconfig.parent / path
        ca = path.read_bytes()
    else:
        raise ValueError(f"{kubeconfig}: the cluster has no certificate authority")
    return f"{url.hostname}:{port}", ca


def boot_config(
    kubeconfig: Path,
    *,
    public_url: str,
    apiserver: str | None = None,
    kernel_url: str | None = None,
    initrd_url: str | None = None,
    image_url: str | None = None,
    images_url: str = "",
    agent_wheel_url: str = "",
    agent_wheel_sha256: str = "",
    agent_args: str = "",
    registry_mirrors: tuple[tuple[str, str], ...] = (),
) -> render.BootConfig:
    """A :class:`~gpufleet.provision.render.BootConfig` for the kubeconfig's cluster."""
    endpoint, ca = endpoint_and_ca(kubeconfig)
    defaults = render.BootConfig(apiserver="", ca_hash="", public_url="")
    return render.BootConfig(
        apiserver=apiserver or endpoint,
        ca_hash=render.ca_hash(ca),
        public_url=public_url,
        kernel_url=kernel_url or defaults.kernel_url,
        initrd_url=initrd_url or defaults.initrd_url,
        image_url=image_url or defaults.image_url,
        images_url=images_url,
        agent_wheel_url=agent_wheel_url,
        agent_wheel_sha256=agent_wheel_sha256,
        agent_args=agent_args,
        registry_mirrors=registry_mirrors,
    )
