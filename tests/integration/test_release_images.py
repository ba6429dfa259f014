"""The release images built by a standard container tool: ``scripts/release/build-images
--engine buildah --base-from-local`` builds the Slurm and gpufleet images from their
Containerfiles with buildah, on this machine with no registry (the Debian base is the local
build's debootstrap imported under its Debian name, pip installs the wheels the local build
downloaded), and the images are what the chart runs: the gpufleet image's ENTRYPOINT says this
checkout's version and knows every command the chart gives it, the Slurm image's slurmctld is
the version its tag names, and each image config is the one the local build's parser reads
from the same file (decision 0180). Decisions 0230, 0231.

buildah's storage is the cache's (``~/.cache/gpufleet/engine/buildah-<version>``): a cold one
builds everything (about 3 minutes: the debootstrap, apt, pip), a warm one the wheel's two
layers (about 15 s; docs/install.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpufleet
from gpufleet.local import engine, release

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
CHART_COMMANDS = (["agent"], ["controller"], ["syncer", "run"], ["slurm", "operator"])
"""The first arguments the chart gives the gpufleet image (deploy/helm/gpufleet/templates:
agent.yaml, controller.yaml, syncer.yaml's syncer and operator containers)."""


@pytest.fixture(scope="module")
def buildah() -> Iterator[engine.Engine]:
    """The two images built in the cache's storage; no container of it left after."""
    done = subprocess.run(
        [ROOT / "scripts" / "release" / "build-images", "--engine", "buildah",
         "--base-from-local", "--only", "slurm", "--only", "gpufleet"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    found = engine.Engine("buildah")
    built = engine.Engine("buildah", engine.cache_storage("buildah", found.require()))
    assert f"images in {built.storage}" in done.stdout
    yield built
    left = subprocess.run(
        built.command("containers", "--quiet"), capture_output=True, text=True, check=True
    )
    assert left.stdout.strip() == "", "working containers left in the storage"


def test_the_gpufleet_entrypoint_runs_this_version_and_the_charts_commands(
    buildah: engine.Engine,
) -> None:
    reference = release.release_reference("gpufleet")
    version = engine.run_entrypoint(buildah, reference, ["--version"])
    assert (version.returncode, version.stdout.strip()) == (0, f"gpufleet {gpufleet.__version__}")
    for command in CHART_COMMANDS:
        shown = engine.run_entrypoint(buildah, reference, [*command, "--help"])
        assert shown.returncode == 0, (command, shown.stderr[-1500:])
        assert f"Usage: gpufleet {' '.join(command)}" in shown.stdout, command


def test_the_slurm_image_runs_the_slurm_its_tag_names(buildah: engine.Engine) -> None:
    tag = release.release_tag("slurm")
    shown = engine.run_entrypoint(buildah, release.release_reference("slurm"), ["slurmctld", "-V"])
    assert (shown.returncode, shown.stdout.strip()) == (0, f"slurm-wlm {tag}"), shown.stderr


@pytest.mark.parametrize("name", ["slurm", "gpufleet"])
def test_the_image_config_is_what_the_local_build_reads_from_the_same_file(
    buildah: engine.Engine, name: str
) -> None:
    built = engine.image_config(buildah, release.release_reference(name))
    assert engine.config_differences(built, release.plan(name).config) == []
    assert dict(built["Labels"])[engine.IDENTITY_LABEL]  # type: ignore[call-overload]


def test_the_build_mounts_leave_nothing_in_the_image(buildah: engine.Engine) -> None:
    """The wheels' mount point (/mnt, empty in Debian's images) and pip's build args are
    gone: nothing of the offline build is in what would ship."""
    reference = release.release_reference("gpufleet")
    with engine.working_container(buildah, reference) as name:
        listed = subprocess.run(
            buildah.command("run", "--network", "none", name, "--", "/bin/sh", "-c",
                            "ls -A /mnt; ls /build /etc/pip.conf 2>/dev/null; env"),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    assert "PIP_" not in listed.stdout
    assert [line for line in listed.stdout.splitlines() if "=" not in line] == []
