"""The cached node image of this checkout holds what docs/provisioning.md promises.

No VM here (test_chart_on_machines.py boots it): the image ``scripts/bootstrap-system.sh``
builds for the test command is opened with ``unsquashfs`` and checked against its
manifest and the contract: the kubelet, kubeadm and kube-proxy of deps/, the units
enabled where they must be, containerd pointed at the pause image that is in the
image, the netcheck image, no pod network configuration of its own (each node writes
its own at boot), the venv, and a kernel whose modules are there.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpufleet.local import binaries, node_image

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def image() -> node_image.NodeImage:
    return node_image.require()  # built by scripts/bootstrap-system.sh; fails saying how


@pytest.fixture(scope="module")
def listing(image: node_image.NodeImage) -> set[str]:
    assert shutil.which("unsquashfs"), "unsquashfs missing: apt-get install squashfs-tools"
    out = subprocess.run(
        ["unsquashfs", "-lc", "-d", "", str(image.rootfs)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {line.strip().lstrip("/") for line in out.splitlines() if line.strip()}


def cat(image: node_image.NodeImage, path: str, tmp_path: Path) -> bytes:
    dest = tmp_path / "x"
    subprocess.run(
        ["unsquashfs", "-q", "-n", "-f", "-d", str(dest), str(image.rootfs), path],
        capture_output=True, check=True,
    )  # fmt: skip
    return (dest / path).read_bytes()


def test_the_files_are_those_of_the_manifest(image: node_image.NodeImage) -> None:
    assert image.key == node_image.Inputs.of_checkout().key()
    for name in node_image.IMAGE_FILES:
        digest = hashlib.sha256((image.directory / name).read_bytes()).hexdigest()
        assert digest == image.manifest["files"][name]["sha256"], name  # type: ignore[index]


def test_the_kubelet_kubeadm_and_kube_proxy_are_the_pinned_ones(
    image: node_image.NodeImage, listing: set[str], tmp_path: Path
) -> None:
    built = binaries.go_bin_dir()
    for name in ("kubelet", "kubeadm", "kube-proxy"):
        assert f"usr/bin/{name}" in listing
        assert cat(image, f"usr/bin/{name}", tmp_path) == (built / name).read_bytes()


def test_the_units_are_enabled_where_the_boot_needs_them(listing: set[str]) -> None:
    wants = {
        "multi-user.target.wants": ["kubelet.service", "containerd.service",
                                    "gpufleet-pause-image.service", "gpufleet-pod-network.path",
                                    "gpufleet-fabric.service"],
        "cloud-init.target.wants": ["gpufleet-agent.service", "gpufleet-agent-install.service"],
        "containerd.service.requires": ["gpufleet-containerd-root.service"],
    }  # fmt: skip
    for target, units in wants.items():
        for unit in units:
            assert f"etc/systemd/system/{target}/{unit}" in listing, (target, unit)
    for path in (
        "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
        "usr/lib/gpufleet/install-agent",
        "usr/lib/gpufleet/containerd-root",
        "etc/cloud/cloud.cfg.d/90-gpufleet.cfg",
        "usr/lib/gpufleet/pod-network",
        "usr/lib/gpufleet/fabric",
        "usr/lib/systemd/system/gpufleet-pod-routes.service",
        "usr/lib/gpufleet/kube-proxy.yaml",
        "usr/lib/systemd/system/kube-proxy.service",
        "usr/lib/cni/bridge",
        "usr/lib/cni/host-local",
        "usr/lib/cni/portmap",
        "usr/lib/cni/loopback",
        "opt/gpufleet/venv/bin/python3",
    ):
        assert path in listing, path
    assert not any(
        p.startswith("opt/gpufleet/venv/lib/python3.13/site-packages/gpufleet/") for p in listing
    ), "the gpufleet package must come at boot, not in the image"
    # One pod subnet per node, written at boot from the Node's spec.podCIDR: an image
    # with a subnet of its own would give every machine the same pod addresses.
    assert not any(p.startswith("etc/cni/net.d/") and p.endswith(".conflist") for p in listing)


def test_containerd_starts_pods_with_the_pause_image_in_the_image(
    image: node_image.NodeImage, tmp_path: Path
) -> None:
    config = cat(image, "etc/containerd/config.toml", tmp_path).decode()
    assert f'sandbox_image = "{node_image.PAUSE_REFERENCE}"' in config
    assert "SystemdCgroup = true" in config
    for tar_name, reference in (
        ("pause.tar", node_image.PAUSE_REFERENCE),
        ("netcheck.tar", node_image.NETCHECK_REFERENCE),
    ):
        data = cat(image, f"usr/lib/gpufleet/{tar_name}", tmp_path)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.extractfile("index.json")
            assert member is not None
            index = json.load(member)
        names = [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]]
        assert names == [reference]
    units = cat(image, "usr/lib/systemd/system/gpufleet-pause-image.service", tmp_path).decode()
    assert "/usr/lib/gpufleet/netcheck.tar" in units


def test_the_kernel_has_its_modules(image: node_image.NodeImage, listing: set[str]) -> None:
    kernel = str(image.manifest["kernel"])
    assert f"usr/lib/modules/{kernel}/modules.dep" in listing
    assert any(p.endswith("virtio_net.ko.xz") for p in listing if kernel in p)
    assert f"boot/config-{kernel}" in listing  # kubeadm's SystemVerification reads it
