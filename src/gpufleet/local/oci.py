"""OCI images: single-binary ones as an image-layout tar that ``ctr images import`` reads,
and the blobs of the gpufleet and Slurm images (:mod:`gpufleet.local.images`).

No registry is reachable from the machines of the local cluster, so the node
image carries the one image every pod needs, the sandbox ("pause") image,
built here from ``scripts/node-image/pause`` and packed by this module:
one uncompressed layer holding the binary, a config whose entrypoint is that
binary, a manifest and an index naming the image for containerd. The tar is
byte-for-byte reproducible (fixed times, owners and order), so its digest only
changes when the binary does.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def dumps(obj: object) -> bytes:
    """Canonical JSON (sorted keys, no spaces): the same object always has the same digest."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ImageBlobs:
    """An image's config and manifest blobs (its layers are stored apart)."""

    config: Blob
    manifest: Blob

    @property
    def blobs(self) -> tuple[Blob, Blob]:
        return (self.config, self.manifest)


def image_blobs(config: dict[str, object], layers: list[tuple[str, int]]) -> ImageBlobs:
    """Config and manifest of a linux/amd64 image of uncompressed ``layers`` ((digest, size),
    bottom first): an uncompressed layer's diff ID is its digest."""
    config_blob = Blob(
        CONFIG_TYPE,
        dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": config,
                "rootfs": {"type": "layers", "diff_ids": [digest for digest, _ in layers]},
            }
        ),
    )
    manifest = Blob(
        MANIFEST_TYPE,
        dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_TYPE,
                "config": config_blob.descriptor(),
                "layers": [
                    {"mediaType": LAYER_TYPE, "digest": digest, "size": size}
                    for digest, size in layers
                ],
            }
        ),
    )
    return ImageBlobs(config_blob, manifest)


def _check_reference(reference: str) -> None:
    if ":" not in reference.rsplit("/", 1)[-1]:
        raise ValueError(f"reference needs a tag (name:tag), got {reference!r}")


def index_entry(manifest: Blob, reference: str) -> dict[str, object]:
    """The image index's entry naming ``manifest`` as ``reference`` (containerd's and OCI's
    annotations)."""
    _check_reference(reference)
    return {
        **manifest.descriptor(),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {
            "io.containerd.image.name": reference,
            "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
        },
    }


def single_binary_image(binary: bytes, *, path: str, reference: str) -> bytes:
    """An OCI image-layout tar of one static binary at ``/<path>``, named ``reference``.

    ``reference`` is the full name containerd gives the image on import
    (``io.containerd.image.name``), e.g. ``gpufleet.local/pause:1.0``.
    """
    if "/" in path or not path:
        raise ValueError(f"path must be a file name in /, got {path!r}")
    _check_reference(reference)
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, path, binary, mode=0o755)
    layer = Blob(LAYER_TYPE, layer_buf.getvalue())
    image = image_blobs(
        {"Entrypoint": [f"/{path}"], "User": "65535:65535"}, [(layer.digest, len(layer.data))]
    )
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [index_entry(image.manifest, reference)],
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, "oci-layout", dumps({"imageLayoutVersion": "1.0.0"}))
        _tar_member(tar, "index.json", dumps(index))
        for blob in (image.config, layer, image.manifest):
            _tar_member(tar, f"blobs/sha256/{blob.digest.removeprefix('sha256:')}", blob.data)
    return out.getvalue()


def write_single_binary_image(binary: Path, out: Path, *, reference: str) -> str:
    """Write the image tar of ``binary`` (as ``/<its name>``) to ``out``; returns its sha256."""
    data = single_binary_image(binary.read_bytes(), path=binary.name, reference=reference)
    out.write_bytes(data)
    return hashlib.sha256(data).hexdigest()
