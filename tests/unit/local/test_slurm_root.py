"""The Slurm 24.11 root: its cache key and the wrappers that enter it (no root needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpufleet.local import slurm_root


def test_the_key_follows_the_build_files() -> None:
    a = slurm_root.Inputs("trixie", {"build.sh": "1", "packages.txt": "2"})
    b = slurm_root.Inputs("trixie", {"build.sh": "1", "packages.txt": "3"})
    assert a.key() == slurm_root.Inputs("trixie", dict(a.build_files)).key()
    assert a.key() != b.key() and a.key().startswith("trixie-slurm-")


def test_the_checkout_key_covers_the_build_script_and_the_containerfiles_run_steps() -> None:
    inputs = slurm_root.Inputs.of_checkout()
    assert "build.sh" in inputs.build_files
    ((command, env),) = inputs.steps
    assert "slurmctld" in command and "slurm-wlm-jwt-plugin" in command
    assert dict(env)["SLURM_VERSION"] == "24.11.5"
    changed = slurm_root.Inputs(inputs.suite, inputs.build_files, ((command + " sackd", env),))
    assert changed.key() != inputs.key()


def test_a_missing_root_is_not_found(tmp_path: Path) -> None:
    assert slurm_root.find("trixie-slurm-000000000000", root=tmp_path) is None


def test_wrappers_enter_the_holder_and_use_the_roots_path(tmp_path: Path) -> None:
    paths = slurm_root.write_wrappers(tmp_path / "bin", tmp_path / "rootfs", tmp_path / "pid")
    assert set(paths) == set(slurm_root.COMMANDS)
    text = paths["scontrol"].read_text()
    assert "nsenter --mount=/proc/$pid/ns/mnt" in text and f"PATH={slurm_root.ROOT_PATH};" in text
    # Not mounted (no holder pid file): a clear failure, not a hang.
    r = subprocess.run([paths["sinfo"]], capture_output=True, text=True, timeout=10)
    assert r.returncode == 127 and "not mounted" in r.stderr


def test_a_controller_runs_under_its_own_hostname_with_its_own_pid_directory(
    tmp_path: Path,
) -> None:
    pid = tmp_path / "pid"
    pid.write_text("4242\n")
    argv = slurm_root.controller_argv(
        ["slurmctld", "-D"], tmp_path / "rootfs", pid, "ctld-1", tmp_path / "own", tmp_path / "at"
    )
    # In the holder's mount namespace, then hostname and mount namespaces of its own.
    assert argv[:2] == ["nsenter", "--mount=/proc/4242/ns/mnt"]
    assert argv[3:9] == ["unshare", "--uts", "--mount", "--propagation", "private", "--"]
    script = argv[11]
    assert 'hostname "$1"' in script and 'mount --bind "$2" "$3"' in script
    assert argv[-7:] == [
        "ctld-1", str(tmp_path / "own"), f"{tmp_path}/rootfs{tmp_path}/at",
        str(tmp_path / "rootfs"), slurm_root.ROOT_PATH, "slurmctld", "-D",
    ]  # fmt: skip
