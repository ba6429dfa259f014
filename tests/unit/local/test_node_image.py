"""The node image cache: what its key covers, what counts as complete, how a build lands.

No real build here (that is `gpufleet local image build`, minutes as root): the
builder is a function that writes files, or fails, into the staging directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from gpufleet.local import node_image

ROOT = Path(__file__).resolve().parents[3]


def _inputs(**changes: object) -> node_image.Inputs:
    base = node_image.Inputs(
        suite="trixie",
        build_files={"build.sh": "aa", "packages.txt": "bb", "files/etc/x.conf": "cc"},
        go_binaries="k8s-v1.36.3-etcd-v3.6.16-kwok-v0.8.0-4dc25e958f0a",
        requirements=("numpy==2.4.6", "pyyaml==6.0.3"),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _fake_builder(calls: list[Path], *, fail_after: str | None = None) -> node_image.Builder:
    def build(staging: Path, inputs: node_image.Inputs, progress: node_image.Progress) -> dict:
        calls.append(staging)
        for name in node_image.IMAGE_FILES:
            (staging / name).write_bytes(name.encode() * 10)
            progress(f"wrote {name}")
            if name == fail_after:
                raise node_image.NodeImageError("disk full")
        return {"kernel": "6.12.117+deb13-amd64", "steps": [["debootstrap", 1.5]]}

    return build


def test_key_names_the_suite_and_kubernetes_and_is_stable() -> None:
    key = _inputs().key()
    assert key.startswith("trixie-k8s-v1.36.3-")
    assert key == _inputs().key()
    assert len(key.rsplit("-", 1)[1]) == 12


@pytest.mark.parametrize(
    "change",
    [
        {"suite": "forky"},
        {"build_files": {"build.sh": "aa", "packages.txt": "b2", "files/etc/x.conf": "cc"}},
        {"build_files": {"build.sh": "aa", "packages.txt": "bb"}},
        {"go_binaries": "k8s-v1.36.4-etcd-v3.6.16-kwok-v0.8.0-4dc25e958f0a"},
        {"go_binaries": "k8s-v1.36.3-etcd-v3.6.16-kwok-v0.8.0-000000000000"},
        {"requirements": ("numpy==2.4.7", "pyyaml==6.0.3")},
        {"requirements": ("numpy==2.4.6",)},
    ],
)
def test_every_input_changes_the_key(change: dict[str, object]) -> None:
    assert _inputs(**change).key() != _inputs().key()


def test_tree_digests_cover_content_and_the_executable_bit(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    script = tmp_path / "build.sh"
    script.write_text("echo hi\n")
    (tmp_path / "files" / "a.conf").write_text("x = 1\n")
    first = node_image.tree_digests(tmp_path)
    assert set(first) == {"build.sh", "files/a.conf"}
    script.chmod(0o755)
    assert node_image.tree_digests(tmp_path)["build.sh"] != first["build.sh"]
    (tmp_path / "files" / "a.conf").write_text("x = 2\n")
    assert node_image.tree_digests(tmp_path)["files/a.conf"] != first["files/a.conf"]


def test_the_checkout_key_covers_the_scripts_the_go_pins_and_the_venv() -> None:
    inputs = node_image.Inputs.of_checkout(ROOT)
    assert {"build.sh", "packages.txt", "pause/main.go"} <= set(inputs.build_files)
    assert any(f.startswith("files/") for f in inputs.build_files)
    assert inputs.go_binaries.startswith("k8s-v")
    names = {r.split("==")[0] for r in inputs.requirements}
    # The agent's runtime dependencies, pinned; not torch, matplotlib or dev tools.
    assert {"pydantic", "kr8s", "numpy", "prometheus-client", "typer"} <= names
    assert not names & {"torch", "matplotlib", "pytest", "mypy", "ruff"}
    assert all("==" in r for r in inputs.requirements)


def test_a_build_lands_complete_with_its_manifest(tmp_path: Path) -> None:
    calls: list[Path] = []
    lines: list[str] = []
    report = node_image.build(
        inputs=_inputs(), root=tmp_path / "node-image", builder=_fake_builder(calls),
        progress=lines.append,
    )  # fmt: skip
    assert report.built
    image = report.image
    assert image.directory == tmp_path / "node-image" / _inputs().key()
    manifest = json.loads((image.directory / "manifest.json").read_text())
    assert manifest["key"] == _inputs().key()
    assert manifest["inputs"]["requirements"] == ["numpy==2.4.6", "pyyaml==6.0.3"]
    assert manifest["files"]["vmlinuz"]["bytes"] == len(b"vmlinuz" * 10)
    assert manifest["kernel"] == "6.12.117+deb13-amd64"
    assert "build_seconds" in manifest and "built_at" in manifest
    assert "wrote rootfs.squashfs" in lines
    # Built outside the directory readers list, and nothing left there.
    assert calls[0].parent == tmp_path / "node-image.building"
    assert list((tmp_path / "node-image.building").iterdir()) == []
    assert node_image.find(_inputs().key(), root=tmp_path / "node-image") == image


def test_a_cached_image_is_not_built_again(tmp_path: Path) -> None:
    calls: list[Path] = []
    root = tmp_path / "node-image"
    node_image.build(inputs=_inputs(), root=root, builder=_fake_builder(calls), progress=print)
    again = node_image.build(
        inputs=_inputs(), root=root, builder=_fake_builder(calls), progress=print
    )
    assert not again.built and len(calls) == 1
    node_image.build(
        inputs=_inputs(), root=root, builder=_fake_builder(calls), progress=print, rebuild=True
    )
    assert len(calls) == 2
    other = node_image.build(
        inputs=_inputs(suite="forky"), root=root, builder=_fake_builder(calls), progress=print
    )
    assert other.built and len(calls) == 3
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(
        [_inputs().key(), _inputs(suite="forky").key()]
    )


def test_a_failed_build_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    root = tmp_path / "node-image"
    with pytest.raises(node_image.NodeImageError, match="disk full"):
        node_image.build(
            inputs=_inputs(), root=root, progress=print,
            builder=_fake_builder([], fail_after="initrd.img"),
        )  # fmt: skip
    assert not (root / _inputs().key()).exists()
    assert list((tmp_path / "node-image.building").iterdir()) == []
    assert node_image.find(_inputs().key(), root=root) is None


def test_a_builder_that_forgets_a_file_fails_the_build(tmp_path: Path) -> None:
    def partial(staging: Path, inputs: node_image.Inputs, progress: node_image.Progress) -> dict:
        (staging / "vmlinuz").write_bytes(b"k")
        return {}

    with pytest.raises(node_image.NodeImageError, match=r"no initrd\.img"):
        node_image.build(inputs=_inputs(), root=tmp_path / "ni", builder=partial, progress=print)
    assert not (tmp_path / "ni" / _inputs().key()).exists()


def test_what_a_dead_builder_left_is_removed_by_the_next_build(tmp_path: Path) -> None:
    root = tmp_path / "node-image"
    staging = tmp_path / "node-image.building"
    dead = staging / f"{_inputs().key()}-999999999"
    dead.mkdir(parents=True)
    (dead / "vmlinuz").write_bytes(b"half")
    mine = staging / f"other-{os.getpid()}"
    mine.mkdir()
    lines: list[str] = []
    node_image.build(inputs=_inputs(), root=root, builder=_fake_builder([]), progress=lines.append)
    assert not dead.exists()
    assert mine.exists()  # a live builder's directory is left alone
    assert any("interrupted build" in line for line in lines)


@pytest.mark.parametrize("damage", ["no manifest", "other key", "short file", "missing file"])
def test_find_accepts_only_a_complete_entry(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "node-image"
    image = node_image.build(
        inputs=_inputs(), root=root, builder=_fake_builder([]), progress=print
    ).image
    manifest = image.directory / "manifest.json"
    if damage == "no manifest":
        manifest.unlink()
    elif damage == "other key":
        data = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**data, "key": "trixie-k8s-v1.36.3-000000000000"}))
    elif damage == "short file":
        (image.directory / "rootfs.squashfs").write_bytes(b"trunc")
    else:
        (image.directory / "initrd.img").unlink()
    assert node_image.find(_inputs().key(), root=root) is None


def test_the_host_mirror_is_read_from_apt_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n"
    )
    one_line = tmp_path / "sources.list"
    one_line.write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert node_image.host_mirror([deb822]) == "http://mirror.example/debian"
    assert node_image.host_mirror([one_line]) == "http://other.example/debian"
    assert node_image.host_mirror([tmp_path / "absent"]) == node_image.DEFAULT_MIRROR


def test_the_cache_keeps_the_newest_entries_and_always_the_new_one(tmp_path: Path) -> None:
    root = tmp_path / "node-image"
    suites = ["a", "b", "c", "d"]
    lines: list[str] = []
    for i, suite in enumerate(suites):
        node_image.build(
            inputs=_inputs(suite=suite), root=root, builder=_fake_builder([]),
            progress=lines.append,
        )  # fmt: skip
        entry = root / _inputs(suite=suite).key()
        os.utime(entry, (1000 + i, 1000 + i))  # build order, whatever the clock's resolution
    kept = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert kept == sorted(_inputs(suite=s).key() for s in suites[-node_image.KEEP_ENTRIES :])
    assert any(_inputs(suite="a").key() in line for line in lines)
    # Built again, the pruned key is back, and the oldest other entry goes.
    again = _inputs(suite="a")
    node_image.build(inputs=again, root=root, builder=_fake_builder([]), progress=print)
    kept = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert kept == sorted(_inputs(suite=s).key() for s in ("a", "c", "d"))
