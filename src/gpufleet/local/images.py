"""Container images of gpufleet and Slurm, built from their Containerfiles with no
container engine and no registry.

Each image has one description, ``images/<name>/Containerfile``, which a release builds
with docker (:mod:`gpufleet.local.release`) and which this module runs (decisions 0180,
0181). The two images share their first layer::

    gpufleet.local/slurm:24.11.5-<k>     [slurm]
    gpufleet.local/gpufleet:<v>-<k>      [slurm, a layer per COPY and RUN]

- **slurm**: ``images/slurm/Containerfile`` as the Slurm root
  (:mod:`gpufleet.local.slurm_root`: its Debian base debootstrapped, its RUN chrooted in
  the same tree), one layer. The chart's Slurm pods run it.
- **gpufleet**: ``images/gpufleet/Containerfile`` on it: the pinned requirements, Debian
  13's Python with a venv at ``/opt/gpufleet`` holding gpufleet's runtime dependencies at
  the versions the tests ran (the node image's list:
  :func:`gpufleet.local.node_image.node_requirements`), this checkout's wheel, gpufleet
  installed.

gpufleet's image sits on the Slurm image because the syncer and the operator run the
release's ``scontrol`` (requeue, reservations, reconfigure on 22.05); the agent and the
controller do not need it, and one image is simpler to ship. A node pulls the shared layer
once.

A RUN is a command chrooted into an overlay of the layers below
(``scripts/images/overlay-run.sh``): the overlay's upper directory *is* the layer, its
whiteouts become OCI whiteouts. Layers are uncompressed tars (the local registry is on
loopback; a gunzip under software emulation costs more than the bytes), cached by key
under ``~/.cache/gpufleet/images/layers/<key>``; a commit that changes only gpufleet's code
rebuilds only the two layers of the wheel (seconds). The images are an OCI image layout
per combination under ``images/store/<key>`` (blobs hard-linked to the layers), which
:mod:`gpufleet.local.registry` serves. The image config each image gets (Env, WorkingDir,
Entrypoint, Cmd, Labels) is what its Containerfile says.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpufleet.local import binaries, containerfile, node_image, oci, release, slurm_root

REGISTRY_HOST = "gpufleet.local"
"""The registry name in every image reference; a node's containerd maps it to the
local registry (``/etc/containerd/certs.d/gpufleet.local/hosts.toml``)."""
GPUFLEET_REPOSITORY = f"{REGISTRY_HOST}/gpufleet"
SLURM_REPOSITORY = f"{REGISTRY_HOST}/slurm"
COREDNS_REPOSITORY = f"{REGISTRY_HOST}/coredns"
ROOT_PATH = "/opt/gpufleet/bin:" + slurm_root.ROOT_PATH
KEY_SCHEMA = 1
KEEP_STORES = 3
KEEP_APP_LAYERS = 4
"""App layers kept (a few MB each: one per code change)."""
KEEP_LAYERS = 2
"""Slurm, Python (250 MB) and CoreDNS layers kept: the current and the one before."""
NOT_IN_LAYERS = ("dev", "proc", "sys", "tmp")
"""Directories kept empty in a layer: the runtime mounts them."""
OPAQUE_XATTR = "trusted.overlay.opaque"

Progress = Callable[[str], None]


class ImageError(RuntimeError):
    """An image cannot be built; the message says why and what to do."""


def cache_root() -> Path:
    """``$GPUFLEET_CACHE/images`` (default ``~/.cache/gpufleet/images``)."""
    return node_image.cache_root().with_name("images")


def scripts_dir() -> Path:
    repo = binaries.repo_root()
    if repo is None:
        raise ImageError("images are built from a gpufleet source checkout (pip install -e .)")
    return repo / "scripts" / "images"


def _key(kind: str, inputs: dict[str, Any]) -> str:
    blob = json.dumps({"schema": KEY_SCHEMA, **inputs}, sort_keys=True).encode()
    return f"{kind}-{hashlib.sha256(blob).hexdigest()[:12]}"


# ------------------------------------------------------------------ layer tars


class _HashingWriter:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)


def _walk(tree: Path, directory: Path | None = None) -> Iterator[Path]:
    """Every path under ``tree`` in name order, parents first, links not followed; the
    contents of :data:`NOT_IN_LAYERS` left out."""
    for entry in sorted(os.scandir(directory or tree), key=lambda e: e.name):
        path = Path(entry.path)
        yield path
        rel = path.relative_to(tree).as_posix()
        if entry.is_dir(follow_symlinks=False) and rel not in NOT_IN_LAYERS:
            yield from _walk(tree, path)


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def write_layer(tree: Path, out: Path, *, overlay_upper: bool = False) -> tuple[str, int]:
    """Write ``tree`` as an uncompressed layer tar at ``out``; returns (digest, bytes).

    Owners, modes, times and hard links are kept (the venv's byte code checks the
    times of its sources); entries are in name order. With ``overlay_upper``,
    overlayfs whiteouts (0/0 character devices) become ``.wh.<name>`` files and
    opaque directories get ``.wh..wh..opq``, as the OCI layer format says.
    """
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as raw:
        sink = _HashingWriter(raw)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for path in _walk(tree):
                arc = path.relative_to(tree).as_posix()
                st = path.lstat()
                if overlay_upper and stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    info = tarfile.TarInfo(f"{os.path.dirname(arc)}/.wh.{path.name}".lstrip("/"))
                    info.mtime = int(st.st_mtime)
                    tar.addfile(info)
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    continue
                info = tar.gettarinfo(str(path), arcname=arc)
                info.uname = info.gname = ""
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
                if overlay_upper and info.isdir() and _is_opaque(path):
                    tar.addfile(tarfile.TarInfo(f"{arc}/.wh..wh..opq"))
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, out)
    return "sha256:" + sink.sha.hexdigest(), sink.size


@dataclass(frozen=True)
class Layer:
    """A cached layer: its tar, and the tree it was made from (a lower for the next)."""

    key: str
    directory: Path
    tree: Path
    digest: str
    size: int

    @property
    def tar(self) -> Path:
        return self.directory / "layer.tar"


def _load_layer(directory: Path, tree: Path) -> Layer | None:
    try:
        meta = json.loads((directory / "layer.json").read_text())
    except (OSError, ValueError):
        return None
    if not (directory / "layer.tar").is_file() or not tree.is_dir():
        return None
    return Layer(directory.name, directory, tree, str(meta["digest"]), int(meta["size"]))


def _layer(
    key: str,
    progress: Progress,
    make: Callable[[Path], Path],
    *,
    overlay_upper: bool,
    extra: dict[str, object] | None = None,
) -> tuple[Layer, bool]:
    """The cached layer ``key``, or build it: ``make(staging)`` fills a tree, returns it."""
    root = cache_root() / "layers"
    final = root / key
    if (found := _load_layer(final, _tree_of(final, overlay_upper))) is not None:
        return found, False
    root.mkdir(parents=True, exist_ok=True)
    staging = node_image.fresh_staging(root, key, progress)
    try:
        tree = make(staging)
        progress(f"writing layer {key}")
        digest, size = write_layer(tree, staging / "layer.tar", overlay_upper=overlay_upper)
        meta = {"key": key, "digest": digest, "size": size, "tree": str(tree), **(extra or {})}
        (staging / "layer.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        node_image.publish(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    found = _load_layer(final, _tree_of(final, overlay_upper))
    assert found is not None
    return found, True


def _tree_of(directory: Path, overlay_upper: bool) -> Path:
    """The tree a layer was made from: its own ``upper/``, or (the Slurm root's) another."""
    if overlay_upper:
        return directory / "upper"
    try:
        return Path(json.loads((directory / "layer.json").read_text())["tree"])
    except (OSError, ValueError, KeyError):
        return directory / "missing"


def _overlay_run(
    lowers: list[Path],
    upper: Path,
    work: Path,
    command: list[str],
    *,
    binds: dict[Path, str],
    net: bool,
    what: str,
    progress: Progress,
) -> list[str]:
    """Run ``command`` chrooted into lowers + upper; returns its output lines."""
    cmd = [
        str(scripts_dir() / "overlay-run.sh"),
        "--lower", ":".join(str(p) for p in reversed(lowers)),
        "--upper", str(upper), "--work", str(work),
    ]  # fmt: skip
    for src, dst in binds.items():
        cmd += ["--bind", f"{src}:{dst}"]
    if net:
        cmd.append("--net")
    proc = subprocess.run(
        [*cmd, "--", *command], capture_output=True, text=True, timeout=1800, check=False
    )
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    for line in lines[-5:]:
        progress(f"  {line}")
    if proc.returncode != 0:
        tail = "\n".join(lines[-20:])
        raise ImageError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return lines


# ------------------------------------------------------------------ the images


@dataclass(frozen=True)
class ImageSet:
    """The built images: an OCI image layout holding both, and their references."""

    layout: Path
    gpufleet: str
    slurm: str
    coredns: str
    """The local cluster's DNS (:mod:`gpufleet.local.dns`), not part of the chart."""
    built: list[str]
    """Keys of the layers this call built (empty when all were cached)."""
    seconds: float
    app_layers: int = 1
    """How many of the gpufleet image's top layers change with gpufleet's code (from the
    COPY of the wheel up): the machines' image seed leaves them out."""

    @property
    def gpufleet_tag(self) -> str:
        return self.gpufleet.rsplit(":", 1)[1]

    @property
    def slurm_tag(self) -> str:
        return self.slurm.rsplit(":", 1)[1]


def _check_host() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("needs root (overlay mounts and chroot): run it as root")
    if shutil.which("unshare") is None:
        problems.append("unshare is missing: apt-get install util-linux")
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append("the kernel has no overlay filesystem (modprobe overlay)")
    if problems:
        raise ImageError("cannot build the images:\n  " + "\n  ".join(problems))


def build(*, progress: Progress = print, wheel: Path | None = None) -> ImageSet:
    """Build (or find cached) the Slurm and gpufleet images of this checkout.

    Both are built from their Containerfiles (``images/<name>/Containerfile``, the files
    a release builds with docker): the Slurm image is the Slurm root
    (:mod:`gpufleet.local.slurm_root`, about two minutes when missing), the gpufleet
    image one layer per COPY and RUN of its file on top of it (the Python layer a
    minute, once per dependency set; the app layers seconds, once per wheel).
    """
    from gpufleet.local.wheel import WheelError, build_wheel

    start = time.monotonic()
    _check_host()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    built: list[str] = []
    with node_image.build_lock(root, progress, what="image"):
        try:
            slurm = slurm_root.build(progress=progress).root
        except slurm_root.SlurmRootError as exc:
            raise ImageError(str(exc)) from exc
        slurm_version = slurm.version.split("-")[0]
        try:
            slurm_plan = release.plan("slurm")
        except (containerfile.ContainerfileError, release.ReleaseError) as exc:
            raise ImageError(str(exc)) from exc

        base, new = _layer(
            _key("slurm", {"slurm_root": slurm.directory.name}),
            progress,
            lambda _staging: slurm.tree,
            overlay_upper=False,
            extra={"slurm": slurm.version},
        )
        if new:
            built.append(base.key)

        wheel_dir = root / "wheel"
        if wheel is None:
            try:
                wheel = build_wheel(wheel_dir)
            except WheelError as exc:
                raise ImageError(str(exc)) from exc
        version = wheel.name.split("-")[1]
        context = _Context(
            binaries.repo_root() or Path("."),
            {
                release.WHEEL.format(version=version): wheel,
                release.REQUIREMENTS: _requirements_file(root),
            },
        )
        try:
            plan = release.plan("gpufleet", {"VERSION": version})
        except (containerfile.ContainerfileError, release.ReleaseError) as exc:
            raise ImageError(str(exc)) from exc
        slurm_release = release.release_reference("slurm")
        if plan.base != slurm_release:
            raise ImageError(
                f"images/gpufleet/Containerfile: FROM {plan.base}: the local build builds "
                f"it on the Slurm image ({slurm_release})"
            )
        layers, new_keys = _step_layers(plan, [base], context, progress)
        built += new_keys
        wheel_name = release.WHEEL.format(version=version)
        first_app = next(
            (n for n, step in enumerate(plan.steps)
             if isinstance(step, containerfile.CopyStep) and wheel_name in step.sources),
            len(plan.steps),
        )  # fmt: skip
        app = layers[-1]

        coredns_sources = scripts_dir() / "coredns"

        def make_coredns(staging: Path) -> Path:
            progress("coredns: go build (a few minutes the first time: its modules)")
            tree = staging / "upper"
            tree.mkdir()
            repo = binaries.repo_root()
            assert repo is not None  # scripts_dir() found the checkout
            try:
                node_image.go_build(repo, coredns_sources, tree / "coredns")
            except node_image.NodeImageError as exc:
                raise ImageError(str(exc)) from exc
            return tree

        coredns, new = _layer(
            _key("coredns", {"sources": node_image.tree_digests(coredns_sources)}),
            progress,
            make_coredns,
            overlay_upper=True,
        )
        if new:
            built.append(coredns.key)
        gpufleet_ref = f"{GPUFLEET_REPOSITORY}:{version}-{app.key.split('-')[1][:8]}"
        slurm_ref = f"{SLURM_REPOSITORY}:{slurm_version}-{base.key.split('-')[1][:8]}"
        coredns_ref = f"{COREDNS_REPOSITORY}:{COREDNS_VERSION}-{coredns.key.split('-')[1][:8]}"
        all_layers = [base, *layers, coredns]
        store_key = _key("store", {"layers": [la.key for la in all_layers]})
        store = root / "store" / store_key
        if not (store / "index.json").is_file():
            _write_store(
                store,
                {
                    slurm_ref: ([base], slurm_plan.config.as_oci()),
                    gpufleet_ref: ([base, *layers], plan.config.as_oci()),
                    coredns_ref: ([coredns], COREDNS_CONFIG),
                },
            )
        node_image.prune(root / "store", KEEP_STORES, store_key)
        for layer in all_layers:
            small = layer.size < SMALL_LAYER
            _prune_layers(
                root / "layers", keep=KEEP_APP_LAYERS if small else KEEP_LAYERS, current=layer.key
            )
        for legacy in LEGACY_KINDS:
            for old in (root / "layers").glob(f"{legacy}-*"):
                shutil.rmtree(old, ignore_errors=True)
    return ImageSet(
        store, gpufleet_ref, slurm_ref, coredns_ref, built, time.monotonic() - start,
        app_layers=len(plan.steps) - first_app,
    )  # fmt: skip


SMALL_LAYER = 64 << 20
"""Layers under this size (a wheel, the app installed: one per code change) keep
:data:`KEEP_APP_LAYERS` of their kind, larger ones :data:`KEEP_LAYERS`."""
LEGACY_KINDS = ("python", "app")
"""Layer kinds of the builder before the Containerfiles, removed from the cache."""


class _Context:
    """The build context of a Containerfile: the checkout, with ``dist/`` files given."""

    def __init__(self, repo: Path, given: dict[str, Path]) -> None:
        self.repo = repo
        self.given = given

    def files(self, source: str, where: str) -> list[Path]:
        if source in self.given:
            return [self.given[source]]
        found = sorted(self.repo.glob(source))
        if not found:
            raise ImageError(f"{where}: COPY {source}: nothing in the build context matches")
        return found


def _requirements_file(root: Path) -> Path:
    """The pinned runtime dependencies (:func:`node_image.node_requirements`) as
    ``dist/requirements.txt`` of the build context."""
    text = "\n".join(node_image.node_requirements()) + "\n"
    path = root / "context" / "requirements.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes())
    digest.update(b"x" if os.access(path, os.X_OK) else b"-")
    return digest.hexdigest()


def _copy_into(tree: Path, sources: list[Path], dest: str) -> None:
    """COPY ``sources`` to ``dest`` in ``tree``: into it when it ends in ``/`` or there are
    several, else as that name; new directories root-owned 0755, files keep mode and time."""
    into_dir = dest.endswith("/") or len(sources) > 1
    target = tree / dest.strip("/")
    parent = target if into_dir else target.parent
    parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    for src in sources:
        out = target / src.name if into_dir else target
        if src.is_dir():
            shutil.copytree(src, out, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, out)
    for path in [tree, *tree.rglob("*")]:
        os.lchown(path, 0, 0)


def _make_copy(staging: Path, files: list[Path], dest: str) -> Path:
    tree = staging / "upper"
    tree.mkdir()
    _copy_into(tree, files, dest)
    return tree


def _make_run(
    staging: Path, step: containerfile.RunStep, lower: list[Layer], where: str, progress: Progress
) -> Path:
    wheels = download_wheels(progress)
    upper = staging / "upper"
    env = [f"{k}={v}" for k, v in (("HOME", "/root"), *step.env)]
    env += ["PIP_NO_INDEX=1", "PIP_FIND_LINKS=/mnt/wheels"]
    progress(f"RUN {' '.join(step.command.split())[:90]}...")
    _overlay_run(
        [la.tree for la in lower], upper, staging / "work",
        ["/usr/bin/env", "-C", step.working_dir, *env, "/bin/sh", "-c", step.command],
        binds={wheels: "/mnt/wheels"}, net=True, what=f"RUN of {where}", progress=progress,
    )  # fmt: skip
    shutil.rmtree(staging / "work", ignore_errors=True)
    return upper


def _step_layers(
    plan: containerfile.Plan, below: list[Layer], context: _Context, progress: Progress
) -> tuple[list[Layer], list[str]]:
    """One cached layer per COPY and RUN of ``plan`` on ``below``; (layers, keys built).

    A RUN runs as ``overlay-run.sh`` runs it (chrooted in an overlay of the layers
    below, the network for apt); pip is pointed at wheels downloaded on the host
    (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``): the venv gets what the tests ran, the
    chroot needs no index.
    """
    layers: list[Layer] = []
    built: list[str] = []
    runner = node_image.tree_digests(scripts_dir())["overlay-run.sh"]
    for n, step in enumerate(plan.steps, 1):
        lower = [*below, *layers]
        where = f"images/gpufleet/Containerfile:{step.line}"
        make: Callable[[Path], Path]
        if isinstance(step, containerfile.CopyStep):
            files = [f for s in step.sources for f in context.files(s, where)]
            inputs: dict[str, Any] = {
                "below": lower[-1].key,
                "copy": [[f.name, _file_digest(f)] for f in files],
                "dest": step.dest,
            }
            make = functools.partial(_make_copy, files=files, dest=step.dest)
        else:
            if step.user not in ("", "0", "root"):
                raise ImageError(f"{where}: the local build runs RUN steps as root only")
            inputs = {
                "below": lower[-1].key, "run": step.command, "env": dict(step.env),
                "dir": step.working_dir, "runner": runner,
            }  # fmt: skip
            make = functools.partial(
                _make_run, step=step, lower=lower, where=where, progress=progress
            )
        layer, new = _layer(_key(f"gpufleet{n}", inputs), progress, make, overlay_upper=True)
        layers.append(layer)
        if new:
            built.append(layer.key)
    return layers, built


def wheels_dir() -> Path:
    """Where :func:`download_wheels` puts the wheels of the pinned runtime dependencies."""
    key = _key("wheels", {"requirements": node_image.node_requirements()})
    return cache_root() / "wheels" / key / "wheels"


def download_wheels(progress: Progress) -> Path:
    """Wheels of the pinned runtime dependencies, downloaded once per set (also the pip
    index of ``scripts/release/build-images --base-from-local``)."""
    requirements = node_image.node_requirements()
    out = wheels_dir().parent
    key = out.name
    if not (out / "wheels" / ".complete").is_file():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        progress(f"wheels of {len(requirements)} dependencies")
        node_image.download_wheels(requirements, out)
        (out / "wheels" / ".complete").touch()
        node_image.prune(out.parent, 2, key)
    return out / "wheels"


COREDNS_VERSION = "1.14.2"
"""The CoreDNS module ``scripts/images/coredns/go.mod`` requires (its image tag)."""
COREDNS_CONFIG: dict[str, Any] = {
    "Entrypoint": ["/coredns"],
    "User": "65534:65534",
    "Labels": {"org.opencontainers.image.title": "CoreDNS for the gpufleet local cluster"},
}


def _prune_layers(layers: Path, *, keep: int, current: str) -> None:
    """Keep ``current`` and the newest ``keep - 1`` other layers of its kind (its key's
    prefix: ``app``, ``python``...); a running cluster serves hard links of its own."""
    kind = current.split("-", 1)[0]
    others = sorted(
        (p for p in layers.glob(f"{kind}-*") if p.name != current),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in others[keep - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` a hard link of ``src`` (a copy across filesystems); kept when it exists."""
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


LayoutImage = tuple[str, Sequence[tuple[str, int]], dict[str, Any]]
"""An image to write into a layout: its reference, its layers (digest, size; bottom
first) and its config's ``config`` object."""


def write_layout(
    out: Path, images: Sequence[LayoutImage], layer_file: Callable[[str], Path]
) -> None:
    """An OCI image layout at ``out`` naming ``images``: each layer blob a hard link of
    ``layer_file(digest)``, configs and manifests written here."""
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    manifests = []
    for reference, layers, config in images:
        for digest, _ in layers:
            link_or_copy(layer_file(digest), blobs / digest.removeprefix("sha256:"))
        blob_list = oci.image_blobs(config, list(layers))
        for blob in blob_list.blobs:
            (blobs / blob.digest.removeprefix("sha256:")).write_bytes(blob.data)
        manifests.append(oci.index_entry(blob_list.manifest, reference))
    (out / "oci-layout").write_bytes(oci.dumps({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_bytes(
        oci.dumps({"schemaVersion": 2, "mediaType": oci.INDEX_TYPE, "manifests": manifests})
    )


def _write_store(store: Path, images: dict[str, tuple[list[Layer], dict[str, Any]]]) -> None:
    """An OCI image layout at ``store`` naming every image of ``images``, in place at once."""
    staging = store.with_name(f".{store.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    tars = {layer.digest: layer.tar for layers, _ in images.values() for layer in layers}
    write_layout(
        staging,
        [(ref, [(la.digest, la.size) for la in layers], config)
         for ref, (layers, config) in images.items()],
        tars.__getitem__,
    )  # fmt: skip
    node_image.publish(staging, store)


def layout_images(layout: Path) -> dict[str, str]:
    """``reference -> manifest digest`` of an image layout's index."""
    index = json.loads((layout / "index.json").read_text())
    return {
        m["annotations"]["io.containerd.image.name"]: m["digest"]
        for m in index.get("manifests", [])
        if "io.containerd.image.name" in (m.get("annotations") or {})
    }


def link_layout(src: Path, dst: Path) -> None:
    """A copy of layout ``src`` at ``dst`` made of hard links (a cluster serves its own:
    a rebuild that prunes the cache does not pull images from under a running cluster)."""
    (dst / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    for blob in (src / "blobs" / "sha256").iterdir():
        link_or_copy(blob, dst / "blobs" / "sha256" / blob.name)
    for name in ("oci-layout", "index.json"):
        shutil.copyfile(src / name, dst / name)
