"""The local build makes each image from its Containerfile (decisions 0180, 0181): the image
config it writes is the one the file says (Env, User, WorkingDir, Entrypoint, Cmd, Labels), the
gpufleet image has a layer per COPY and RUN on the Slurm image's one, and what the steps
installed runs: the gpufleet image's entrypoint says this checkout's version, the Slurm
image's slurmctld the version its tag names.

Uses the images cache: a cold cache builds everything (minutes, once, what the machines'
tests need too); a warm one costs the wheel and a look at each layer (seconds).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import gpufleet
from gpufleet.local import images, release

pytestmark = pytest.mark.integration


def _blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def _image(layout: Path, reference: str) -> tuple[dict[str, object], list[str]]:
    """(config's ``config`` object, layer digests) of ``reference`` in ``layout``."""
    manifest = json.loads(_blob(layout, images.layout_images(layout)[reference]))
    config = json.loads(_blob(layout, manifest["config"]["digest"]))
    return config["config"], [layer["digest"] for layer in manifest["layers"]]


def _trees(digests: list[str]) -> list[Path]:
    """The cached trees the layers ``digests`` were made from, bottom first."""
    found: dict[str, Path] = {}
    for meta in (images.cache_root() / "layers").glob("*/layer.json"):
        data = json.loads(meta.read_text())
        upper = meta.parent / "upper"  # an overlay's layer; the Slurm root's is elsewhere
        found[data["digest"]] = upper if upper.is_dir() else Path(data["tree"])
    return [found[d] for d in digests]


def _run_in(trees: list[Path], tmp: Path, command: list[str]) -> str:
    """``command`` chrooted in an overlay of ``trees`` (writes go to a scratch directory)."""
    cmd = [
        str(images.scripts_dir() / "overlay-run.sh"),
        "--lower", ":".join(str(t) for t in reversed(trees)),
        "--upper", str(tmp / "upper"), "--work", str(tmp / "work"), "--", *command,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def built() -> images.ImageSet:
    return images.build(progress=lambda _line: None)


def test_each_image_has_the_config_its_containerfile_says(built: images.ImageSet) -> None:
    for name, reference in (("slurm", built.slurm), ("gpufleet", built.gpufleet)):
        config, _ = _image(built.layout, reference)
        said = release.plan(name).config.as_oci()
        for field in ("Env", "User", "WorkingDir", "Entrypoint", "Cmd", "Labels"):
            assert config.get(field) == said.get(field), f"{name}: {field}"
    gpufleet_config, _ = _image(built.layout, built.gpufleet)
    assert gpufleet_config["Entrypoint"] == ["/opt/gpufleet/bin/gpufleet"]
    labels = gpufleet_config["Labels"]
    assert isinstance(labels, dict)
    assert labels["org.opencontainers.image.version"] == gpufleet.__version__


def test_the_tags_are_the_release_tags_with_the_cache_key(built: images.ImageSet) -> None:
    assert built.gpufleet_tag.startswith(release.release_tag("gpufleet") + "-")
    assert built.slurm_tag.startswith(release.release_tag("slurm") + "-")


def test_the_steps_are_layers_on_the_slurm_image_and_what_they_installed_runs(
    built: images.ImageSet, tmp_path: Path
) -> None:
    _, slurm_layers = _image(built.layout, built.slurm)
    _, layers = _image(built.layout, built.gpufleet)
    assert len(slurm_layers) == 1 and layers[0] == slurm_layers[0]
    assert len(layers) == 1 + len(release.plan("gpufleet").steps)
    assert built.app_layers == 2, "the wheel's COPY and its RUN"

    trees = _trees(layers)
    # The RUN removed what the COPYs brought (/build); the entrypoint is this checkout's.
    version = "test ! -e /build && /opt/gpufleet/bin/gpufleet version"
    out = _run_in(trees, tmp_path / "g", ["/bin/sh", "-c", version])
    assert out.strip() == f"gpufleet {gpufleet.__version__}"
    out = _run_in(trees[:1], tmp_path / "s", ["slurmctld", "-V"])
    assert out.split()[-1] == release.release_tag("slurm")
