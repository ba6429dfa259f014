"""The images' Containerfiles, the build args they get and the names a release gives them.

One description per image (``images/<name>/Containerfile``): a release builds it with
``docker buildx`` (:func:`buildx_commands`, run by ``scripts/release/build-images``) and
``gpufleet local images build`` runs the same file (:mod:`gpufleet.local.images`). A
release names the images as the Helm chart's defaults do, ``ghcr.io/gpufleet/<name>``:

- ``gpufleet`` and ``gpufleet-gpu`` tagged with gpufleet's version (``gpufleet.__version__``,
  the chart's ``appVersion``);
- ``slurm`` tagged with the Slurm version its Containerfile installs (``SLURM_VERSION``,
  the chart's ``slurmImage.tag``).

The local build tags the same names under its own registry host with the cache key
appended (``gpufleet.local/gpufleet:0.1.0-ab12cd34``; decision 0182).

Run: ``python -m gpufleet.local.release --help``.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import gpufleet
from gpufleet.local import containerfile
from gpufleet.local.binaries import repo_root

REGISTRY = "ghcr.io/gpufleet"
"""Where a release pushes, and the chart's default image repositories."""
IMAGES = ("slurm", "gpufleet", "gpufleet-gpu")
"""Every image, in build order (each after the image it is built FROM)."""
LOCAL = ("slurm", "gpufleet")
"""The images the local cluster builds (it has no GPUs for gpufleet-gpu)."""
BASE_ARG = {"gpufleet": "SLURM_IMAGE", "gpufleet-gpu": "GPUFLEET_IMAGE"}
"""The build arg that names an image's base, for those built FROM another of :data:`IMAGES`."""
BASE_OF = {"gpufleet": "slurm", "gpufleet-gpu": "gpufleet"}
SLURM_VERSION_ARG = "SLURM_VERSION"
DEBIAN_IMAGES = ("docker.io/library/debian:", "debian:")
WHEEL = "dist/gpufleet-{version}-py3-none-any.whl"
REQUIREMENTS = "dist/requirements.txt"


class ReleaseError(RuntimeError):
    """The images cannot be described or built; the message says why."""


def _repo(repo: Path | None) -> Path:
    found = repo or repo_root()
    if found is None:
        raise ReleaseError("the images are built from a gpufleet source checkout")
    return found


def containerfile_path(name: str, repo: Path | None = None) -> Path:
    return _repo(repo) / "images" / name / "Containerfile"


def load(name: str, repo: Path | None = None) -> containerfile.Containerfile:
    root = _repo(repo)
    return containerfile.load(containerfile_path(name, root), relative_to=root)


def target_arch() -> str:
    """This machine's architecture as a build's TARGETARCH names it."""
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def build_args(
    name: str, *, registry: str = REGISTRY, arch: str | None = None, repo: Path | None = None
) -> dict[str, str]:
    """The build args every build of ``name`` gets: gpufleet's version, the platform args
    BuildKit gives (TARGETARCH...) and, for an image built on another, that image's name."""
    arch = arch or target_arch()
    args = {
        "VERSION": gpufleet.__version__,
        "TARGETOS": "linux",
        "TARGETARCH": arch,
        "TARGETPLATFORM": f"linux/{arch}",
    }
    if name in BASE_ARG:
        args[BASE_ARG[name]] = release_reference(BASE_OF[name], registry=registry, repo=repo)
    return args


def release_tag(name: str, repo: Path | None = None) -> str:
    """The tag a release gives ``name``: Slurm's version for ``slurm``, gpufleet's otherwise."""
    if name != "slurm":
        return gpufleet.__version__
    cf = load(name, repo)
    declared = {i.name: i.default for i in cf.instructions if isinstance(i, containerfile.Arg)}
    version = declared.get(SLURM_VERSION_ARG)
    if not version:
        raise ReleaseError(f"{cf.path} declares no {SLURM_VERSION_ARG} with a default")
    return version


def release_reference(name: str, *, registry: str = REGISTRY, repo: Path | None = None) -> str:
    return f"{registry}/{name}:{release_tag(name, repo)}"


def config_of(base: str, repo: Path | None = None) -> containerfile.ImageConfig:
    """The config of a FROM image: Debian's official one, or one of :data:`IMAGES` by its
    release reference (that image's own Containerfile, resolved)."""
    if base.startswith(DEBIAN_IMAGES):
        return containerfile.DEBIAN_CONFIG
    for name in IMAGES:
        if base == release_reference(name, repo=repo):
            return plan(name, repo=repo).config
    raise ReleaseError(
        f"FROM {base}: neither a Debian image nor one of this repository's ({', '.join(IMAGES)})"
    )


def plan(
    name: str,
    extra_args: Mapping[str, str] | None = None,
    *,
    repo: Path | None = None,
    arch: str | None = None,
) -> containerfile.Plan:
    """``images/<name>/Containerfile`` resolved with :func:`build_args` (and ``extra_args``)."""
    args = {**build_args(name, arch=arch, repo=repo), **(extra_args or {})}
    return containerfile.plan(load(name, repo), args, lambda base: config_of(base, repo))


# ------------------------------------------------------------------ docker buildx


def write_context(repo: Path | None = None) -> tuple[Path, Path]:
    """``dist/`` of the build context: this checkout's wheel and the runtime dependencies
    pinned to the versions installed here (what the tests ran); returns their paths."""
    from gpufleet.local import node_image
    from gpufleet.local.wheel import WheelError, build_wheel

    root = _repo(repo)
    dist = root / "dist"
    try:
        wheel = build_wheel(dist)
    except WheelError as exc:
        raise ReleaseError(str(exc)) from exc
    requirements = root / REQUIREMENTS
    requirements.write_text("\n".join(node_image.node_requirements()) + "\n")
    return wheel, requirements


def buildx_commands(
    names: Sequence[str],
    *,
    registry: str = REGISTRY,
    platforms: str,
    output: str,
    repo: Path | None = None,
) -> list[list[str]]:
    """One ``docker buildx build`` per image, in :data:`IMAGES` order; ``output`` is
    ``--push`` or ``--load``."""
    root = _repo(repo)
    out = []
    for name in IMAGES:
        if name not in names:
            continue
        cmd = ["docker", "buildx", "build", "--platform", platforms]
        cmd += ["-f", str(containerfile_path(name, root).relative_to(root))]
        args = build_args(name, registry=registry, repo=root)
        for key in ("VERSION", *([BASE_ARG[name]] if name in BASE_ARG else [])):
            cmd += ["--build-arg", f"{key}={args[key]}"]
        cmd += ["-t", release_reference(name, registry=registry, repo=root), output, "."]
        out.append(cmd)
    return out


def _build_images(ns: argparse.Namespace) -> int:
    root = _repo(None)
    names = ns.only or list(IMAGES)
    unknown = sorted(set(names) - set(IMAGES))
    if unknown:
        raise ReleaseError(f"no such image: {', '.join(unknown)} (images: {', '.join(IMAGES)})")
    output = "--push" if ns.push else "--load"
    platforms = ns.platform or ("linux/amd64,linux/arm64" if ns.push else f"linux/{target_arch()}")
    commands = buildx_commands(
        names, registry=ns.registry, platforms=platforms, output=output, repo=root
    )
    if not ns.dry_run:
        wheel, requirements = write_context(root)
        print(f"build context: {wheel.relative_to(root)}, {requirements.relative_to(root)}")
    for cmd in commands:
        print("+ " + shlex.join(cmd), flush=True)
        if not ns.dry_run:
            subprocess.run(cmd, cwd=root, check=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/release/build-images",
        description="Build the release images from images/*/Containerfile with docker buildx, "
        "named as the Helm chart's defaults (REGISTRY/gpufleet:VERSION, REGISTRY/slurm:SLURM, "
        "REGISTRY/gpufleet-gpu:VERSION). Writes dist/ (the wheel, the pinned requirements) "
        "first.",
        epilog="Examples: scripts/release/build-images --push   (multi-arch, to ghcr.io/gpufleet); "
        "scripts/release/build-images --only slurm --only gpufleet --load; "
        "scripts/release/build-images --dry-run; scripts/release/build-images --print-tags",
    )
    parser.add_argument("--registry", default=REGISTRY, help=f"repository prefix ({REGISTRY})")
    parser.add_argument("--only", action="append", choices=IMAGES, help="build only this image")
    parser.add_argument(
        "--platform",
        help="platforms (default: linux/amd64,linux/arm64 with --push, this machine's with --load)",
    )
    parser.add_argument("--push", action="store_true", help="push (default: --load into docker)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--print-tags", action="store_true", help="print each image's reference and stop"
    )
    ns = parser.parse_args(argv)
    try:
        if ns.print_tags:
            for name in ns.only or IMAGES:
                print(release_reference(name, registry=ns.registry))
            return 0
        return _build_images(ns)
    except (ReleaseError, containerfile.ContainerfileError) as exc:
        print(f"build-images: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"build-images: {shlex.join(exc.cmd)}: exit {exc.returncode}", file=sys.stderr)
        return exc.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
