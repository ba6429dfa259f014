"""The image seed disk, end to end on the host: built by the node image's containerd,
mounted read-only as a machine mounts it, spread into a fresh containerd root by the node
image's own boot script, and then a real pull from the local registry.

What must hold (decision 0137): containerd starts knowing the seeded image; a pull of the
full image fetches only the layer the seed lacks (the registry's log says which blobs were
asked for); a container's root filesystem built on the seeded layers has their files and
honours their whiteouts; what a container writes never reaches the seed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.local import binaries, image_seed, images, node_image, processes, registry

pytestmark = pytest.mark.integration

SCRIPT = "scripts/node-image/files/usr/lib/gpufleet/containerd-root"
APP = "seedtest.local/app:1"


def _layer(tree: Path, blobs: Path) -> tuple[str, int]:
    tmp = blobs / "layer.tmp"
    digest, size = images.write_layer(tree, tmp, overlay_upper=True)
    tmp.rename(blobs / digest.removeprefix("sha256:"))
    return digest, size


def _source_layout(tmp: Path) -> tuple[Path, list[tuple[str, int]]]:
    """Three layers: a base, one that deletes a base file (an overlay whiteout), an app."""
    blobs = tmp / "source" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    base, middle, app = tmp / "base", tmp / "middle", tmp / "app"
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "base.txt").write_text("from the base layer\n")
    (base / "etc" / "gone.txt").write_text("deleted by the middle layer\n")
    (middle / "etc").mkdir(parents=True)
    (middle / "etc" / "middle.txt").write_text("from the middle layer\n")
    os.mknod(middle / "etc" / "gone.txt", 0o600 | 0o020000, os.makedev(0, 0))
    app.mkdir()
    (app / "app.txt").write_text("from the app layer\n")
    layers = [_layer(tree, blobs) for tree in (base, middle, app)]
    layout = tmp / "layout"
    image_seed.write_layout(
        [image_seed.SeedImage(APP, tuple(layers), {"Cmd": ["/bin/true"]})], tmp / "source", layout
    )
    return layout, layers


@contextlib.contextmanager
def _mounted_ro(disk: Path, where: Path) -> Iterator[Path]:
    where.mkdir()
    proc = subprocess.run(
        ["mount", "-o", "ro,loop,noload", str(disk), str(where)], capture_output=True, text=True
    )
    assert proc.returncode == 0, f"cannot loop-mount the seed disk: {proc.stderr}"
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


@pytest.fixture(scope="module")
def node() -> node_image.NodeImage:
    return node_image.require()  # built by scripts/bootstrap-system.sh; fails saying how


def test_a_pull_fetches_only_what_the_seed_lacks(
    node: node_image.NodeImage, tmp_path: Path
) -> None:
    layout, layers = _source_layout(tmp_path)
    lines: list[str] = []
    seed = image_seed.build(
        layout, node.directory, trimmed={APP}, root=tmp_path / "cache", progress=lines.append
    )
    assert seed.built and len(seed.images) == 1
    base_ref = seed.images[0]
    assert base_ref.startswith("seedtest.local/app-base:")
    again = image_seed.build(layout, node.directory, trimmed={APP}, root=tmp_path / "cache")
    assert not again.built and again.disk == seed.disk  # cached by its layers

    repo = binaries.repo_root()
    assert repo is not None
    run = tmp_path / "run"
    (run / "root").mkdir(parents=True)
    (run / "logs").mkdir()
    port = processes.free_ports(1)[0]
    with contextlib.ExitStack() as stack:
        mnt = stack.enter_context(_mounted_ro(seed.disk, tmp_path / "seed"))
        out = subprocess.run(
            [str(repo / SCRIPT), str(mnt), str(run / "root")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "seeded" in out
        served = registry.process(run, port, layout)
        served.start()
        stack.callback(served.stop)
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the registry did not start"
            time.sleep(0.2)
        containerd, ctr_bin = image_seed.extract_containerd(node.rootfs, tmp_path / "bin")
        ctr = stack.enter_context(image_seed.running_containerd(containerd, ctr_bin, run))

        def ctr_out(*args: str) -> str:
            return subprocess.run(
                [*ctr, *args], capture_output=True, text=True, check=True, timeout=120
            ).stdout

        assert base_ref in ctr_out("images", "ls", "-q").split()  # known from the start
        ctr_out("images", "pull", "--plain-http", f"127.0.0.1:{port}/app:1")

        asked = (run / "logs" / "registry.log").read_text()
        base, middle, app = (digest for digest, _ in layers)
        assert f"/blobs/{app} " in asked, asked
        assert f"/blobs/{base} " not in asked and f"/blobs/{middle} " not in asked, asked

        # The container's root: a new snapshot on the pulled image's chain.
        image_top = _chain_id([digest for digest, _ in layers])
        ctr_out("snapshots", "prepare", "c1", image_top)
        rootfs = tmp_path / "rootfs"
        rootfs.mkdir()
        mount = ctr_out("snapshots", "mounts", str(rootfs), "c1").strip()
        subprocess.run(mount, shell=True, check=True)
        stack.callback(subprocess.run, ["umount", str(rootfs)], check=False)
        assert (rootfs / "etc" / "base.txt").read_text() == "from the base layer\n"
        assert (rootfs / "etc" / "middle.txt").exists()
        assert (rootfs / "app.txt").exists()
        assert not (rootfs / "etc" / "gone.txt").exists()  # the whiteout, read from the seed
        (rootfs / "etc" / "base.txt").write_text("changed in the container\n")
        seeded = list(mnt.rglob("base.txt"))
        assert seeded and all(p.read_text() == "from the base layer\n" for p in seeded)


def _chain_id(diff_ids: list[str]) -> str:
    """The OCI chain ID of layers ``diff_ids`` (bottom first): containerd's snapshot name."""
    chain = diff_ids[0]
    for diff in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff}".encode()).hexdigest()
    return chain
