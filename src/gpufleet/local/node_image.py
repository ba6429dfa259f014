"""The stateless node image: where it is cached, what its key covers, how it is built.

A machine of the local cluster network-boots this image: a Debian 13 kernel,
an initrd that fetches the root filesystem over HTTP and runs it from RAM
(live-boot), and that root filesystem as a squashfs, with systemd,
containerd, cloud-init, the kubelet and kubeadm of the pinned Kubernetes
release and a Python venv holding the agent's dependencies. The heavy lifting
is ``scripts/node-image/build.sh`` (root: debootstrap, chroot); this module
decides whether it has to run and makes its result appear atomically:

    ~/.cache/gpufleet/node-image/<key>/{vmlinuz,initrd.img,rootfs.squashfs,manifest.json}

The key is a hash of every input: the Debian suite, every file under
``scripts/node-image/`` (build script, package list, configuration, the
pause source), the Go binaries' cache key (pinned versions and go.sum) and
the pinned Python requirements. A build happens in
``~/.cache/gpufleet/node-image.building/<key>-<pid>/`` (same filesystem, outside
the directory readers list) and is renamed into place only after
``manifest.json`` (written last) is on disk, so an interrupted build never
leaves a directory that looks complete; a later build deletes what a dead
builder left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from gpufleet.local import binaries, oci

SUITE = "trixie"
"""Debian 13: kernel 6.12, systemd 257, containerd 1.7, cloud-init 25.1, Python 3.13."""
SUITE_PYTHON = "3.13"
"""The python3 of the suite: the venv's wheels are chosen for it."""
IMAGE_FILES = ("vmlinuz", "initrd.img", "rootfs.squashfs")
MANIFEST = "manifest.json"
PAUSE_REFERENCE = "gpufleet.local/pause:1.0"
"""The sandbox image containerd starts every pod with (files/etc/containerd/config.toml)."""
NETCHECK_REFERENCE = "gpufleet.local/netcheck:1.0"
"""A pod that serves HTTP or fetches URLs: checks pod networking and Services on a node."""
KEEP_ENTRIES = 3
"""Images kept in the cache (about 280 MiB each): the newest, the one just built included."""
KEY_SCHEMA = 1
"""Bumped when the meaning of the key's inputs changes."""

NOT_ON_NODES = {
    "torch": "an optional extra (gpu), installed with the GPU driver stack, not here",
    "matplotlib": "only `gpufleet sim report` draws plots; nodes do not",
}
"""Runtime dependencies of the gpufleet package that the node's venv leaves out."""

DEFAULT_MIRROR = "http://deb.debian.org/debian"

Progress = Callable[[str], None]


class NodeImageError(RuntimeError):
    """The image cannot be built or found; the message says why and what to do."""


def cache_root() -> Path:
    """``$GPUFLEET_CACHE/node-image`` (default ``~/.cache/gpufleet/node-image``)."""
    cache = Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet"))
    return cache / "node-image"


def staging_root(root: Path) -> Path:
    """Where builds happen: beside ``root`` (a rename into it is atomic), not in it."""
    return root.with_name(root.name + ".building")


def scripts_dir(repo: Path) -> Path:
    return repo / "scripts" / "node-image"


def _repo() -> Path:
    root = binaries.repo_root()
    if root is None:
        raise NodeImageError(
            "the node image is built from a source checkout (scripts/node-image/, deps/): "
            "run gpufleet from one (pip install -e .)"
        )
    return root


# ---------------------------------------------------------------- the key


def tree_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative POSIX path -> hex), with modes.

    The executable bit is part of a file's digest: the build copies files
    into the image with their modes.
    """
    out: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256(path.read_bytes())
            digest.update(b"x" if os.access(path, os.X_OK) else b"-")
            out[path.relative_to(directory).as_posix()] = digest.hexdigest()
    return out


def node_requirements(
    root_distribution: str = "gpufleet",
    python_version: str = SUITE_PYTHON,
    excluded: Sequence[str] = tuple(NOT_ON_NODES),
) -> list[str]:
    """``name==version`` of every runtime dependency of ``root_distribution``, recursively.

    Versions are those installed in this interpreter's environment (the
    repository's .venv), so the node runs what the tests ran. Markers are
    evaluated for Linux x86_64 and ``python_version``; extras are not
    followed; ``excluded`` names (and what only they pull in) are left out.
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    # Marker.evaluate fills what is not given here from this interpreter.
    env: dict[str, str] = {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }
    skip = {canonicalize_name(n) for n in excluded}
    try:
        todo = [Requirement(r) for r in metadata.requires(root_distribution) or []]
    except metadata.PackageNotFoundError:
        raise NodeImageError(f"{root_distribution} is not installed in {sys.prefix}") from None
    pinned: dict[str, str] = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in skip or name in pinned:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise NodeImageError(
                f"{req.name} (needed by the agent) is not installed in {sys.prefix}: "
                "run scripts/bootstrap-python.sh"
            ) from None
        pinned[name] = dist.version
        todo.extend(Requirement(r) for r in dist.requires or [])
    return [f"{n}=={v}" for n, v in sorted(pinned.items())]


@dataclass(frozen=True)
class Inputs:
    """Everything the image is made from; :meth:`key` names the cache entry."""

    suite: str
    build_files: dict[str, str]
    """``scripts/node-image/`` file -> sha256 (build.sh, packages.txt, files/, pause/)."""
    go_binaries: str
    """:func:`gpufleet.local.binaries.cache_key`: Kubernetes, etcd, KWOK versions + go.sum hash."""
    requirements: tuple[str, ...]
    """The venv's pinned packages (``name==version``)."""

    @classmethod
    def of_checkout(cls, repo: Path | None = None) -> Inputs:
        repo = repo or _repo()
        return cls(
            suite=SUITE,
            build_files=tree_digests(scripts_dir(repo)),
            go_binaries=binaries.cache_key(repo / "deps"),
            requirements=tuple(node_requirements()),
        )

    def as_json(self) -> dict[str, object]:
        return {
            "schema": KEY_SCHEMA,
            "suite": self.suite,
            "build_files": dict(sorted(self.build_files.items())),
            "go_binaries": self.go_binaries,
            "requirements": list(self.requirements),
        }

    def key(self) -> str:
        """``<suite>-k8s-<version>-<12 hex>``: readable, and different for any change."""
        blob = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":")).encode()
        m = re.match(r"k8s-(v[^-]+)-", self.go_binaries)
        k8s = m.group(1) if m else "unknown"
        return f"{self.suite}-k8s-{k8s}-{hashlib.sha256(blob).hexdigest()[:12]}"


# ----------------------------------------------------------- the cache entry


@dataclass(frozen=True)
class NodeImage:
    """A complete cache entry (what :func:`find` returns)."""

    directory: Path
    manifest: dict[str, object]

    @property
    def key(self) -> str:
        return str(self.manifest["key"])

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs.squashfs"

    def sizes(self) -> dict[str, int]:
        files = self.manifest.get("files", {})
        assert isinstance(files, dict)
        return {name: int(info["bytes"]) for name, info in files.items()}


def _complete(directory: Path, key: str) -> NodeImage | None:
    """The entry in ``directory`` if its manifest names ``key`` and every file has its size."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != set(IMAGE_FILES):
        return None
    for name, info in files.items():
        try:
            if (directory / name).stat().st_size != int(info["bytes"]):
                return None
        except (OSError, KeyError, TypeError, ValueError):
            return None
    return NodeImage(directory, manifest)


def find(key: str | None = None, root: Path | None = None) -> NodeImage | None:
    """The cached image for ``key`` (default: this checkout's inputs), or None."""
    root = root or cache_root()
    key = key or Inputs.of_checkout().key()
    return _complete(root / key, key)


def require(key: str | None = None) -> NodeImage:
    """Like :func:`find`, but a missing image is an error that says how to build it."""
    image = find(key)
    if image is None:
        raise NodeImageError(
            f"no node image for this checkout in {cache_root()}: "
            "run `gpufleet local image build` (about 5 minutes, as root)"
        )
    return image


# -------------------------------------------------------------- the build


@dataclass
class BuildReport:
    image: NodeImage
    built: bool
    """False when the cache already had it."""
    seconds: float
    steps: list[tuple[str, float]] = field(default_factory=list)


@contextlib.contextmanager
def build_lock(root: Path, progress: Progress, what: str = "node image") -> Iterator[None]:
    """One build at a time per cache directory (also :mod:`gpufleet.local.slurm_root`'s)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another {what} build is running: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_builds(staging: Path) -> list[Path]:
    """Delete ``<staging>/<key>-<pid>`` directories whose builder is gone; returns them."""
    removed = []
    for path in staging.glob("*"):
        m = re.search(r"-(\d+)$", path.name)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def fresh_staging(root: Path, key: str, progress: Progress) -> Path:
    """An empty ``<staging>/<key>-<pid>`` for a build of ``key`` under cache ``root``,
    after removing what interrupted builds left (also :mod:`slurm_root`'s and
    :mod:`images`')."""
    for stale in remove_stale_builds(staging_root(root)):
        progress(f"removed an interrupted build: {stale}")
    staging = staging_root(root) / f"{key}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def write_manifest(
    staging: Path, key: str, inputs: Inputs, extra: dict[str, object]
) -> dict[str, object]:
    """Write ``manifest.json`` (sizes and sha256 of the image files) and fsync it."""
    files: dict[str, dict[str, object]] = {}
    for name in IMAGE_FILES:
        path = staging / name
        if not path.is_file():
            raise NodeImageError(f"the build left no {name} in {staging}")
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        files[name] = {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}
    manifest = {"key": key, "files": files, "inputs": inputs.as_json(), **extra}
    tmp = staging / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / MANIFEST)
    return manifest


def publish(staging: Path, final: Path) -> None:
    """Move a finished build into place; an older entry of the same key is replaced."""
    if final.exists():
        old = staging.with_name(f"old-{final.name}-{os.getpid()}")
        os.rename(final, old)
        os.rename(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune(root: Path, keep: int, current: str) -> list[Path]:
    """Delete all but the ``keep`` newest entries under ``root`` (``current`` always stays)."""
    entries = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    kept = [p for p in entries if p.name == current]
    removed = []
    for path in entries:
        if path.name == current:
            continue
        if len(kept) < keep:
            kept.append(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


Builder = Callable[[Path, Inputs, Progress], dict[str, object]]
"""Fills a staging directory with IMAGE_FILES; returns extra manifest fields."""


def build(
    *,
    inputs: Inputs | None = None,
    rebuild: bool = False,
    progress: Progress = print,
    root: Path | None = None,
    builder: Builder | None = None,
) -> BuildReport:
    """Return the cached image for ``inputs``, building it first when it is missing.

    One build at a time per cache (a lock file); the result appears under its
    key only once complete. ``builder`` defaults to :func:`run_build_script`.
    """
    start = time.monotonic()
    root = root or cache_root()
    inputs = inputs or Inputs.of_checkout()
    key = inputs.key()
    with build_lock(root, progress):
        if not rebuild and (image := _complete(root / key, key)) is not None:
            return BuildReport(image, built=False, seconds=time.monotonic() - start)
        staging = fresh_staging(root, key, progress)
        try:
            extra = (builder or run_build_script)(staging, inputs, progress)
            extra = {
                **extra,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.monotonic() - start, 1),
            }
            write_manifest(staging, key, inputs, extra)
            publish(staging, root / key)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        for old in prune(root, KEEP_ENTRIES, key):
            progress(f"removed an older node image: {old.name}")
    image = _complete(root / key, key)
    assert image is not None
    recorded = image.manifest.get("steps", [])
    steps = [(str(s[0]), float(s[1])) for s in recorded] if isinstance(recorded, list) else []
    return BuildReport(image, built=True, seconds=time.monotonic() - start, steps=steps)


# ------------------------------------------------- what the build script needs


def host_mirror(sources: Sequence[Path] | None = None) -> str:
    """The Debian mirror this host's apt uses (not its security archive)."""
    if sources is None:
        sources = [
            Path("/etc/apt/sources.list"),
            *sorted(Path("/etc/apt/sources.list.d").glob("*")),
        ]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^\s*(?:URIs:|deb(?:\s+\[[^\]]*\])?)\s+(\S+)", text, re.MULTILINE):
            uri = m.group(1).rstrip("/")
            if uri.startswith(("http://", "https://")) and uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


HOST_TOOLS = (("debootstrap", "debootstrap"), ("mksquashfs", "squashfs-tools"))
"""(executable, Debian package) the node image build runs on the host."""


def check_host(
    mirror: str,
    suite: str,
    free_under: Path,
    *,
    tools: Sequence[tuple[str, str]] = HOST_TOOLS,
    what: str = "the node image",
) -> None:
    """Fail early and clearly: root, the host tools (debootstrap...), disk, the mirror."""
    problems = []
    if os.geteuid() != 0:
        problems.append("needs root (debootstrap, chroot and mounts): run it as root")
    for tool, package in tools:
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            problems.append(f"{tool} is missing: apt-get install {package}")
    free_under.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(free_under).free
    if free < 3 << 30:
        problems.append(f"{free / 2**30:.1f} GiB free under {free_under}; the build needs 3 GiB")
    url = f"{mirror}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=15):
            pass
    except (urllib.error.URLError, OSError) as exc:
        problems.append(f"the Debian mirror does not answer ({url}: {exc})")
    if problems:
        raise NodeImageError(f"cannot build {what}:\n  " + "\n  ".join(problems))


def _run(cmd: Sequence[str | Path], what: str, **kw: object) -> None:
    result = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        check=False,
        **kw,  # type: ignore[call-overload]
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise NodeImageError(f"{what} failed (exit {result.returncode}):\n{tail}")


def go_build(repo: Path, sources: Path, binary: Path) -> None:
    """A static binary of the Go module at ``sources`` (no cgo; the module proxy fills the
    cache); raises :class:`NodeImageError` naming what failed."""
    go = subprocess.run(
        [str(repo / "scripts" / "find-go.sh")], capture_output=True, text=True, check=False
    )
    if go.returncode != 0:
        raise NodeImageError(f"no Go toolchain for {sources.name}: {go.stderr.strip()}")
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOFLAGS": "-mod=readonly -buildvcs=false",
        "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "auto"),
    }
    _run(
        [go.stdout.strip(), "build", "-trimpath", "-ldflags", "-s -w", "-o", binary, "."],
        f"go build of {sources.relative_to(repo) if sources.is_relative_to(repo) else sources}",
        cwd=sources,
        env=env,
        timeout=1800,
    )


def build_static_image(repo: Path, out: Path, name: str, reference: str) -> Path:
    """Build ``scripts/node-image/<name>`` (static Go, no dependencies) into ``out`` and
    pack it as an OCI image tar named ``reference``; returns the tar."""
    binary = out / name
    go_build(repo, scripts_dir(repo) / name, binary)
    tar = out / f"{name}.tar"
    oci.write_single_binary_image(binary, tar, reference=reference)
    return tar


def wheel_platforms() -> list[str]:
    """manylinux tags glibc 2.41 (Debian 13) can run, newest first, then pure wheels."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(41, 16, -1)]
    return [*tags, "manylinux2014_x86_64", "linux_x86_64", "any"]


def download_wheels(requirements: Sequence[str], out: Path) -> None:
    """Wheels of the pinned requirements for the suite's Python, through pip's configured index."""
    req_file = out / "requirements.txt"
    req_file.write_text("\n".join(requirements) + "\n")
    wheels = out / "wheels"
    wheels.mkdir(exist_ok=True)
    cmd: list[str | Path] = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", SUITE_PYTHON, "--implementation", "cp",
        "--abi", "cp" + SUITE_PYTHON.replace(".", ""), "--abi", "abi3", "--abi", "none",
        "-d", wheels, "-r", req_file,
    ]  # fmt: skip
    for platform in wheel_platforms():
        cmd += ["--platform", platform]
    _run(cmd, f"pip download of the agent's dependencies for Python {SUITE_PYTHON}")


_STEP = re.compile(r"^== \[(\d+)/(\d+)\] (.*) \((\d+) s\)$")


def run_build_script(staging: Path, inputs: Inputs, progress: Progress) -> dict[str, object]:
    """The real builder: inputs into ``staging/.inputs``, then scripts/node-image/build.sh."""
    repo = _repo()
    mirror = os.environ.get("GPUFLEET_DEBIAN_MIRROR") or host_mirror()
    check_host(mirror, inputs.suite, staging)
    bin_dir = binaries.go_bin_dir()
    for name in ("kubelet", "kubeadm", "kube-proxy"):
        if not os.access(bin_dir / name, os.X_OK):
            raise NodeImageError(
                f"{bin_dir / name} is missing: run scripts/build-go-binaries.sh first"
            )
    work_inputs = staging / ".inputs"
    work_inputs.mkdir()
    progress(
        "== pause and netcheck images (Go, static), the agent's wheels for Python " + SUITE_PYTHON
    )
    pause_tar = build_static_image(repo, work_inputs, "pause", PAUSE_REFERENCE)
    netcheck_tar = build_static_image(repo, work_inputs, "netcheck", NETCHECK_REFERENCE)
    download_wheels(inputs.requirements, work_inputs)
    cmd = [
        str(scripts_dir(repo) / "build.sh"),
        "--out", str(staging), "--work", str(staging / ".work"),
        "--mirror", mirror, "--suite", inputs.suite,
        "--kubelet", str(bin_dir / "kubelet"), "--kubeadm", str(bin_dir / "kubeadm"),
        "--kube-proxy", str(bin_dir / "kube-proxy"),
        "--pause-tar", str(pause_tar), "--netcheck-tar", str(netcheck_tar),
        "--requirements", str(work_inputs / "requirements.txt"),
        "--wheels", str(work_inputs / "wheels"),
    ]  # fmt: skip
    steps: list[tuple[str, float]] = []
    last: tuple[str, float] | None = None
    started = time.monotonic()
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            line = line.rstrip("\n")
            progress(line)
            tail = [*tail[-20:], line]
            if m := _STEP.match(line):
                now = time.monotonic() - started
                if last is not None:
                    steps.append((last[0], round(now - last[1], 1)))
                last = (m.group(3), now)
        code = proc.wait()
    if last is not None:
        steps.append((last[0], round(time.monotonic() - started - last[1], 1)))
    if code != 0:
        raise NodeImageError(f"scripts/node-image/build.sh failed (exit {code})")
    shutil.rmtree(work_inputs, ignore_errors=True)
    kernel = (staging / "kernel-version").read_text().strip()
    packages = dict(
        line.split("\t", 1) for line in (staging / "packages.tsv").read_text().splitlines() if line
    )
    return {
        "mirror": mirror,
        "kernel": kernel,
        "debian_packages": len(packages),
        "versions": {
            name: packages.get(name, "")
            for name in ("linux-image-amd64", "systemd", "containerd", "runc", "cloud-init")
        }
        | {"python3": packages.get("python3", "")},
        "pause_image": PAUSE_REFERENCE,
        "images": [PAUSE_REFERENCE, NETCHECK_REFERENCE],
        "steps": steps,
    }
