"""The local builder reads the repository's Containerfiles as a real builder does: the
instructions of the subset they use, variables where a builder substitutes them, the
image config the file ends with; anything else is refused with its file and line."""

from __future__ import annotations

import pytest

from gpufleet.local import containerfile, release
from gpufleet.local.containerfile import ContainerfileError, ImageConfig, parse


def _plan(text: str, args: dict[str, str] | None = None) -> containerfile.Plan:
    return containerfile.plan(parse(text), args or {}, lambda _base: containerfile.DEBIAN_CONFIG)


def test_continuations_join_without_the_newline_and_comments_inside_are_dropped() -> None:
    cf = parse(
        "# syntax=docker/dockerfile:1\n"
        "FROM debian:trixie-slim\n"
        "RUN apt-get install -y \\\n"
        "        munge \\\n"
        "    # a comment inside the continuation\n"
        "        slurmd\n"
    )
    (_, run) = cf.instructions
    assert isinstance(run, containerfile.Run) and run.line == 3
    assert run.command == "apt-get install -y         munge         slurmd"


def test_args_env_and_labels_are_substituted_where_a_builder_substitutes_them() -> None:
    plan = _plan(
        "ARG BASE=debian:trixie-slim\n"
        "FROM ${BASE}\n"
        "ARG VERSION=0.0.1\n"
        "ARG EMPTY\n"
        'ENV APP=/opt/app PATH=/opt/app/bin:$PATH GREETING="hello world"\n'
        "WORKDIR $APP\n"
        "WORKDIR data\n"
        "COPY dist/app-${VERSION}.whl wheels/\n"
        'RUN echo "$VERSION ${EMPTY:-none}"\n'
        'LABEL org.opencontainers.image.version="${VERSION}" title="${MISSING:-app}"\n'
        "USER 65532:65532\n"
        'ENTRYPOINT ["/opt/app/bin/app"]\n',
        {"VERSION": "1.2.3", "BASE": "debian:bookworm-slim"},
    )
    assert plan.base == "debian:bookworm-slim"
    copy, run = plan.steps
    assert copy == containerfile.CopyStep(("dist/app-1.2.3.whl",), "/opt/app/data/wheels/", 8)
    assert isinstance(run, containerfile.RunStep)
    assert run.command == 'echo "$VERSION ${EMPTY:-none}"', "RUN is left to its shell"
    env = dict(run.env)
    assert env["VERSION"] == "1.2.3" and "EMPTY" not in env
    assert env["PATH"] == f"/opt/app/bin:{containerfile.DEFAULT_PATH}"
    assert run.working_dir == "/opt/app/data"
    assert plan.config.as_oci() == {
        "Env": [
            f"PATH=/opt/app/bin:{containerfile.DEFAULT_PATH}",
            "APP=/opt/app",
            "GREETING=hello world",
        ],
        "User": "65532:65532",
        "WorkingDir": "/opt/app/data",
        "Entrypoint": ["/opt/app/bin/app"],
        "Labels": {"org.opencontainers.image.version": "1.2.3", "title": "app"},
    }


def test_an_entrypoint_drops_the_base_images_cmd_as_docker_does() -> None:
    assert containerfile.DEBIAN_CONFIG.cmd == ("bash",)
    with_entrypoint = _plan('FROM debian:trixie\nENTRYPOINT ["/app"]\n').config
    assert with_entrypoint.cmd is None and with_entrypoint.entrypoint == ("/app",)
    assert _plan('FROM debian:trixie\nCMD ["/bin/sh"]\n').config.cmd == ("/bin/sh",)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("FROM a\nHEALTHCHECK CMD true\n", "Containerfile:2: HEALTHCHECK is not supported"),
        ("FROM a AS build\n", "one stage"),
        ("FROM a\nFROM b\n", "Containerfile:2: a second FROM"),
        ("FROM --platform=linux/arm64 a\n", "FROM --platform=linux/arm64 is not supported"),
        ("FROM a\nRUN --mount=type=cache,target=/root true\n", "RUN --mount=type=cache"),
        ("FROM a\nCOPY --from=build /x /y\n", "COPY --from=build"),
        ("FROM a\nCOPY --chown=1:1 x /y\n", "COPY --chown=1:1"),
        ("FROM a\nENTRYPOINT /bin/app --flag\n", "exec form"),
        ('FROM a\nRUN ["/bin/true"]\n', "use shell form"),
        ("RUN true\nFROM a\n", "RUN before FROM"),
        ("ARG X=1\n", "no FROM"),
        ("# escape=`\nFROM a\n", "escape directive"),
        ("FROM a\nRUN true \\\n", "ends inside a continued line"),
        ("FROM a\nENV =x\n", "NAME=value"),
        ("FROM a\nWORKDIR ${X:?required}\n", "only ${NAME:-default}"),
    ],
)
def test_what_the_local_builder_does_not_read_is_refused_with_file_and_line(
    text: str, says: str
) -> None:
    with pytest.raises(ContainerfileError, match=None) as caught:
        _plan(text)
    assert says in str(caught.value)


# ------------------------------------------------------------------ the real files


def test_every_image_is_built_on_debian_or_on_another_image_of_this_release() -> None:
    ours = {release.release_reference(name) for name in release.IMAGES}
    for name in release.IMAGES:
        plan = release.plan(name)
        assert plan.steps, name
        assert plan.base.startswith(release.DEBIAN_IMAGES) or plan.base in ours, name


def test_the_slurm_image_is_debian_13_with_the_slurm_daemons() -> None:
    plan = release.plan("slurm")
    assert plan.base == "docker.io/library/debian:trixie-slim"
    (run,) = plan.steps
    assert isinstance(run, containerfile.RunStep)
    for package in ("munge", "slurmctld", "slurmd", "slurmrestd", "slurmdbd", "sackd"):
        assert f" {package} " in f" {run.command} "
    assert dict(plan.args)["SLURM_VERSION"] == release.release_tag("slurm") == "24.11.5"
    assert plan.config == ImageConfig(
        env=(("PATH", containerfile.DEFAULT_PATH),),
        working_dir="/",
        cmd=("/bin/sh",),
        labels=plan.config.labels,
    )
    assert dict(plan.config.labels)["org.opencontainers.image.version"] == "24.11.5"


def test_the_gpufleet_image_is_the_slurm_image_with_a_venv_and_the_wheel() -> None:
    plan = release.plan("gpufleet")
    assert plan.base == release.release_reference("slurm")
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds == ["CopyStep", "RunStep", "CopyStep", "RunStep"], "deps, then the app"
    wheel = release.WHEEL.format(version=release.build_args("gpufleet")["VERSION"])
    assert plan.steps[0].sources == (release.REQUIREMENTS,)  # type: ignore[union-attr]
    assert plan.steps[2].sources == (wheel,)  # type: ignore[union-attr]
    oci = plan.config.as_oci()
    assert oci["Entrypoint"] == ["/opt/gpufleet/bin/gpufleet"]
    assert oci["WorkingDir"] == "/" and "User" not in oci
    assert "PATH=/opt/gpufleet/bin:" + containerfile.DEFAULT_PATH in oci["Env"]  # type: ignore[operator]
    assert "PYTHONUNBUFFERED=1" in oci["Env"]  # type: ignore[operator]
    assert "Cmd" not in oci, "the Slurm image's CMD is dropped by the ENTRYPOINT"


def test_the_gpu_agent_image_asks_the_nvidia_runtime_for_compute_and_utility() -> None:
    plan = release.plan("gpufleet-gpu")
    assert plan.base == release.release_reference("gpufleet")
    env = dict(plan.config.env)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert plan.config.entrypoint == ("/opt/gpufleet/bin/gpufleet",), "inherited"
    commands = " ".join(s.command for s in plan.steps if isinstance(s, containerfile.RunStep))
    args = dict(plan.args)
    assert '"torch==$TORCH_VERSION"' in commands and args["TORCH_VERSION"]
    assert "$DCGM_PACKAGES" in commands and "command -v dcgmi" in commands
    assert "datacenter-gpu-manager-4-core" in args["DCGM_PACKAGES"].split()
    for arch, repository in (("amd64", "x86_64"), ("arm64", "sbsa")):
        assert dict(release.plan("gpufleet-gpu", arch=arch).args)["TARGETARCH"] == arch
        assert f"{arch}) arch={repository}" in commands
