"""Where the local cluster finds its executables.

The Go binaries (etcd, kube-*, kubectl, kwok, and the node image's kubelet,
kubeadm and kube-proxy) are built by
``scripts/build-go-binaries.sh`` into ``~/.cache/gpufleet/bin/<key>/``, where
the key names the pinned versions plus a hash of ``deps/*/go.{mod,sum}``. This
module recomputes that key the same way, so a checkout always uses the binaries
its own go.mod files pin, and two checkouts at different versions do not share
a directory. Slurm and munge come from Debian packages on PATH.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

GO_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
    "kwok",
    "kubelet",
    "kubeadm",
    "kube-proxy",
)
SYSTEM_BINARIES = ("munged", "munge", "slurmctld", "slurmd", "slurmrestd", "scontrol", "sinfo")

_FIX = "Run scripts/bootstrap-system.sh (it builds them into ~/.cache/gpufleet)."


class MissingBinaryError(FileNotFoundError):
    """A binary the local cluster needs is not installed."""


def repo_root() -> Path | None:
    """The source checkout this package runs from, if it is one (editable install)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "deps" / "kubernetes" / "go.mod").is_file():
            return parent
    return None


def _require_version(go_mod: str, module: str) -> str:
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", go_mod, re.MULTILINE)
    if not m:
        raise MissingBinaryError(f"cannot read the version of {module} from a deps/ go.mod")
    return m.group(1)


def cache_key(deps: Path) -> str:
    """The cache directory name for the versions pinned under ``deps``.

    Must match scripts/build-go-binaries.sh: versions, then the first 12 hex
    digits of sha256 over kubernetes, etcd, kwok go.mod+go.sum concatenated.
    """
    digest = hashlib.sha256()
    for mod in ("kubernetes", "etcd", "kwok"):
        for name in ("go.mod", "go.sum"):
            digest.update((deps / mod / name).read_bytes())
    k8s = _require_version((deps / "kubernetes/go.mod").read_text(), "k8s.io/kubernetes")
    etcd = _require_version((deps / "etcd/go.mod").read_text(), "go.etcd.io/etcd/server/v3")
    kwok = _require_version((deps / "kwok/go.mod").read_text(), "sigs.k8s.io/kwok")
    return f"k8s-{k8s}-etcd-{etcd}-kwok-{kwok}-{digest.hexdigest()[:12]}"


def go_bin_dir() -> Path:
    """Directory holding the Go binaries.

    ``GPUFLEET_BIN_DIR`` wins; otherwise the cache entry for this checkout's
    pinned versions; outside a checkout, the ``current`` link the build script
    maintains.
    """
    explicit = os.environ.get("GPUFLEET_BIN_DIR")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet"))
    root = repo_root()
    if root is not None:
        return cache / "bin" / cache_key(root / "deps")
    return cache / "bin" / "current"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every executable the local cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kubectl: Path
    kwok: Path
    kubelet: Path
    """Goes into the node image (scripts/node-image/); not run on this host."""
    kubeadm: Path
    """Also for the host: ``kubeadm init phase ...`` against the local control plane."""
    kube_proxy: Path
    """Goes into the node image: Services on the machines (decision 0123)."""
    munged: Path
    munge: Path
    slurmctld: Path
    slurmd: Path
    slurmrestd: Path
    scontrol: Path
    sinfo: Path

    @classmethod
    def locate(cls) -> Binaries:
        """Find every binary, or fail listing all that are missing and how to get them."""
        found: dict[str, Path] = {}
        missing: list[str] = []
        bin_dir = go_bin_dir()
        for name in GO_BINARIES:
            path = bin_dir / name
            if os.access(path, os.X_OK):
                found[name] = path
            else:
                missing.append(str(path))
        for name in SYSTEM_BINARIES:
            which = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
            if which:
                found[name] = Path(which)
            else:
                missing.append(name)
        if missing:
            raise MissingBinaryError(f"missing binaries: {', '.join(missing)}. {_FIX}")
        return cls(**{k.replace("-", "_"): v for k, v in found.items()})
