"""The local registry serves image layouts over the registry pull API, the way a node's
containerd asks for them (tag -> manifest, digest -> blob), and nothing else."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.local import images, oci, registry

LAYER = b"pretend layer tar" * 100


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    blobs = tmp_path / "layout" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    digest = "sha256:" + hashlib.sha256(LAYER).hexdigest()
    (blobs / digest[7:]).write_bytes(LAYER)
    image = oci.image_blobs({"Cmd": ["/bin/sh"]}, [(digest, len(LAYER))])
    for blob in image.blobs:
        (blobs / blob.digest[7:]).write_bytes(blob.data)
    index = {
        "schemaVersion": 2,
        "mediaType": oci.INDEX_TYPE,
        "manifests": [oci.index_entry(image.manifest, "gpufleet.local/slurm:24.11-abc")],
    }
    (tmp_path / "layout" / "index.json").write_bytes(oci.dumps(index))
    return tmp_path / "layout"


@pytest.fixture
def url(layout: Path) -> Iterator[str]:
    srv = registry.server([layout], "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_pull_walks_from_tag_to_layer(url: str, layout: Path) -> None:
    with httpx.Client(base_url=url, timeout=5) as http:
        assert http.get("/v2/").status_code == 200
        head = http.head("/v2/slurm/manifests/24.11-abc")
        assert head.status_code == 200
        digest = head.headers["docker-content-digest"]
        assert images.layout_images(layout) == {"gpufleet.local/slurm:24.11-abc": digest}
        manifest = http.get(f"/v2/slurm/manifests/{digest}")
        assert manifest.headers["content-type"] == oci.MANIFEST_TYPE
        assert "sha256:" + hashlib.sha256(manifest.content).hexdigest() == digest
        body = json.loads(manifest.content)
        config = http.get(f"/v2/slurm/blobs/{body['config']['digest']}").json()
        assert config["config"]["Cmd"] == ["/bin/sh"]
        layer = http.get(f"/v2/slurm/blobs/{body['layers'][0]['digest']}")
        assert layer.content == LAYER


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/v2/slurm/manifests/22.05", "MANIFEST_UNKNOWN"),
        ("/v2/gpufleet/manifests/24.11-abc", "MANIFEST_UNKNOWN"),
        ("/v2/slurm/blobs/sha256:" + "0" * 64, "BLOB_UNKNOWN"),
        ("/v2/slurm/blobs/sha256:../../index.json", "BLOB_UNKNOWN"),
        ("/v2/../etc/manifests/x", "NAME_UNKNOWN"),
    ],
)
def test_what_is_not_there_is_a_registry_404(url: str, path: str, code: str) -> None:
    r = httpx.get(url + path, timeout=5)
    assert r.status_code == 404
    assert r.json()["errors"][0]["code"] == code


def test_nothing_can_be_pushed(url: str) -> None:
    r = httpx.post(f"{url}/v2/slurm/blobs/uploads/", timeout=5)
    assert r.status_code == 501


def test_main_refuses_a_directory_that_is_no_layout(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        registry.main(["--port", "1", str(tmp_path)])
    assert exc.value.code == 2
