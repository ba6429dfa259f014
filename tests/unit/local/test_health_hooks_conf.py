"""The local cluster's slurm.conf with gpufleet's hooks turned on, and back."""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.domain import slurm_hooks
from gpufleet.local import slurm


def test_hooks_are_added_and_the_conf_is_restored_exactly(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    original = "ClusterName=x\nSchedulerParameters=sched_interval=1,bf_interval=1\nNodeName=n0\n"
    conf.write_text(original)
    cfg = slurm_hooks.HookConfig(gpufleet="/v/bin/gpufleet", inject_dir=str(tmp_path))
    before = slurm.enable_health_hooks(conf, tmp_path / "hooks", cfg)
    assert before == original
    lines = conf.read_text().splitlines()
    assert "SchedulerParameters=sched_interval=1,bf_interval=1,nohold_on_prolog_fail" in lines
    assert f"Prolog={tmp_path}/hooks/gpufleet-prolog" in lines
    assert f"Epilog={tmp_path}/hooks/gpufleet-epilog" in lines
    assert not any(line.startswith("HealthCheckProgram=") for line in lines)  # interval 0
    assert any(line.startswith("BatchStartTimeout=") for line in lines)
    for mode in slurm_hooks.MODES:
        script = tmp_path / "hooks" / f"gpufleet-{mode}"
        assert os.access(script, os.X_OK)
        assert f"--slurm {mode}" in script.read_text()
        # HealthCheckProgram runs without SLURM_CONF in its environment
        assert f"export SLURM_CONF={conf}" in script.read_text()
    slurm.restore_conf(conf, before)
    assert conf.read_text() == original
