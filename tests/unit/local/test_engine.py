"""One build command line per image for each engine (docker buildx, buildah, podman), the
``--base-from-local`` build's extra arguments and refusals, and the comparison of a built
image's config with the parser's. The builds themselves:
tests/integration/test_release_images.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpufleet
from gpufleet.local import containerfile, engine, release

WHEELS = Path("/cache/wheels")


def _flag(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == flag]


def test_docker_builds_with_buildx_and_loads_or_pushes() -> None:
    (cmd,) = release.build_commands(["slurm"], platforms="linux/amd64", push=False)
    assert cmd[:3] == ["docker", "buildx", "build"] and cmd[-2:] == ["--load", "."]
    assert _flag(cmd, "-t") == ["ghcr.io/gpufleet/slurm:24.11.5"]


@pytest.mark.parametrize("name", ["buildah", "podman"])
def test_buildah_and_podman_build_with_layers_in_their_storage(name: str) -> None:
    builder = engine.Engine(name, Path("/cache/engine/x"))
    slurm, app = release.build_commands(
        ["slurm", "gpufleet"], builder=builder, platforms="linux/amd64"
    )
    assert slurm[:3] == [name, "--root", "/cache/engine/x"] and slurm[-1] == "."
    assert {"build", "--layers", "--force-rm"} <= set(slurm) and "--load" not in slurm
    assert _flag(app, "--build-arg") == [
        f"VERSION={gpufleet.__version__}", "SLURM_IMAGE=ghcr.io/gpufleet/slurm:24.11.5"
    ]  # fmt: skip
    assert "--pull=never" not in app and "--volume" not in app


def test_base_from_local_never_pulls_and_points_pip_at_the_wheels_only_where_declared() -> None:
    builder = engine.Engine("buildah", Path("/cache/engine/x"))
    slurm, app, gpu = release.build_commands(
        release.IMAGES, builder=builder, platforms="linux/amd64", wheels=WHEELS
    )
    for cmd in (slurm, app, gpu):
        assert "--pull=never" in cmd and _flag(cmd, "--network") == ["host"]
    assert _flag(app, "--volume") == [f"{WHEELS}:{engine.WHEELS_AT}:ro"]
    assert {"PIP_NO_INDEX=1", f"PIP_FIND_LINKS={engine.WHEELS_AT}"} <= set(
        _flag(app, "--build-arg")
    )
    # The Slurm and GPU files declare no pip args: a build arg they do not declare would
    # only be warned about, and the wheels have no torch.
    for cmd in (slurm, gpu):
        assert "--volume" not in cmd and not any("PIP_" in a for a in _flag(cmd, "--build-arg"))


def test_the_gpufleet_file_declares_the_pip_args_without_defaults() -> None:
    """Declared without a value, they reach no RUN unless given: the image's pip uses PyPI."""
    declared = {
        i.name: i.default
        for i in release.load("gpufleet").instructions
        if isinstance(i, containerfile.Arg)
    }
    assert {k: declared[k] for k in release.PIP_LOCAL_ARGS} == dict.fromkeys(release.PIP_LOCAL_ARGS)
    run = next(s for s in release.plan("gpufleet").steps if isinstance(s, containerfile.RunStep))
    assert not any(k.startswith("PIP_") for k, _ in run.env)


def test_push_is_docker_buildx_s_and_storage_buildah_s() -> None:
    with pytest.raises(engine.EngineError, match="buildah push"):
        release.build_commands(
            ["slurm"], builder=engine.Engine("buildah"), platforms="linux/amd64", push=True
        )
    with pytest.raises(engine.EngineError, match="--root"):
        engine.Engine("docker", Path("/x"))
    with pytest.raises(engine.EngineError, match="no such engine"):
        engine.Engine("kaniko")


def test_the_runroot_is_one_per_storage() -> None:
    one = engine.Engine("buildah", Path("/a")).command("images")
    two = engine.Engine("buildah", Path("/b")).command("images")
    assert _flag(one, "--runroot") != _flag(two, "--runroot")
    assert engine.Engine("buildah").command("images") == ["buildah", "images"]


def test_a_missing_engine_names_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.shutil, "which", lambda _name: None)
    with pytest.raises(engine.EngineError, match="apt-get install buildah"):
        engine.Engine("buildah").require()


def test_base_from_local_is_refused_with_docker_and_for_another_platform(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert release.main(["--base-from-local", "--dry-run"]) == 1
    assert "give --engine buildah" in capsys.readouterr().err
    argv = ["--engine", "buildah", "--base-from-local", "--dry-run", "--storage", "/x"]
    other = "linux/arm64" if release.target_arch() != "arm64" else "linux/amd64"
    assert release.main([*argv, "--platform", other]) == 1
    assert "builds linux/" in capsys.readouterr().err


def test_a_dry_run_prints_the_import_and_the_builds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--engine", "buildah", "--base-from-local", "--dry-run", "--storage", "/x"]
    assert release.main([*argv, "--only", "slurm", "--only", "gpufleet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == "+ import docker.io/library/debian:trixie-slim from the local build's debootstrap"
    )
    assert [line.split()[1:4] for line in out[1:3]] == [["buildah", "--root", "/x"]] * 2
    assert out[-1].startswith("images in /x: buildah --root /x")


def test_the_base_is_built_as_debians_official_image_is() -> None:
    assert engine.base_containerfile() == (
        "FROM scratch\nADD rootfs.tar /\n"
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        'CMD ["bash"]\n'
    )


def test_config_differences_name_each_field_but_the_engines_label() -> None:
    parsed = release.plan("gpufleet").config
    built = {**parsed.as_oci()}
    built["Labels"] = {**parsed.as_oci()["Labels"], engine.IDENTITY_LABEL: "1.28.2"}  # type: ignore[dict-item]
    assert engine.config_differences(built, parsed) == []
    built["Entrypoint"] = ["/bin/sh"]
    built["User"] = "1000"
    built["Labels"] = {engine.IDENTITY_LABEL: "1.28.2"}
    found = engine.config_differences(built, parsed)
    assert [f.split(":")[0] for f in found] == ["User", "Entrypoint", "Labels"]
