"""``gpufleet local down`` with a batch job running leaves no slurmstepd behind.

A batch job's ``slurmstepd: [N.batch]`` leaves slurmd's process group, runs in
the job's working directory (here outside the run directory) and does not name
the run directory on its command line; the teardown sweep finds it by the
SLURM_CONF it inherited from slurmd.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpufleet.local import processes
from gpufleet.local.cluster import TEMP_PREFIX, load_info

pytestmark = pytest.mark.integration


def _stepds() -> dict[int, str]:
    """Every slurmstepd on the machine: pid -> command line."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith("slurmstepd"):
            found[int(entry.name)] = cmdline.strip()
    return found


def test_down_ends_the_slurmstepd_of_a_running_batch_job() -> None:
    run_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    run_dir.chmod(0o755)
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-jobdir-"))
    workdir.chmod(0o777)
    cli = [sys.executable, "-m", "gpufleet.cli.main", "local"]
    before = set(_stepds())
    up = subprocess.run(
        [*cli, "up", "--nodes", "1", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        info = load_info(run_dir)
        job = subprocess.run(
            ["sbatch", "--parsable", "-D", str(workdir), "--wrap", "sleep 600"],
            env=info.slurm_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert job.returncode == 0, job.stderr
        job_id = job.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 60
        ours: dict[int, str] = {}
        while time.monotonic() < deadline and not ours:
            ours = {p: c for p, c in _stepds().items() if p not in before and f"[{job_id}." in c}
            time.sleep(0.2)
        assert ours, f"no slurmstepd for job {job_id} appeared"
    finally:
        down = subprocess.run(
            [*cli, "down", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=90
        )
    assert down.returncode == 0, down.stderr
    left = {p: c for p, c in _stepds().items() if p in ours}
    assert not left, f"slurmstepd left behind by local down: {left}"
    assert processes.processes_using(run_dir) == []
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)
