"""The images' Containerfiles, the build args they get and the names a release gives them.

One description per image (``images/<name>/Containerfile``): a release builds it with
``docker buildx``, buildah or podman (:func:`build_commands`, run by
``scripts/release/build-images``; the engines: :mod:`gpufleet.local.engine`) and
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
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import gpufleet
from gpufleet.local import containerfile, engine
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


# ------------------------------------------------------------------ building


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


PIP_LOCAL_ARGS = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": engine.WHEELS_AT}
"""Build args pointing pip at the mounted wheels (``--base-from-local``), given to an image
whose Containerfile declares them."""


def declared_args(name: str, repo: Path | None = None) -> set[str]:
    return {i.name for i in load(name, repo).instructions if isinstance(i, containerfile.Arg)}


def build_commands(
    names: Sequence[str],
    *,
    builder: engine.Engine | None = None,
    registry: str = REGISTRY,
    platforms: str,
    push: bool = False,
    wheels: Path | None = None,
    repo: Path | None = None,
) -> list[list[str]]:
    """One build command per image, in :data:`IMAGES` order, for ``builder`` (docker
    buildx by default). ``wheels``: the ``--base-from-local`` build (no registry: the base
    already in the storage, pip pointed at these wheels where the file declares its args)."""
    root = _repo(repo)
    builder = builder or engine.Engine()
    out = []
    for name in IMAGES:
        if name not in names:
            continue
        args = build_args(name, registry=registry, repo=root)
        given = {k: args[k] for k in ("VERSION", *([BASE_ARG[name]] if name in BASE_ARG else []))}
        pip_local = wheels is not None and set(PIP_LOCAL_ARGS) <= declared_args(name, root)
        if pip_local:
            given.update(PIP_LOCAL_ARGS)
        out.append(
            builder.build_argv(
                str(containerfile_path(name, root).relative_to(root)),
                given,
                release_reference(name, registry=registry, repo=root),
                platforms=platforms,
                push=push,
                base_from_local=wheels is not None,
                wheels=wheels if pip_local else None,
            )
        )
    return out


def _builder(ns: argparse.Namespace) -> engine.Engine:
    """The engine of ``--engine``, in ``--storage`` (or, with ``--base-from-local``, the
    cache's storage for this engine and version)."""
    storage = Path(ns.storage).resolve() if ns.storage else None
    if ns.base_from_local and ns.engine not in engine.LOCAL_ENGINES:
        raise engine.EngineError(
            "--base-from-local imports the Debian base into buildah's or podman's storage: "
            "give --engine buildah (or podman)"
        )
    builder = engine.Engine(ns.engine, storage)
    if ns.base_from_local and storage is None:
        version = builder.require() if not ns.dry_run or shutil.which(ns.engine) else "VERSION"
        builder = engine.Engine(ns.engine, engine.cache_storage(ns.engine, version))
    elif not ns.dry_run:
        builder.require()
    return builder


def _build_images(ns: argparse.Namespace) -> int:
    from gpufleet.local import images

    root = _repo(None)
    names = ns.only or list(IMAGES)
    unknown = sorted(set(names) - set(IMAGES))
    if unknown:
        raise ReleaseError(f"no such image: {', '.join(unknown)} (images: {', '.join(IMAGES)})")
    builder = _builder(ns)
    here = f"linux/{target_arch()}"
    platforms = ns.platform or ("linux/amd64,linux/arm64" if ns.push else here)
    if ns.base_from_local and platforms != here:
        raise ReleaseError(
            f"--base-from-local builds {here} only: its Debian base is a debootstrap of "
            f"this machine (asked for {platforms})"
        )
    wheels = None
    if ns.base_from_local:
        wheels = images.download_wheels(print) if not ns.dry_run else images.wheels_dir()
    commands = build_commands(
        names, builder=builder, registry=ns.registry, platforms=platforms, push=ns.push,
        wheels=wheels, repo=root,
    )  # fmt: skip
    if not ns.dry_run:
        wheel, requirements = write_context(root)
        print(f"build context: {wheel.relative_to(root)}, {requirements.relative_to(root)}")
    if ns.base_from_local:
        base = plan("slurm", repo=root).base
        if not base.startswith(DEBIAN_IMAGES):
            raise ReleaseError(f"images/slurm/Containerfile: FROM {base}: not a Debian image")
        print(f"+ import {base} from the local build's debootstrap", flush=True)
        if not ns.dry_run:
            engine.import_debian_base(builder, base, root)
    for cmd in commands:
        print("+ " + shlex.join(cmd), flush=True)
        if not ns.dry_run:
            subprocess.run(cmd, cwd=root, check=True)
    if builder.storage is not None:
        print(f"images in {builder.storage}: {shlex.join(builder.command('images'))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/release/build-images",
        description="Build the release images from images/*/Containerfile with docker buildx "
        "(or buildah, podman), named as the Helm chart's defaults (REGISTRY/gpufleet:VERSION, "
        "REGISTRY/slurm:SLURM, REGISTRY/gpufleet-gpu:VERSION). Writes dist/ (the wheel, the "
        "pinned requirements) first.",
        epilog="Examples: scripts/release/build-images --push   (multi-arch, to ghcr.io/gpufleet); "
        "scripts/release/build-images --only slurm --only gpufleet --load; "
        "scripts/release/build-images --engine buildah --base-from-local --only slurm "
        "--only gpufleet   (no registry: this machine's Debian mirror and the wheels it "
        "downloaded); scripts/release/build-images --dry-run; "
        "scripts/release/build-images --print-tags",
    )
    parser.add_argument("--registry", default=REGISTRY, help=f"repository prefix ({REGISTRY})")
    parser.add_argument("--only", action="append", choices=IMAGES, help="build only this image")
    parser.add_argument(
        "--platform",
        help="platforms (default: linux/amd64,linux/arm64 with --push, this machine's with --load)",
    )
    parser.add_argument(
        "--engine", choices=engine.ENGINES, default="docker",
        help="docker (buildx; the default), buildah or podman (build --layers)",
    )  # fmt: skip
    parser.add_argument(
        "--storage",
        help="buildah's or podman's storage directory (--root; default: the engine's own, "
        f"or with --base-from-local {engine.cache_root()}/ENGINE-VERSION)",
    )
    parser.add_argument(
        "--base-from-local",
        action="store_true",
        help="build with no registry (buildah or podman): the Debian base is the local "
        "build's debootstrap of the suite the Slurm image names, imported into the storage "
        "under that name (--pull=never); pip installs from the wheels the local build "
        "downloaded; RUN steps use the host's network (apt reaches its Debian mirror)",
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
    except (ReleaseError, engine.EngineError, containerfile.ContainerfileError) as exc:
        print(f"build-images: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"build-images: {shlex.join(exc.cmd)}: exit {exc.returncode}", file=sys.stderr)
        return exc.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
