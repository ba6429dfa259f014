"""One version number: ``gpufleet.__version__`` is what the installed package, ``gpufleet
version``, the Helm chart's appVersion and the release images' tags say (decision 0183)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import tomllib
from pathlib import Path

import yaml
from typer.testing import CliRunner

import gpufleet
from gpufleet.cli.main import app
from gpufleet.local import containerfile, release

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpufleet"


def test_the_version_is_semantic_and_pyproject_reads_it_from_the_package() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?", gpufleet.__version__)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "gpufleet.__version__"}


def test_the_installed_package_and_gpufleet_version_say_it() -> None:
    installed = importlib.metadata.version("gpufleet")
    assert installed == gpufleet.__version__, (
        "the venv's metadata is older than gpufleet.__version__: "
        "pip install -e . again (scripts/bootstrap-python.sh)"
    )
    result = CliRunner().invoke(app, ["version", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["gpufleet"] == gpufleet.__version__


def test_the_charts_app_version_and_default_images_are_what_a_release_builds() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == gpufleet.__version__
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    tag = values["image"]["tag"] or chart["appVersion"]
    assert f"{values['image']['repository']}:{tag}" == release.release_reference("gpufleet")
    slurm = values["slurmImage"]
    assert f"{slurm['repository']}:{slurm['tag']}" == release.release_reference("slurm")


def test_the_containerfiles_default_bases_are_this_releases_images() -> None:
    for name, arg in release.BASE_ARG.items():
        (declared,) = [a for a in release.load(name).global_args if a.name == arg]
        assert declared.default == release.release_reference(release.BASE_OF[name]), name
    for name in ("gpufleet", "gpufleet-gpu"):
        declared = {
            i.name: i.default
            for i in release.load(name).instructions
            if isinstance(i, containerfile.Arg)
        }
        assert declared.get("VERSION", gpufleet.__version__) == gpufleet.__version__, name


def test_the_release_build_tags_each_image_with_the_charts_names() -> None:
    commands = release.build_commands(
        release.IMAGES, platforms="linux/amd64,linux/arm64", push=True
    )
    tags = [cmd[cmd.index("-t") + 1] for cmd in commands]
    assert tags == [release.release_reference(name) for name in release.IMAGES]
    assert tags[1] == f"ghcr.io/gpufleet/gpufleet:{gpufleet.__version__}"
    for cmd, name in zip(commands, release.IMAGES, strict=True):
        assert cmd[:3] == ["docker", "buildx", "build"] and cmd[-2:] == ["--push", "."]
        assert cmd[cmd.index("-f") + 1] == f"images/{name}/Containerfile"
        assert f"VERSION={gpufleet.__version__}" in cmd
    assert "SLURM_IMAGE=ghcr.io/gpufleet/slurm:24.11.5" in commands[1]
