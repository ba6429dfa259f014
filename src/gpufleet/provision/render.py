"""What a booting machine is served: the iPXE script and the cloud-init user-data.

Pure functions of the configuration, the Machine and (for user-data) the
token just issued, so ``gpufleet provision render`` shows exactly what a
machine would get. The user-data joins the node with kubeadm: the apiserver
endpoint, the CA public-key hash kubeadm pins (``sha256:`` of the CA's
SubjectPublicKeyInfo), the bootstrap token and the labels the kubelet
registers the Node with.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpufleet.api.machine import MachineSpec
from gpufleet.domain import boot_images, well_known

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter when PyYAML has it: the same documents (line folding may differ),
about 8x faster than the pure-Python one, which was most of a user-data answer's CPU."""


def _dump(data: object) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


@dataclass(frozen=True)
class BootConfig:
    """Where boot artefacts and the cluster are (``gpufleet provision serve`` options)."""

    apiserver: str
    """``host:port`` of the kube-apiserver the nodes join."""
    ca_hash: str
    """``sha256:<hex>`` of the cluster CA's public key (:func:`ca_hash`)."""
    public_url: str
    """How machines reach this service, e.g. ``http://10.0.0.2:8080``."""
    kernel_url: str = "http://boot.example/gpufleet/vmlinuz"
    initrd_url: str = "http://boot.example/gpufleet/initrd.img"
    image_url: str = "http://boot.example/gpufleet/rootfs.squashfs"
    images_url: str = ""
    """Where named image versions are, ``<images_url>/<version>/{vmlinuz,initrd.img,
    rootfs.squashfs}`` (:mod:`gpufleet.domain.boot_images`); empty: only the default."""
    kernel_args: str = "console=ttyS0,115200n8"
    agent_wheel_url: str = ""
    """Where the node fetches the gpufleet wheel for its agent (the node image has the
    agent's dependencies, not gpufleet itself); empty: the user-data starts no agent."""
    agent_wheel_sha256: str = ""
    agent_args: str = ""
    """Extra ``gpufleet agent`` arguments, e.g. ``--backend simulated`` on a machine
    without GPUs."""
    registry_mirrors: tuple[tuple[str, str], ...] = ()
    """(registry, URL): the node's containerd pulls ``<registry>/...`` images from URL
    (``/etc/containerd/certs.d/<registry>/hosts.toml``), e.g. the local cluster's
    ``("gpufleet.local", "http://10.0.2.100:5000")``."""


def parse_registry_mirror(text: str) -> tuple[str, str]:
    """``REGISTRY=URL`` (``--registry-mirror``) -> (registry, URL); ValueError says why not."""
    registry, sep, url = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?", registry):
        raise ValueError(
            f"{text!r}: expected REGISTRY=URL, e.g. gpufleet.local=http://10.0.0.2:5000"
        )
    if not re.fullmatch(r"https?://[A-Za-z0-9.\[\]:-]+(:[0-9]+)?/?", url):
        raise ValueError(f"{text!r}: the URL must be http(s)://host[:port]")
    return registry, url.rstrip("/")


def containerd_hosts(url: str) -> str:
    """containerd's ``hosts.toml``: pull and resolve from ``url`` only (plain HTTP allowed
    when the URL says http: the local registry has no TLS)."""
    return f'server = "{url}"\n\n[host."{url}"]\n  capabilities = ["pull", "resolve"]\n'


def ca_hash(ca_pem: bytes) -> str:
    """kubeadm's ``--discovery-token-ca-cert-hash`` of the CA in a PEM bundle.

    In a bundle (serving certificate, then its CA) the CA is the certificate
    with ``CA:TRUE``; the last one is taken if several are.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    certs = x509.load_pem_x509_certificates(ca_pem)
    cas = []
    for cert in certs:
        try:
            if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
                cas.append(cert)
        except x509.ExtensionNotFound:
            continue
    if not cas:
        raise ValueError("no CA certificate (CA:TRUE) in the bundle")
    spki = cas[-1].public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def ca_hash_of_file(path: Path) -> str:
    return ca_hash(path.read_bytes())


def node_labels(name: str, spec: MachineSpec) -> dict[str, str]:
    """The labels the kubelet registers the Node with (all allowed for self-labelling)."""
    labels = {
        well_known.LABEL_MACHINE: name,
        well_known.LABEL_POOL: spec.pool,
        well_known.LABEL_STATE: "provisioning",
        well_known.LABEL_GPU_PRODUCT: spec.hardware.gpu_model,
    }
    if spec.topology.leaf:
        labels[well_known.LABEL_IB_LEAF] = spec.topology.leaf
    if spec.topology.block:
        labels[well_known.LABEL_IB_BLOCK] = spec.topology.block
    return labels


class ImageNotServed(ValueError):
    """The Machine asks for an image version this service does not serve."""


def boot_files(config: BootConfig, image: str | None) -> tuple[str, str, str]:
    """Kernel, initrd and root image URLs of ``image`` (None: the default image).

    Raises :class:`ImageNotServed` for a version without ``images_url`` or an invalid one:
    a machine re-imaged to a version must not silently boot another.
    """
    if image is None:
        return config.kernel_url, config.initrd_url, config.image_url
    if not config.images_url:
        raise ImageNotServed(
            f"image version {image!r} asked, but this service serves only its default image "
            "(no --images-url)"
        )
    try:
        return boot_images.urls(config.images_url, image)
    except ValueError as exc:
        raise ImageNotServed(str(exc)) from None


def ipxe(config: BootConfig, name: str, mac: str, image: str | None = None) -> str:
    """The iPXE script for a known machine: kernel, initrd, and where its cloud-init is.

    ``image``: the version its Machine names (``status.image``); None: the default."""
    kernel_url, initrd_url, image_url = boot_files(config, image)
    # iPXE fills in the SMBIOS serial; cloud-init fetches <seed>meta-data, <seed>user-data.
    seed = f"{config.public_url.rstrip('/')}/cloud-init/{mac}/serial/${{serial:uristring}}/"
    args = " ".join(
        a
        for a in (
            "initrd=initrd.img",
            "ip=dhcp",
            f"boot=live fetch={image_url}",
            f"ds=nocloud-net;s={seed}",
            f"gpufleet.machine={name}",
            config.kernel_args,
        )
        if a
    )
    return (
        "#!ipxe\n"
        f"echo gpufleet: booting {name} ({mac}), image {image or 'default'}\n"
        f"kernel {kernel_url} {args}\n"
        f"initrd {initrd_url}\n"
        "boot\n"
    )


def meta_data(name: str) -> str:
    """nocloud meta-data: the instance id and hostname (no secrets)."""
    return _dump({"instance-id": name, "local-hostname": name})


def agent_env(config: BootConfig, name: str) -> str:
    """``/etc/gpufleet/agent.env`` of the node image's agent units: the Node name, the
    wheel to install, the agent's arguments (systemd EnvironmentFile syntax)."""
    lines = {
        "NODE_NAME": name,
        "GPUFLEET_WHEEL_URL": config.agent_wheel_url,
        "GPUFLEET_WHEEL_SHA256": config.agent_wheel_sha256,
        "GPUFLEET_AGENT_ARGS": config.agent_args,
    }
    return "".join(f'{k}="{v}"\n' for k, v in lines.items() if v)


def user_data(config: BootConfig, name: str, spec: MachineSpec, token: str) -> str:
    """``#cloud-config`` that joins the node with kubeadm using ``token``."""
    labels = node_labels(name, spec)
    join = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "JoinConfiguration",
        "discovery": {
            "bootstrapToken": {
                "apiServerEndpoint": config.apiserver,
                "token": token,
                "caCertHashes": [config.ca_hash],
            },
        },
        # v1beta4 keeps the timeouts together (discovery.timeout is v1beta3's).
        "timeouts": {"discovery": "5m0s"},
        "nodeRegistration": {
            "name": name,
            "kubeletExtraArgs": [
                {
                    "name": "node-labels",
                    "value": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
                }
            ],
        },
    }
    files = [
        {
            "path": "/etc/gpufleet/kubeadm-join.yaml",
            "permissions": "0600",
            "content": _dump(join),
        }
    ]
    if config.agent_wheel_url:
        files.append(
            {
                "path": "/etc/gpufleet/agent.env",
                "permissions": "0644",
                "content": agent_env(config, name),
            }
        )
    files += [
        {
            "path": f"/etc/containerd/certs.d/{registry}/hosts.toml",
            "permissions": "0644",
            "content": containerd_hosts(url),
        }
        for registry, url in config.registry_mirrors
    ]
    doc = {
        "hostname": name,
        "fqdn": name,
        "write_files": files,
        "runcmd": [["kubeadm", "join", "--config", "/etc/gpufleet/kubeadm-join.yaml"]],
    }
    return "#cloud-config\n" + _dump(doc)
