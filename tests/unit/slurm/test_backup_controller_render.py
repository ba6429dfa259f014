"""A backup slurmctld in the rendered slurm.conf: a second SlurmctldHost and its timeout."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.api import slurmcluster as crd
from gpufleet.slurm import render

BASE = {
    "nodePools": [{"name": "h100", "nodeSelector": {"gpu": "true"}}],
    "partitions": [{"name": "batch", "pools": ["h100"], "default": True}],
    "controllerHost": "s-0",
    "controllerAddress": "s-0.s",
}
NODES = [render.NodeInfo("n0", {"gpu": "true"}, "10.0.0.1")]


def conf(**extra: object) -> list[str]:
    spec = crd.SlurmClusterSpec.model_validate({**BASE, **extra})
    return render.render_all(spec, NODES)["slurm.conf"].splitlines()


def controller_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith(("SlurmctldHost=", "SlurmctldTimeout="))]


def test_no_backup_by_default_one_controller_and_slurms_own_timeout() -> None:
    assert controller_lines(conf()) == ["SlurmctldHost=s-0(s-0.s)"]


def test_a_backup_is_the_second_slurmctld_host_with_the_timeout_it_waits() -> None:
    lines = conf(backupControllerHost="s-1", backupControllerAddress="s-1.s")
    # The order is the failover order: every daemon and command tries the primary first.
    assert controller_lines(lines) == [
        "SlurmctldHost=s-0(s-0.s)",
        "SlurmctldHost=s-1(s-1.s)",
        "SlurmctldTimeout=120",
    ]
    assert "StateSaveLocation=/var/spool/slurmctld" in lines  # one, shared by both
    lines = conf(backupControllerHost="s-1", slurmctldTimeout=30)
    assert controller_lines(lines)[1:] == ["SlurmctldHost=s-1", "SlurmctldTimeout=30"]


@pytest.mark.parametrize("field", ["backupControllerHost", "backupControllerAddress"])
@pytest.mark.parametrize("bad", ["s-1\nPrologSlurmctld=/x", "s-1 Foo=1", "s-1#", "s\x00"])
def test_the_backups_names_are_single_names(field: str, bad: str) -> None:
    with pytest.raises(ValidationError):
        crd.SlurmClusterSpec.model_validate({**BASE, "backupControllerHost": "s-1", field: bad})
