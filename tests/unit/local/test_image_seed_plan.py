"""What goes on the image seed disk and when it is rebuilt (gpufleet.local.image_seed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpufleet.local import image_seed


def _layout(tmp: Path, app_layer: bytes) -> Path:
    source = tmp / "source"
    blobs = source / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    layers = []
    for data in (b"slurm layer", b"python layer", app_layer):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        layers.append((f"sha256:{digest}", len(data)))
    out = tmp / f"layout-{hashlib.sha256(app_layer).hexdigest()[:6]}"
    image_seed.write_layout(
        [
            image_seed.SeedImage(
                "gpufleet.local/slurm:24.11-a", tuple(layers[:1]), {"Cmd": ["sh"]}
            ),
            image_seed.SeedImage("gpufleet.local/gpufleet:0.1-b", tuple(layers), {"Cmd": ["x"]}),
        ],
        source,
        out,
    )
    return out


def test_a_trimmed_image_is_seeded_without_its_top_layer_under_a_base_name(
    tmp_path: Path,
) -> None:
    layout = _layout(tmp_path, b"app layer one")
    planned = {i.reference: i for i in image_seed.plan(layout, {"gpufleet.local/gpufleet:0.1-b"})}
    assert "gpufleet.local/slurm:24.11-a" in planned
    base = next(ref for ref in planned if ref.startswith("gpufleet.local/gpufleet-base:"))
    assert [d for d, _ in planned[base].layers] == [
        "sha256:" + hashlib.sha256(data).hexdigest() for data in (b"slurm layer", b"python layer")
    ]
    assert planned[base].config == {"Cmd": ["x"]}
    whole = image_seed.plan(layout, ())
    assert {i.reference for i in whole} == {
        "gpufleet.local/slurm:24.11-a",
        "gpufleet.local/gpufleet:0.1-b",
    }


def test_the_key_survives_a_code_change_but_not_a_containerd_or_layer_change(
    tmp_path: Path,
) -> None:
    trimmed = {"gpufleet.local/gpufleet:0.1-b"}
    layout_one = _layout(tmp_path, b"app layer one")
    one = image_seed.plan(layout_one, trimmed)
    two = image_seed.plan(_layout(tmp_path, b"app layer two"), trimmed)
    assert image_seed.key_of(one, "1.7.24") == image_seed.key_of(two, "1.7.24")
    assert image_seed.key_of(one, "1.7.24") != image_seed.key_of(one, "2.0.0")
    untrimmed = image_seed.plan(layout_one, ())
    assert image_seed.key_of(untrimmed, "1.7.24") != image_seed.key_of(one, "1.7.24")


def test_the_containerd_version_comes_from_the_node_images_package_list(tmp_path: Path) -> None:
    (tmp_path / "packages.tsv").write_text("bash\t5.2\ncontainerd\t1.7.24~ds1-6\nrunc\t1.1\n")
    assert image_seed.containerd_version(tmp_path) == "1.7.24~ds1-6"
    (tmp_path / "packages.tsv").write_text("bash\t5.2\n")
    with pytest.raises(image_seed.SeedError, match="no containerd"):
        image_seed.containerd_version(tmp_path)


def test_a_seed_whose_disk_is_not_the_size_recorded_is_not_found(tmp_path: Path) -> None:
    entry = tmp_path / "seed-abc"
    entry.mkdir()
    (entry / image_seed.DISK).write_bytes(b"x" * 10)
    (entry / image_seed.META).write_text('{"key": "seed-abc", "images": ["a:1"], "bytes": 10}')
    assert image_seed.find("seed-abc", tmp_path) is not None
    (entry / image_seed.DISK).write_bytes(b"x" * 5)  # a copy cut short
    assert image_seed.find("seed-abc", tmp_path) is None
