"""A wheel of this gpufleet checkout: what machines install and the gpufleet image holds."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpufleet.local.binaries import repo_root


class WheelError(RuntimeError):
    """The wheel cannot be built; the message says why."""


def build_wheel(out: Path) -> Path:
    """Build ``gpufleet-<version>-py3-none-any.whl`` of this checkout into ``out``.

    Built from a copy of ``src/``, ``pyproject.toml``, ``README.md`` and ``LICENSE`` (building in
    the checkout would leave build/ behind and race other builds), with no index and
    no build isolation: the checkout's venv has the build backend.
    """
    root = repo_root()
    if root is None:
        raise WheelError("the wheel is built from a gpufleet source checkout (pip install -e .)")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("gpufleet-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="gpufleet-wheel-", dir=out) as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(
            root / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy2(root / name, src / name)
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        done = subprocess.run(
            [*pip, "--no-index", "--quiet", "-w", str(out), str(src)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    wheels = sorted(out.glob("gpufleet-*.whl"))
    if done.returncode != 0 or not wheels:
        raise WheelError(f"building the gpufleet wheel failed: {done.stderr[-2000:]}")
    return wheels[-1]
