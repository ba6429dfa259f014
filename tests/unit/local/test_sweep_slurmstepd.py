"""The teardown sweep finds a batch job's slurmstepd by the SLURM_CONF it inherited."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from gpufleet.local import processes


def _start(argv0: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    # `exec -a` gives the process the command line slurmstepd shows: "slurmstepd: [7.batch]".
    proc = subprocess.Popen(
        ["bash", "-c", f'exec -a "{argv0}" sleep 60'], env=env, cwd=cwd, start_new_session=True
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(argv0.encode()):
            return proc
        time.sleep(0.02)
    raise AssertionError("the stand-in did not exec")


def test_a_batch_slurmstepd_outside_the_run_dir_is_swept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "slurm" / "etc").mkdir(parents=True)
    elsewhere = tmp_path / "jobdir"
    elsewhere.mkdir()
    conf = {**os.environ, "SLURM_CONF": str(run / "slurm" / "etc" / "slurm.conf")}
    other_conf = {**os.environ, "SLURM_CONF": str(tmp_path / "other" / "slurm.conf")}
    stepd = _start("slurmstepd: [7.batch]", conf, elsewhere)
    foreign = _start("slurmstepd: [9.batch]", other_conf, elsewhere)  # another cluster's
    try:
        found = processes.processes_using(run)
        assert stepd.pid in found and foreign.pid not in found
        assert stepd.pid in processes.sweep(run, grace=5)
        assert stepd.wait(timeout=5) is not None
        assert foreign.poll() is None
    finally:
        for p in (stepd, foreign):
            p.kill()
            p.wait()
