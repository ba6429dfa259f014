"""``gpufleet local image show``: this checkout's cache entry, or exit 1 saying how to build it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.local import node_image

runner = CliRunner()


def _fake(staging: Path, inputs: node_image.Inputs, progress: node_image.Progress) -> dict:
    for name in node_image.IMAGE_FILES:
        (staging / name).write_bytes(b"x" * 3 * 2**20)
    return {"kernel": "6.12.117+deb13-amd64", "versions": {"containerd": "1.7.24"}}


def test_no_image_is_exit_1_with_the_key_and_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_CACHE", str(tmp_path))
    r = runner.invoke(app, ["local", "image", "show"])
    assert r.exit_code == 1
    assert node_image.Inputs.of_checkout().key() in r.output
    assert "gpufleet local image build" in r.output


@pytest.mark.parametrize("args", [["-o", "json"], ["--json"]])
def test_the_entry_of_this_checkout_is_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setenv("GPUFLEET_CACHE", str(tmp_path))
    built = node_image.build(builder=_fake, progress=lambda _: None).image
    assert built.directory.parent == tmp_path / "node-image"
    table = runner.invoke(app, ["local", "image", "show"])
    assert table.exit_code == 0, table.output
    assert built.key in table.output and "rootfs.squashfs" in table.output
    assert "3.0 MiB" in table.output
    doc = json.loads(runner.invoke(app, ["local", "image", "show", *args]).stdout)
    assert doc["key"] == built.key and doc["directory"] == str(built.directory)
    assert doc["files"]["vmlinuz"]["bytes"] == 3 * 2**20
