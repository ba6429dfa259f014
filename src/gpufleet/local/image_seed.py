"""The image seed disk: image layers a machine of the local cluster boots with.

A machine pulling the gpufleet image unpacks about 400 MB of files under software
emulation, 7 to 10 minutes per machine and again after every reimage, which is most
of what the end-to-end tests wait for. A fleet solves the same problem by shipping
the heavy, slow-changing layers with the node (images pre-pulled into the node image
or onto its local disk) and pulling the rest from its registry. Here that is a disk:

    ~/.cache/gpufleet/images/seed/<key>/{seed.ext4, seed.json}

an ext4 filesystem (label :data:`LABEL`) holding a containerd root in which the
node image's own containerd unpacked the seeded images. Every machine attaches it
read-only; at boot ``usr/lib/gpufleet/containerd-root`` in the node image copies
its metadata into containerd's tmpfs and links the unpacked layers, so containerd
starts knowing those images (decision 0137). The seeded images are the Slurm and
CoreDNS images as built and the gpufleet image without its top layer (the project's
wheel, which changes with every commit): a pull of the gpufleet image then fetches
and unpacks only that layer from the local registry, the path an operator's nodes
take, and the seed's key, which covers only the layers it holds, survives code changes.

The machine stays stateless: nothing reaches the disk, each boot starts from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.local import images as oci_images
from gpufleet.local import node_image, processes

LABEL = "gpufleet-seed"
"""The seed filesystem's label: the node image's boot script looks for it."""
DISK = "seed.ext4"
META = "seed.json"
KEY_SCHEMA = 1
KEEP = 2
"""Seeds kept in the cache (about 1 GB each): the current and the one before."""
CONTAINERD_PACKAGE = "containerd"
START_TIMEOUT_S = 30.0
IMPORT_TIMEOUT_S = 600.0

Progress = Callable[[str], None]


class SeedError(RuntimeError):
    """The seed cannot be built; the message says why."""


@dataclass(frozen=True)
class SeedImage:
    """One image as it goes on the seed: its layers (digest, size; bottom first) and config."""

    reference: str
    layers: tuple[tuple[str, int], ...]
    config: dict[str, Any]
    """The image config's ``config`` object (entrypoint, env...)."""


@dataclass(frozen=True)
class Seed:
    """A seed disk in the cache."""

    disk: Path
    key: str
    images: tuple[str, ...]
    built: bool


def cache_root() -> Path:
    """``$GPUFLEET_CACHE/images/seed``."""
    return node_image.cache_root().with_name("images") / "seed"


def _blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def plan(layout: Path, trimmed: Collection[str], trim: int = 1) -> list[SeedImage]:
    """The images of OCI layout ``layout`` as the seed holds them: each image whose
    reference is in ``trimmed`` without its ``trim`` top layers (those that change with
    the code) and named ``<repository>-base:<tag>`` (the tag a hash of its layers), every
    other image whole."""
    out: list[SeedImage] = []
    for reference, digest in oci_images.layout_images(layout).items():
        manifest = json.loads(_blob(layout, digest))
        image_config = json.loads(_blob(layout, manifest["config"]["digest"]))
        layers = tuple((str(d["digest"]), int(d["size"])) for d in manifest["layers"])
        if reference in trimmed:
            layers = layers[: len(layers) - trim]
            if not layers:
                continue
            tag = hashlib.sha256(json.dumps(layers).encode()).hexdigest()[:12]
            reference = f"{reference.rsplit(':', 1)[0]}-base:{tag}"
        out.append(SeedImage(reference, layers, dict(image_config.get("config") or {})))
    return sorted(out, key=lambda image: image.reference)


def containerd_version(node: Path) -> str:
    """The version of the node image's containerd package (its ``packages.tsv``)."""
    try:
        for line in (node / "packages.tsv").read_text().splitlines():
            name, _, version = line.partition("\t")
            if name == CONTAINERD_PACKAGE:
                return version
    except OSError as exc:
        raise SeedError(f"node image {node}: cannot read packages.tsv ({exc})") from exc
    raise SeedError(f"node image {node}: no {CONTAINERD_PACKAGE} in packages.tsv")


def key_of(images: list[SeedImage], containerd: str) -> str:
    """The seed's cache key: its images' names and layers, and the containerd that
    unpacked them (the metadata format is containerd's)."""
    inputs = {
        "schema": KEY_SCHEMA,
        "containerd": containerd,
        "images": [[i.reference, [d for d, _ in i.layers]] for i in images],
    }
    return "seed-" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def find(key: str, root: Path | None = None) -> Seed | None:
    """The cached seed ``key``, complete (its disk has the size its record says), or None."""
    directory = (root or cache_root()) / key
    try:
        meta = json.loads((directory / META).read_text())
        if (directory / DISK).stat().st_size != int(meta["bytes"]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Seed(directory / DISK, key, tuple(meta["images"]), built=False)


def build(
    layout: Path,
    node: Path,
    *,
    trimmed: Collection[str] = (),
    trim: int = 1,
    progress: Progress = print,
    root: Path | None = None,
) -> Seed:
    """The seed disk of ``layout``'s images for machines booting node image ``node``,
    from the cache or built (about a minute: containerd unpacks, ``mkfs.ext4 -d``)."""
    start = time.monotonic()
    images = plan(layout, trimmed, trim)
    if not images:
        raise SeedError(f"{layout}: no image to seed")
    containerd = containerd_version(node)
    key = key_of(images, containerd)
    root = root or cache_root()
    if (found := find(key, root)) is not None:
        return found
    _check_host()
    with node_image.build_lock(root, progress, what="image seed"):
        if (found := find(key, root)) is not None:
            return found
        staging = node_image.fresh_staging(root, key, progress)
        try:
            progress(f"image seed {key}: {', '.join(i.reference for i in images)}")
            tree = _unpack(images, layout, node / "rootfs.squashfs", staging, progress)
            size = _make_disk(tree, staging / DISK)
            for scratch in (tree, staging / "bin", staging / "opt"):
                shutil.rmtree(scratch, ignore_errors=True)
            (staging / "containerd.toml").unlink(missing_ok=True)
            meta = {
                "key": key,
                "images": [i.reference for i in images],
                "containerd": containerd,
                "bytes": size,
                "seconds": round(time.monotonic() - start, 1),
            }
            (staging / META).write_text(json.dumps(meta, indent=2))
            node_image.publish(staging, root / key)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        node_image.prune(root, KEEP, key)
    seed = find(key, root)
    assert seed is not None
    progress(f"image seed {key}: {size // 2**20} MiB in {time.monotonic() - start:.0f} s")
    return Seed(seed.disk, key, seed.images, built=True)


def _check_host() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("needs root (containerd mounts overlays to unpack layers)")
    for tool, package in (("unsquashfs", "squashfs-tools"), ("mkfs.ext4", "e2fsprogs")):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is missing: apt-get install {package}")
    if problems:
        raise SeedError("cannot build the image seed:\n  " + "\n  ".join(problems))


def write_layout(images: list[SeedImage], source: Path, out: Path) -> None:
    """An OCI image layout at ``out`` naming ``images``; layer blobs hard-linked from
    layout ``source``, configs and manifests written anew."""
    oci_images.write_layout(
        out,
        [(i.reference, i.layers, i.config) for i in images],
        lambda digest: source / "blobs" / "sha256" / digest.removeprefix("sha256:"),
    )


def containerd_config(staging: Path, state: Path) -> str:
    """A containerd that only stores and unpacks: no CRI, its root under ``staging``, its
    sockets in ``state``."""
    return "\n".join(
        [
            "version = 2",
            f'root = "{staging / "root"}"',
            f'state = "{state}"',
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
            "[grpc]",
            f'  address = "{state / "containerd.sock"}"',
            '[plugins."io.containerd.internal.v1.opt"]',
            f'  path = "{staging / "opt"}"',
            "",
        ]
    )


def extract_containerd(rootfs: Path, dest: Path) -> tuple[Path, Path]:
    """containerd and ctr copied out of a node image's root filesystem (the seed's metadata
    must be what the machines' containerd reads)."""
    _run(
        ["unsquashfs", "-q", "-n", "-d", str(dest), str(rootfs),
         "usr/bin/containerd", "usr/bin/ctr"],
        "extracting containerd from the node image",
    )  # fmt: skip
    return dest / "usr/bin/containerd", dest / "usr/bin/ctr"


@contextlib.contextmanager
def running_containerd(containerd: Path, ctr: Path, staging: Path) -> Iterator[list[str]]:
    """A containerd whose root is ``<staging>/root`` while the block runs; yields the
    ``ctr`` command line (namespace ``k8s.io``, the kubelet's) that talks to it."""
    # Its sockets in a short directory of their own: a unix socket path is at most 104
    # bytes, which a cache under a long home directory would pass.
    state = Path(tempfile.mkdtemp(prefix="gpufleet-containerd-"))
    config = staging / "containerd.toml"
    config.write_text(containerd_config(staging, state))
    sock = state / "containerd.sock"
    log = staging / "containerd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(containerd), "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SeedError(f"containerd did not start:\n{_tail(log)}")
            time.sleep(0.1)
        yield [str(ctr), "--address", str(sock), "--namespace", "k8s.io"]
    finally:
        processes.end(proc, 20)
        shutil.rmtree(state, ignore_errors=True)


def _unpack(
    images: list[SeedImage], layout: Path, rootfs: Path, staging: Path, progress: Progress
) -> Path:
    """Unpack ``images`` with the node image's containerd into ``<staging>/root``."""
    containerd, ctr = extract_containerd(rootfs, staging / "bin")
    write_layout(images, layout, staging / "layout")
    with running_containerd(containerd, ctr, staging) as ctr_cmd:
        progress("image seed: containerd unpacks the layers")
        tar = subprocess.Popen(
            ["tar", "-C", str(staging / "layout"), "-c", "."], stdout=subprocess.PIPE
        )
        try:
            _run([*ctr_cmd, "images", "import", "-"], "ctr images import", stdin=tar.stdout)
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait(IMPORT_TIMEOUT_S)
        listed = subprocess.run(
            [*ctr_cmd, "images", "ls", "-q"], capture_output=True, text=True, timeout=60
        ).stdout.split()
        missing = [i.reference for i in images if i.reference not in listed]
        if missing:
            log = _tail(staging / "containerd.log")
            raise SeedError(f"containerd did not import {', '.join(missing)}:\n{log}")
    shutil.rmtree(staging / "layout")
    return staging / "root"


def _make_disk(tree: Path, disk: Path) -> int:
    """An ext4 image of ``tree`` at ``disk`` (no journal: it is only ever read); its size."""
    used = 0
    entries = 0
    for directory, dirs, files in os.walk(tree):
        for name in dirs + files:
            entries += 1
            used += os.lstat(os.path.join(directory, name)).st_blocks * 512
    mib = (used * 5 // 4 + entries * 4096) // 2**20 + 64
    _run(
        ["mkfs.ext4", "-q", "-F", "-L", LABEL, "-O", "^has_journal", "-E", "root_owner=0:0",
         "-d", str(tree), str(disk), f"{mib}M"],
        "mkfs.ext4 of the image seed",
    )  # fmt: skip
    return disk.stat().st_size


def _run(cmd: list[str], what: str, **kw: Any) -> None:
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=IMPORT_TIMEOUT_S, **kw
    )
    if proc.returncode != 0:
        out = proc.stdout.decode(errors="replace")[-2000:]
        raise SeedError(f"{what} failed (exit {proc.returncode}):\n{out}")


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
