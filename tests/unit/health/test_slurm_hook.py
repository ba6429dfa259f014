"""``gpufleet health check --slurm``: bounded, drains only on a failed check, and its
own failures (a hang, a crash, no verdict) never drain a node nor fail a job."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest

from gpufleet.health import slurm_hook
from gpufleet.health.results import CheckStatus
from gpufleet.health.slurm_hook import Mode


def fake_scontrol(tmp_path: Path, state: str = "IDLE") -> tuple[str, Path]:
    """A stand-in for scontrol that prints a real ``show node -o`` line and logs its calls."""
    calls = tmp_path / "calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'if [ "$1" = show ]; then\n'
        f'  echo "NodeName=$3 Arch=x86_64 CoresPerSocket=8 CPUAlloc=0 State={state} '
        'ThreadsPerCore=1 Reason=none"\n'
        "fi\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), calls


def verdict(status: str, *checks: tuple[str, str, str]) -> list[str]:
    doc = {
        "status": status,
        "checks": [{"name": n, "status": s, "reason": r} for n, s, r in checks],
    }
    return [sys.executable, "-c", f"print({json.dumps(json.dumps(doc))})"]


def test_a_failed_check_drains_the_node_with_a_gpufleet_health_reason(tmp_path: Path) -> None:
    scontrol, calls = fake_scontrol(tmp_path)
    argv = verdict("fail", ("gpu-count", "fail", "7 of 8 GPUs visible"), ("nvlink", "pass", ""))
    r = slurm_hook.run_hook(Mode.PROLOG, "gpu-node-1", argv, timeout_s=30, scontrol=scontrol)
    assert r.outcome.status is CheckStatus.CRITICAL and r.drained and r.exit_code == 1
    log = calls.read_text().splitlines()
    assert log[0] == "show node gpu-node-1 -o"
    reason = "gpufleet: health gpu-count: 7 of 8 GPUs visible"
    assert log[1] == f"update nodename=gpu-node-1 state=DRAIN reason={reason}"


def test_an_already_drained_node_keeps_its_reason(tmp_path: Path) -> None:
    scontrol, calls = fake_scontrol(tmp_path, state="IDLE+DRAIN")
    argv = verdict("fail", ("gpu-xid", "fail", "xid79 gpu3"))
    r = slurm_hook.run_hook(Mode.HEALTH, "gpu-node-1", argv, timeout_s=30, scontrol=scontrol)
    assert not r.drained and r.exit_code == 2 and "drained already" in r.note
    assert len(calls.read_text().splitlines()) == 1


def test_a_hung_check_is_killed_at_the_bound_and_drains_nothing(tmp_path: Path) -> None:
    scontrol, calls = fake_scontrol(tmp_path)
    hung = [sys.executable, "-c", "import time; time.sleep(600)"]
    r = slurm_hook.run_hook(Mode.PROLOG, "gpu-node-1", hung, timeout_s=1.0, scontrol=scontrol)
    assert r.outcome.status is CheckStatus.UNKNOWN
    assert "did not finish within 1s" in r.outcome.summary
    assert r.exit_code == 0 and not r.drained and not calls.exists()


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-c", "raise RuntimeError('bug in a check')"],
        [sys.executable, "-c", "print('not json')"],
        ["/nonexistent/gpufleet"],
    ],
    ids=["crash", "garbage", "missing"],
)
def test_gpufleet_s_own_failure_is_unknown_never_a_drain(tmp_path: Path, argv: list[str]) -> None:
    scontrol, calls = fake_scontrol(tmp_path)
    for mode in Mode:
        r = slurm_hook.run_hook(mode, "gpu-node-1", argv, timeout_s=30, scontrol=scontrol)
        assert r.outcome.status is CheckStatus.UNKNOWN and not r.drained
        assert r.exit_code == (3 if mode is Mode.HEALTH else 0)
    assert not calls.exists()


def test_exit_codes_fail_only_a_prolog_and_only_for_a_failed_check() -> None:
    assert [slurm_hook.exit_code(Mode.PROLOG, s) for s in CheckStatus] == [0, 0, 1, 0]
    assert [slurm_hook.exit_code(Mode.EPILOG, s) for s in CheckStatus] == [0, 0, 0, 0]
    assert [slurm_hook.exit_code(Mode.HEALTH, s) for s in CheckStatus] == [0, 1, 2, 3]


def test_a_warning_drains_nothing(tmp_path: Path) -> None:
    scontrol, calls = fake_scontrol(tmp_path)
    argv = verdict("warn", ("thermal", "warn", "GPU 2 at 86 C"))
    r = slurm_hook.run_hook(Mode.PROLOG, "n", argv, timeout_s=30, scontrol=scontrol)
    assert r.outcome.status is CheckStatus.WARNING and r.exit_code == 0 and not r.drained
    assert not calls.exists()


def test_the_reason_is_one_line_and_bounded() -> None:
    reason = slurm_hook.drain_reason("gemm: slow\n" + "x" * 500)
    assert reason.startswith("gpufleet: health gemm: slow x")
    assert "\n" not in reason and len(reason) == slurm_hook.MAX_REASON_LEN


def test_in_a_fork_a_verdict_is_read_a_hang_is_killed_and_a_crash_is_unknown(
    tmp_path: Path,
) -> None:
    scontrol, calls = fake_scontrol(tmp_path)

    def failing() -> None:
        doc = {"status": "fail", "checks": [{"name": "gpu-count", "status": "fail", "reason": "7"}]}
        print(json.dumps(doc))

    def hanging() -> None:
        time.sleep(600)

    def crashing() -> None:
        raise RuntimeError("bug in a check")

    r = slurm_hook.run_hook(Mode.PROLOG, "n1", failing, timeout_s=30, scontrol=scontrol)
    assert r.outcome.status is CheckStatus.CRITICAL and r.drained and r.exit_code == 1
    r = slurm_hook.run_hook(Mode.PROLOG, "n1", hanging, timeout_s=1, scontrol=scontrol)
    assert r.outcome.status is CheckStatus.UNKNOWN and "within 1s" in r.outcome.summary
    assert r.exit_code == 0 and not r.drained
    r = slurm_hook.run_hook(Mode.PROLOG, "n1", crashing, timeout_s=30, scontrol=scontrol)
    assert r.outcome.status is CheckStatus.UNKNOWN and "bug in a check" in r.outcome.summary
    assert r.exit_code == 0 and not r.drained
    assert len(calls.read_text().splitlines()) == 2  # only the failing run read and drained
