"""The container engine a release build runs: docker (buildx), buildah or podman.

``scripts/release/build-images`` (:mod:`gpufleet.local.release`) builds every image with one
command line per image; this module says what that line is for each engine
(:meth:`Engine.build_argv`) and what else a build with buildah or podman needs:

- **Where its layers go** (``--root``): the engine's own storage by default; with
  ``--base-from-local``, a storage of this project's cache, ``~/.cache/gpufleet/engine/
  <engine>-<version>`` (:func:`cache_storage`), so that the imported Debian base never
  shadows a real ``debian`` image of the machine's storage and a warm build finds its
  layers (``--layers``: buildah keys each step by what it reads).
- **A FROM image without a registry** (:func:`import_debian_base`): the Slurm image's
  ``FROM docker.io/library/debian:<suite>-slim`` is the local build's debootstrap of that
  suite (``scripts/slurm-root/build.sh`` with no RUN steps), built into the storage the way
  Debian's official image is (``FROM scratch``, ``ADD`` the tree, ``CMD ["bash"]``) and
  tagged with that name; the build then runs with ``--pull=never``. The result is cached in
  the storage under a key of the build script and the suite (:data:`BASE_REPOSITORY`).
- **pip without an index** (``--base-from-local``): the wheels the local build downloaded
  (:func:`gpufleet.local.images.download_wheels`) mounted at ``/mnt`` (empty in Debian's images, so
  the mount leaves nothing in a layer) and ``PIP_NO_INDEX``/``PIP_FIND_LINKS`` given as the
  gpufleet Containerfile's build args: they reach its RUN steps, never the image config.

Checking a built image (:func:`image_config`, :func:`run_entrypoint`) is buildah's: the
config as it stored it, and the image's ENTRYPOINT run in a working container that is
removed after (tests/integration/test_release_images.py; decision 0231).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpufleet.local import containerfile, node_image

ENGINES = ("docker", "buildah", "podman")
"""The engines ``--engine`` takes; docker is the default (the release workflow's)."""
LOCAL_ENGINES = ("buildah", "podman")
"""The engines ``--base-from-local`` works with: a storage of their own (``--root``)."""
BASE_REPOSITORY = "localhost/gpufleet-debian-base"
"""Where an imported Debian base is kept, tagged ``<suite>-<key>``, beside its Debian name."""
BASE_KEY_SCHEMA = 1
WHEELS_AT = "/mnt"
"""Where ``--base-from-local`` mounts the wheels for pip: a directory Debian's images have,
empty, so a RUN's mount point adds nothing to its layer."""
NOT_IN_BASE = ("./var/lib/apt/lists/*", "./var/cache/apt/*")
"""What a debootstrap has that Debian's images do not (apt's lists and caches)."""
IDENTITY_LABEL = "io.buildah.version"
"""The label buildah (and podman) add to every image they build; not the Containerfile's."""
INSTALL_HINT = {
    "buildah": "apt-get install buildah (Debian 12: 1.28)",
    "podman": "apt-get install podman",
    "docker": "install docker with the buildx plugin",
}

Progress = Callable[[str], None]


class EngineError(RuntimeError):
    """The engine cannot build or check the images; the message says why and what to do."""


@dataclass(frozen=True)
class Engine:
    """A container engine and, for buildah or podman, the storage it uses (None: its own)."""

    name: str = "docker"
    storage: Path | None = None

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise EngineError(f"no such engine: {self.name} (engines: {', '.join(ENGINES)})")
        if self.storage is not None and self.name not in LOCAL_ENGINES:
            raise EngineError(f"--storage is buildah's or podman's (--root), not {self.name}'s")

    def command(self, *args: str) -> list[str]:
        """``<engine> [--root S --runroot R] args...``: the runroot (locks, mount state) is a
        directory of /run named after the storage, so two storages never share it."""
        cmd = [self.name]
        if self.storage is not None:
            digest = hashlib.sha256(str(self.storage).encode()).hexdigest()[:12]
            cmd += ["--root", str(self.storage), "--runroot", f"/run/gpufleet-{self.name}-{digest}"]
        return [*cmd, *args]

    def build_argv(
        self,
        containerfile_path: str,
        build_args: Mapping[str, str],
        tag: str,
        *,
        platforms: str,
        push: bool,
        base_from_local: bool = False,
        wheels: Path | None = None,
    ) -> list[str]:
        """The command that builds one image from the repository's root (the context)."""
        if self.name == "docker":
            cmd = ["docker", "buildx", "build", "--platform", platforms, "-f", containerfile_path]
        else:
            if push:
                raise EngineError(
                    f"--push builds a multi-arch manifest with docker buildx; with {self.name}, "
                    f"build, then push each image: {self.name} push REFERENCE"
                )
            cmd = self.command("build", "--layers", "--force-rm", "--platform", platforms)
            cmd += ["-f", containerfile_path]
            if base_from_local:
                cmd += ["--pull=never", "--network", "host"]
            if wheels is not None:
                cmd += ["--volume", f"{wheels}:{WHEELS_AT}:ro"]
        for key, value in build_args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        cmd += ["-t", tag]
        if self.name == "docker":
            cmd.append("--push" if push else "--load")
        return [*cmd, "."]

    def require(self) -> str:
        """The engine's version; an error naming the package when it is not installed."""
        if shutil.which(self.name) is None:
            raise EngineError(f"{self.name} is not installed: {INSTALL_HINT[self.name]}")
        out = _run([self.name, "--version"], f"{self.name} --version")
        found = re.search(r"(\d+\.\d+(?:\.\d+)?)", out)
        return found.group(1) if found else "unknown"


def cache_root() -> Path:
    """``$GPUFLEET_CACHE/engine`` (default ``~/.cache/gpufleet/engine``)."""
    return node_image.cache_root().with_name("engine")


def cache_storage(name: str, version: str) -> Path:
    """The storage ``--base-from-local`` builds in: per engine and version (a storage's
    format belongs to the engine that wrote it)."""
    return cache_root() / f"{name}-{version}"


def _run(cmd: Sequence[str], what: str, *, check: bool = True) -> str:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    except OSError as exc:
        raise EngineError(f"{what}: {exc}") from exc
    if check and done.returncode != 0:
        raise EngineError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")
    return done.stdout


def has_image(engine: Engine, reference: str) -> bool:
    inspect = ["inspect", "--type", "image"] if engine.name == "buildah" else ["image", "inspect"]
    cmd = engine.command(*inspect, reference)
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


# ------------------------------------------------------------ the Debian base


def base_key(suite: str, repo: Path) -> str:
    """``<suite>-<12 hex>``: changes with the build script, the suite, what the tar leaves
    out and the config the base gets (Debian's official one)."""
    from gpufleet.local import slurm_root  # it imports release, which imports this module

    blob = json.dumps(
        {
            "schema": BASE_KEY_SCHEMA,
            "suite": suite,
            "build_files": node_image.tree_digests(slurm_root.scripts_dir(repo)),
            "not_in_base": NOT_IN_BASE,
            "config": containerfile.DEBIAN_CONFIG.as_oci(),
        },
        sort_keys=True,
    ).encode()
    return f"{suite}-{hashlib.sha256(blob).hexdigest()[:12]}"


def base_containerfile(config: containerfile.ImageConfig = containerfile.DEBIAN_CONFIG) -> str:
    """How Debian's official images are built (debuerreotype's Dockerfile): the tree, then
    the config."""
    lines = ["FROM scratch", "ADD rootfs.tar /"]
    lines += [f"ENV {k}={v}" for k, v in config.env]
    if config.cmd is not None:
        lines.append(f"CMD {json.dumps(list(config.cmd))}")
    return "\n".join(lines) + "\n"


def import_debian_base(engine: Engine, base: str, repo: Path, *, progress: Progress = print) -> str:
    """Make ``base`` (``docker.io/library/debian:<suite>-slim``) an image of the engine's
    storage, from the local build's debootstrap of that suite; returns the keyed reference.

    Cached: when the storage has the keyed image, it is only tagged ``base`` again (about
    a second; the debootstrap and the import take about 90 s)."""
    if engine.name not in LOCAL_ENGINES:
        raise EngineError(
            f"--base-from-local imports the Debian base into buildah's or podman's storage, "
            f"not {engine.name}'s: give --engine buildah (or podman)"
        )
    tag = base.rsplit(":", 1)[-1]
    suite = tag.removesuffix("-slim")
    keyed = f"{BASE_REPOSITORY}:{base_key(suite, repo)}"
    from gpufleet.local import slurm_root

    root = cache_root()
    with node_image.build_lock(root, progress, what="Debian base"):
        if has_image(engine, keyed):
            _run(engine.command("tag", keyed, base), f"{engine.name} tag")
            progress(f"base: {base} is {keyed} (cached)")
            return keyed
        staging = node_image.fresh_staging(root, keyed.rsplit(":", 1)[-1], progress)
        try:
            progress(f"base: debootstrap {suite} (scripts/slurm-root/build.sh, no RUN steps)")
            try:
                # The Slurm root's own build with no RUN steps: its debootstrap alone.
                slurm_root._run_build_script(staging, slurm_root.Inputs(suite, {}, ()), progress)
            except slurm_root.SlurmRootError as exc:
                raise EngineError(str(exc)) from exc
            context = staging / "context"
            context.mkdir()
            excludes = [f"--exclude={p}" for p in NOT_IN_BASE]
            _run(
                ["tar", "-C", str(staging / "root"), *excludes, "--xattrs", "--numeric-owner",
                 "-cf", str(context / "rootfs.tar"), "."],
                "tar of the Debian base",
            )  # fmt: skip
            (context / "Containerfile").write_text(base_containerfile())
            progress(f"base: {engine.name} build -t {base}")
            _run(
                engine.command("build", "--pull=never", "-t", keyed, "-t", base, str(context)),
                f"{engine.name} build of the Debian base",
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return keyed


# ------------------------------------------------------------ checking an image


def image_config(engine: Engine, reference: str) -> dict[str, object]:
    """The ``config`` object of the image's OCI config, as the engine stored it."""
    if engine.name != "buildah":
        raise EngineError("the images are checked with buildah")
    out = _run(engine.command("inspect", "--type", "image", reference), "buildah inspect")
    config = json.loads(out)["OCIv1"].get("config") or {}
    assert isinstance(config, dict)
    return config


@contextmanager
def working_container(engine: Engine, reference: str) -> Iterator[str]:
    """A buildah working container of ``reference``, removed on the way out."""
    if engine.name != "buildah":
        raise EngineError("the images are checked with buildah")
    name = _run(engine.command("from", "--pull=never", reference), "buildah from").strip()
    try:
        yield name
    finally:
        _run(engine.command("rm", name), "buildah rm", check=False)


def run_entrypoint(
    engine: Engine, reference: str, args: Sequence[str]
) -> subprocess.CompletedProcess[str]:
    """``args`` run as the image's container runs them: after its ENTRYPOINT (or in place of
    its CMD), as its User, with its Env and WorkingDir (what ``buildah run`` applies), with
    no network."""
    config = image_config(engine, reference)
    entrypoint = config.get("Entrypoint") or []
    assert isinstance(entrypoint, list)
    argv = [*map(str, entrypoint), *args]
    with working_container(engine, reference) as name:
        return subprocess.run(
            engine.command("run", "--network", "none", name, "--", *argv),
            capture_output=True, text=True, check=False,
        )  # fmt: skip


def config_differences(
    built: Mapping[str, object], expected: containerfile.ImageConfig
) -> list[str]:
    """Where an engine's image config differs from the one the local build's parser gives
    for the same file (Env, User, WorkingDir, Entrypoint, Cmd, Labels); the engine's own
    identity label aside."""
    want = expected.as_oci()
    got = dict(built)
    labels = dict(got.get("Labels") or {})  # type: ignore[call-overload]
    labels.pop(IDENTITY_LABEL, None)
    got["Labels"] = labels
    out = []
    for key in ("Env", "User", "WorkingDir", "Entrypoint", "Cmd", "Labels"):
        if (got.get(key) or None) != (want.get(key) or None):
            out.append(f"{key}: built {got.get(key)!r}, parsed {want.get(key)!r}")
    return out
