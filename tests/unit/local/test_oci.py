"""The pause image tar that the node image imports into containerd."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from gpufleet.local import oci

BINARY = b"\x7fELF pretend static binary"


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            assert f is not None
            out[m.name] = f.read()
        return out


def test_an_image_layout_whose_digests_hold() -> None:
    data = oci.single_binary_image(BINARY, path="pause", reference="gpufleet.local/pause:1.0")
    files = _members(data)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "gpufleet.local/pause:1.0"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1.0"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"])
    assert entry["size"] == len(files[f"blobs/sha256/{entry['digest'][7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["config"]["Entrypoint"] == ["/pause"]
    (layer,) = manifest["layers"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    layer_files = _members(files[f"blobs/sha256/{layer['digest'][7:]}"])
    assert layer_files == {"pause": BINARY}


def test_the_tar_is_reproducible_and_follows_the_binary() -> None:
    a = oci.single_binary_image(BINARY, path="pause", reference="x.local/pause:1")
    assert a == oci.single_binary_image(BINARY, path="pause", reference="x.local/pause:1")
    assert a != oci.single_binary_image(BINARY + b"!", path="pause", reference="x.local/pause:1")


@pytest.mark.parametrize(
    ("path", "reference"), [("bin/pause", "x/pause:1"), ("", "x/pause:1"), ("pause", "x/pause")]
)
def test_bad_names_are_refused(path: str, reference: str) -> None:
    with pytest.raises(ValueError):
        oci.single_binary_image(BINARY, path=path, reference=reference)
