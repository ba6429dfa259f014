"""Tenants' isolation in the rendered Slurm config: PrivateData, each job's private /tmp."""

from __future__ import annotations

import pydantic
import pytest

from gpufleet.api import slurmcluster as crd
from gpufleet.domain import slurm_isolation
from gpufleet.slurm import render

BASE = {
    "nodePools": [{"name": "h100", "nodeSelector": {"gpu": "true"}}],
    "partitions": [{"name": "batch", "pools": ["h100"], "default": True}],
}
NODES = [render.NodeInfo("n0", {"gpu": "true"}, "10.0.0.1")]


def spec(**extra: object) -> crd.SlurmClusterSpec:
    return crd.SlurmClusterSpec.model_validate({**BASE, **extra})


def test_by_default_each_user_sees_only_their_own_and_no_job_container() -> None:
    data = render.render_all(spec(), NODES)
    conf = data["slurm.conf"].splitlines()
    assert "PrivateData=accounts,jobs,usage,users" in conf
    assert not [line for line in conf if line.startswith(("JobContainerType", "PrologFlags"))]
    assert "job_container.conf" not in data


def test_private_data_can_be_narrowed_or_turned_off() -> None:
    conf = render.render_all(spec(isolation={"privateData": ["jobs"]}), NODES)["slurm.conf"]
    assert "PrivateData=jobs" in conf.splitlines()
    off = render.render_all(spec(isolation={"privateData": []}), NODES)["slurm.conf"]
    assert "PrivateData" not in off


def test_an_unknown_private_data_kind_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="privateData"):
        spec(isolation={"privateData": ["everything"]})


def test_job_tmpfs_renders_the_plugin_contain_and_its_file() -> None:
    data = render.render_all(spec(isolation={"jobTmpfs": True}), NODES)
    conf = data["slurm.conf"].splitlines()
    assert "JobContainerType=job_container/tmpfs" in conf
    assert "PrologFlags=Contain" in conf
    jc = data["job_container.conf"].splitlines()
    assert "AutoBasePath=true" in jc and "BasePath=/var/spool/slurmd/job-tmp" in jc
    assert "Dirs=/tmp,/dev/shm" in jc


def test_contain_shares_one_prolog_flags_line_with_the_preflight() -> None:
    """slurmctld keeps only the last PrologFlags line: Alloc and Contain go on one."""
    s = spec(isolation={"jobTmpfs": True}, healthChecks={"enabled": True, "preflight": True})
    conf = render.render_all(s, NODES)["slurm.conf"].splitlines()
    flags = [line for line in conf if line.startswith("PrologFlags")]
    assert flags == ["PrologFlags=Alloc,Contain"]


def test_a_base_path_that_is_no_absolute_path_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="jobTmpfsBasePath"):
        spec(isolation={"jobTmpfs": True, "jobTmpfsBasePath": "tmp; rm -rf /"})


@pytest.mark.parametrize("path", ["/tmp", "/tmp/jobs", "/dev/shm/x"])
def test_a_base_path_under_a_private_dir_is_refused(path: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="each job gets its own of"):
        spec(isolation={"jobTmpfs": True, "jobTmpfsBasePath": path})
    assert spec(isolation={"jobTmpfsBasePath": "/tmpfs-jobs"}).isolation.job_tmpfs is False


def test_merge_prolog_flags_folds_every_line_into_the_first() -> None:
    lines = ["A=1", "PrologFlags=Alloc", "B=2", "PrologFlags=X11"]
    assert slurm_isolation.merge_prolog_flags(lines, ["Contain"]) == [
        "A=1",
        "PrologFlags=Alloc,Contain,X11",
        "B=2",
    ]
    assert slurm_isolation.merge_prolog_flags(["A=1"], []) == ["A=1"]
    assert slurm_isolation.merge_prolog_flags(["A=1"], ["Contain"]) == [
        "A=1",
        "PrologFlags=Contain",
    ]


def test_per_node_base_paths_for_several_slurmds_on_one_host() -> None:
    conf = slurm_isolation.job_container_conf(per_node=[("n0", "/r/n0"), ("n1", "/r/n1")])
    assert conf.splitlines()[1:] == [
        "AutoBasePath=true",
        "Dirs=/tmp,/dev/shm",
        "NodeName=n0 BasePath=/r/n0",
        "NodeName=n1 BasePath=/r/n1",
    ]
