"""A root filesystem holding Slurm 24.11 (Debian 13's packages), and running in it.

The host's Slurm is Debian 12's 22.05. To run the current Slurm on the same
machine without replacing it, the local cluster chroots its Slurm daemons and
commands into a tree debootstrapped from Debian 13:

    ~/.cache/gpufleet/slurm-root/<key>/{root/,packages.tsv,manifest.json}

The tree is the Slurm image of ``images/slurm/Containerfile``, built locally: its
``FROM docker.io/library/debian:<suite>-slim`` is a ``debootstrap --variant=minbase``
of that suite (``scripts/slurm-root/build.sh``), and its RUN steps run chrooted in
the same tree, so the image has one layer (decision 0181). The key hashes the
suite, the RUN steps with their environment and every file under
``scripts/slurm-root/``. The cache entry is built in a staging directory
and renamed into place once ``manifest.json`` is written, with the node
image's lock, stale-build clean-up and pruning
(:mod:`gpufleet.local.node_image`).

Running in it (:func:`holder_script`, :func:`wrapper_script`): one small
process per cluster, the *holder*, makes a private mount namespace in which
an empty tmpfs gets the tree's ``/usr``, ``/etc``, ``/var`` and ``/opt``
(read-only: clusters share the cache entry) and the host's ``/dev``,
``/proc``, ``/sys``, ``/tmp`` and ``/run``, plus the cluster's run directory at
its own path. Every daemon and command enters that namespace (``nsenter``) and
chroots into the tmpfs. Paths are the same inside and outside, so the
configuration, keys, sockets and logs the harness writes need no
translation; nothing is mounted in the host's namespace, so nothing leaks
and a removal of the run directory cannot reach through a mount.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.local import binaries, containerfile, node_image, release

SUITE = "trixie"
SLURM_VERSION = "24.11"
"""The Slurm release Debian 13 ships (24.11.5): slurmrestd v0.0.40 to v0.0.42."""
MANIFEST = "manifest.json"
KEEP_ENTRIES = 2
KEY_SCHEMA = 1
COMMANDS = (
    "munged",
    "munge",
    "unmunge",
    "slurmctld",
    "slurmd",
    "slurmrestd",
    "scontrol",
    "sinfo",
    "squeue",
    "sbatch",
    "srun",
    "scancel",
    "sacct",
    "sacctmgr",
    "slurmdbd",
)
"""The executables of the tree the local cluster runs, each through a wrapper."""

ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH inside the root (jobs inherit it)."""

Progress = node_image.Progress


class SlurmRootError(RuntimeError):
    """The root cannot be built or found; the message says why and what to do."""


def cache_root() -> Path:
    """``$GPUFLEET_CACHE/slurm-root`` (default ``~/.cache/gpufleet/slurm-root``)."""
    return node_image.cache_root().with_name("slurm-root")


def scripts_dir(repo: Path) -> Path:
    return repo / "scripts" / "slurm-root"


def _repo() -> Path:
    root = binaries.repo_root()
    if root is None:
        raise SlurmRootError(
            "the Slurm root is built from a source checkout (scripts/slurm-root/): "
            "run gpufleet from one (pip install -e .)"
        )
    return root


RunSteps = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
"""(command, environment) of each RUN of the Slurm image's Containerfile."""


def containerfile_steps(repo: Path | None = None) -> RunSteps:
    """The RUN steps of ``images/slurm/Containerfile``, checked to be what this builder
    can run in the debootstrapped tree: a Debian ``FROM`` of :data:`SUITE`, RUNs only."""
    try:
        plan = release.plan("slurm", repo=repo)
    except (containerfile.ContainerfileError, release.ReleaseError) as exc:
        raise SlurmRootError(str(exc)) from exc
    tag = plan.base.rsplit(":", 1)[-1]
    if not plan.base.startswith(release.DEBIAN_IMAGES) or tag.removesuffix("-slim") != SUITE:
        raise SlurmRootError(
            f"images/slurm/Containerfile: FROM {plan.base}: the local build debootstraps "
            f"Debian {SUITE} (docker.io/library/debian:{SUITE}-slim)"
        )
    steps = []
    for step in plan.steps:
        if not isinstance(step, containerfile.RunStep) or step.user not in ("", "0", "root"):
            raise SlurmRootError(
                f"images/slurm/Containerfile:{step.line}: the local build runs RUN steps as "
                "root only in the Slurm root (no COPY, no USER before a RUN)"
            )
        steps.append((step.command, step.env))
    return tuple(steps)


@dataclass(frozen=True)
class Inputs:
    suite: str
    build_files: dict[str, str]
    steps: RunSteps = ()

    @classmethod
    def of_checkout(cls, repo: Path | None = None) -> Inputs:
        repo = repo or _repo()
        return cls(SUITE, node_image.tree_digests(scripts_dir(repo)), containerfile_steps(repo))

    def as_json(self) -> dict[str, object]:
        return {
            "schema": KEY_SCHEMA,
            "suite": self.suite,
            "build_files": dict(sorted(self.build_files.items())),
            "steps": [{"run": command, "env": dict(env)} for command, env in self.steps],
        }

    def key(self) -> str:
        """``<suite>-slurm-<12 hex>``, different for any change of the inputs."""
        blob = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":")).encode()
        return f"{self.suite}-slurm-{hashlib.sha256(blob).hexdigest()[:12]}"


@dataclass(frozen=True)
class SlurmRoot:
    directory: Path
    manifest: dict[str, object]

    @property
    def tree(self) -> Path:
        return self.directory / "root"

    @property
    def version(self) -> str:
        return str(self.manifest.get("slurm", "?"))


def _complete(directory: Path, key: str) -> SlurmRoot | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return None
    if not os.access(directory / "root" / "usr" / "sbin" / "slurmctld", os.X_OK):
        return None
    return SlurmRoot(directory, manifest)


def find(key: str | None = None, root: Path | None = None) -> SlurmRoot | None:
    root = root or cache_root()
    key = key or Inputs.of_checkout().key()
    return _complete(root / key, key)


def require() -> SlurmRoot:
    """The cached root of this checkout, or an error that says how to build it."""
    found = find()
    if found is None:
        raise SlurmRootError(
            f"no Slurm {SLURM_VERSION} root for this checkout in {cache_root()}: "
            "run `gpufleet local slurm-image build` (about a minute, as root)"
        )
    return found


@dataclass
class BuildReport:
    root: SlurmRoot
    built: bool
    seconds: float


def build(*, rebuild: bool = False, progress: Progress = print) -> BuildReport:
    """Return the cached root, building it first when missing (one build at a time)."""
    start = time.monotonic()
    root = cache_root()
    inputs = Inputs.of_checkout()
    key = inputs.key()
    with node_image.build_lock(root, progress, what="Slurm root"):
        if not rebuild and (found := _complete(root / key, key)) is not None:
            return BuildReport(found, built=False, seconds=time.monotonic() - start)
        staging = node_image.fresh_staging(root, key, progress)
        try:
            packages = _run_build_script(staging, inputs, progress)
            manifest = {
                "key": key,
                "inputs": inputs.as_json(),
                "slurm": packages.get("slurmctld", ""),
                "munge": packages.get("munge", ""),
                "debian_packages": len(packages),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.monotonic() - start, 1),
            }
            tmp = staging / (MANIFEST + ".tmp")
            with open(tmp, "w") as f:
                json.dump(manifest, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, staging / MANIFEST)
            node_image.publish(staging, root / key)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        for old in node_image.prune(root, KEEP_ENTRIES, key):
            progress(f"removed an older Slurm root: {old.name}")
    found = _complete(root / key, key)
    assert found is not None
    return BuildReport(found, built=True, seconds=time.monotonic() - start)


def _run_build_script(staging: Path, inputs: Inputs, progress: Progress) -> dict[str, str]:
    mirror = os.environ.get("GPUFLEET_DEBIAN_MIRROR") or node_image.host_mirror()
    try:
        node_image.check_host(
            mirror,
            inputs.suite,
            staging,
            tools=(("debootstrap", "debootstrap"),),
            what="the Slurm root",
        )
    except node_image.NodeImageError as exc:
        raise SlurmRootError(str(exc)) from exc
    steps = staging / ".steps"
    steps.mkdir()
    for n, (command, env) in enumerate(inputs.steps, 1):
        env_vars = {"HOME": "/root", **dict(env)}
        (steps / f"{n:02d}.env").write_text("".join(f"{k}={v}\0" for k, v in env_vars.items()))
        (steps / f"{n:02d}.sh").write_text(command)
    cmd = [
        str(scripts_dir(_repo()) / "build.sh"),
        "--out", str(staging), "--mirror", mirror, "--suite", inputs.suite,
        "--steps", str(steps),
    ]  # fmt: skip
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress(line.rstrip("\n"))
        code = proc.wait()
    shutil.rmtree(steps, ignore_errors=True)
    if code != 0:
        raise SlurmRootError(f"scripts/slurm-root/build.sh failed (exit {code})")
    return dict(
        line.split("\t", 1) for line in (staging / "packages.tsv").read_text().splitlines() if line
    )


# ------------------------------------------------------------- running in it


def holder_script(
    tree: Path, mount_point: Path, run_dir: Path, pid_file: Path, hosts: Path = Path("/etc/hosts")
) -> list[str]:
    """argv of the holder: builds the private namespace, writes its pid, then waits.

    Its pid (the same process all along: ``unshare`` and ``sh`` exec) names the
    namespace the wrappers enter; ``pid_file`` appears only once every mount is
    in place, so it doubles as the readiness signal. ``hosts`` becomes the root's
    ``/etc/hosts`` (the host's own unless a cluster names more hosts; the host's
    file is never changed).
    """
    script = r"""
set -e
tree=$1 mnt=$2 run=$3 pidfile=$4 hosts=$5
mount -t tmpfs -o mode=0755,size=16m gpufleet-slurm-root "$mnt"
for d in usr etc var opt; do mkdir "$mnt/$d"; mount --bind -o ro "$tree/$d" "$mnt/$d"; done
for l in bin sbin lib lib64; do ln -s "usr/$l" "$mnt/$l"; done
for d in dev proc sys; do mkdir "$mnt/$d"; mount --rbind "/$d" "$mnt/$d"; done
for d in tmp run; do mkdir "$mnt/$d"; mount --bind "/$d" "$mnt/$d"; done
mount --bind "$hosts" "$mnt/etc/hosts"
case "$run/" in /tmp/*) ;; *) mkdir -p "$mnt$run"; mount --bind "$run" "$mnt$run" ;; esac
echo $$ > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
exec sleep infinity
"""
    return [
        "unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", script, "slurm-root",
        str(tree), str(mount_point), str(run_dir), str(pid_file), str(hosts),
    ]  # fmt: skip


def wrapper_script(command: str, mount_point: Path, pid_file: Path) -> str:
    """A host executable that runs ``command`` of the tree in the holder's namespace.

    The working directory is kept when it exists inside (under /tmp or the run
    directory), else ``/``. PATH is the root's own: the wrappers' directory is
    visible inside too, and a command found there would enter again, forever.
    The process keeps its pid through every exec, so the harness's process
    records and signals reach the daemon itself.
    """
    mnt, pidf = shlex.quote(str(mount_point)), shlex.quote(str(pid_file))
    return (
        "#!/bin/sh\n"
        f"# {command} of the Slurm {SLURM_VERSION} root (gpufleet.local.slurm_root); generated.\n"
        f"pid=$(cat {pidf}) || "
        f'{{ echo "{command}: the Slurm root is not mounted" >&2; exit 127; }}\n'
        f"exec nsenter --mount=/proc/$pid/ns/mnt -- chroot {mnt} /bin/sh -c "
        f'\'PATH={ROOT_PATH}; export PATH; cd "$1" 2>/dev/null || cd /; shift; exec "$@"\' '
        f'sh "$PWD" {shlex.quote(command)} "$@"\n'
    )


def controller_argv(
    command: Sequence[str], mount_point: Path, pid_file: Path, hostname: str, own: Path, at: Path
) -> list[str]:
    """argv running ``command`` of the tree as one of several slurmctlds on this host.

    Like a wrapper, in the holder's namespace; then in a hostname namespace of its
    own named ``hostname`` (slurmctld finds whether it is the primary or a backup
    by its hostname among the ``SlurmctldHost`` lines) and a mount namespace in
    which ``own`` is mounted on ``at``: the directory of its pid file, which every
    controller names alike (one slurm.conf) and which a starting slurmctld reads
    to stop the one it finds there.
    """
    script = r"""
set -e
hostname "$1"
mount --bind "$2" "$3"
mnt=$4
shift 4
exec chroot "$mnt" /bin/sh -c 'PATH=$0; export PATH; cd /; exec "$@"' "$@"
"""
    return [
        "nsenter", f"--mount=/proc/{pid_file.read_text().strip()}/ns/mnt", "--",
        "unshare", "--uts", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", script, "slurmctld",
        hostname, str(own), f"{mount_point}{at}", str(mount_point), ROOT_PATH, *command,
    ]  # fmt: skip


def write_wrappers(bin_dir: Path, mount_point: Path, pid_file: Path) -> dict[str, Path]:
    """One wrapper per :data:`COMMANDS` entry in ``bin_dir``; name -> path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for command in COMMANDS:
        path = bin_dir / command
        path.write_text(wrapper_script(command, mount_point, pid_file))
        path.chmod(0o755)
        out[command] = path
    return out
