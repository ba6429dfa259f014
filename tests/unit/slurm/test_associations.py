"""The Slurm port of tenants: sacctmgr's and squeue's output read once, and each op as
the sacctmgr arguments it runs (gpufleet.slurm.associations). On real daemons:
tests/integration/test_slurm_tenancy.py."""

from __future__ import annotations

import pytest

from gpufleet.api import slurmcluster as crd
from gpufleet.domain.tenancy import (
    AddAccount,
    AddUser,
    RemoveAccount,
    RemoveUser,
    SetGpuLimit,
    SetQos,
    SlurmAccount,
)
from gpufleet.slurm import associations as assoc
from gpufleet.slurm import render

ACCOUNTS = "root|default root account\nvision|gpufleet tenant vision\n"
ASSOCS = (
    "root||||normal|\n"
    "root|root|||normal|\n"
    "vision|||cpu=64,gres/gpu=16|high,normal|normal\n"
    "vision|alice|||high,normal|\n"
    "vision|bob|batch||normal|\n"
)
RUNNING = (
    "vision|cpu=1,mem=500M,node=1,billing=1,gres/gpu=3|\n"
    "vision|cpu=2,mem=1G,node=2,billing=2,gres/gpu=16|\n"
    "root|cpu=1,mem=500M,node=1,billing=1|\n"
)


def test_the_three_outputs_make_what_the_port_reads() -> None:
    got = assoc.tenancy(
        assoc.parse_accounts(ACCOUNTS),
        assoc.parse_associations(ASSOCS),
        assoc.parse_running(RUNNING),
    )
    assert got.accounts["vision"] == SlurmAccount(
        name="vision",
        description="gpufleet tenant vision",
        users=frozenset({"alice", "bob"}),
        gpu_limit=16,
        qos=frozenset({"high", "normal"}),
        default_qos="normal",
    )
    assert got.accounts["root"].gpu_limit is None and got.accounts["root"].users == {"root"}
    assert got.gpus_running == {"vision": 19, "root": 0}


def test_an_account_without_an_association_here_reads_empty() -> None:
    got = assoc.tenancy({"lab": "physics"}, [], {})
    assert got.accounts["lab"].users == frozenset() and got.accounts["lab"].qos == frozenset()


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (assoc.parse_accounts, "vision\n"),
        (assoc.parse_associations, "vision|alice|normal\n"),
        (assoc.parse_associations, "vision||||gres/gpu=lots|normal|\n"),
        (assoc.parse_running, "vision cpu=1\n"),
    ],
)
def test_output_in_another_shape_is_refused_not_guessed(parse: object, text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)  # type: ignore[operator]


def test_each_op_is_one_sacctmgr_command() -> None:
    on = "cluster=gpufleet"
    assert assoc.sacctmgr_args(AddAccount("vision", "gpufleet tenant vision"), "gpufleet") == [
        "add", "account", "vision", "description=gpufleet tenant vision",
        "organization=gpufleet", on,
    ]  # fmt: skip
    assert assoc.sacctmgr_args(SetGpuLimit("vision", 8)) == [
        "modify", "account", "where", "name=vision", "set", "GrpTRES=gres/gpu=8",
    ]  # fmt: skip
    assert assoc.sacctmgr_args(SetGpuLimit("vision", None))[-1] == "GrpTRES=gres/gpu=-1"
    assert assoc.sacctmgr_args(SetQos("vision", frozenset({"normal", "high"}), None))[-2:] == [
        "QOS=high,normal", "DefaultQOS=-1",
    ]  # fmt: skip
    assert assoc.sacctmgr_args(AddUser("alice", "vision"), "gpufleet") == [
        "add", "user", "alice", "account=vision", on,
    ]  # fmt: skip
    assert assoc.sacctmgr_args(RemoveUser("alice", "vision")) == [
        "remove", "user", "where", "name=alice", "account=vision",
    ]  # fmt: skip
    # The account itself goes, not only its association on one cluster.
    assert assoc.sacctmgr_args(RemoveAccount("vision"), "gpufleet") == [
        "remove", "account", "where", "name=vision",
    ]  # fmt: skip


NODES = [render.NodeInfo("n0", {"gpu": "true"}, "10.0.0.1")]


def test_the_operator_renders_enforcement_only_when_asked() -> None:
    base = {
        "nodePools": [{"name": "gpu", "nodeSelector": {"gpu": "true"}, "gpuType": "h100"}],
        "partitions": [{"name": "batch", "pools": ["gpu"], "default": True}],
        "accounting": {"enabled": True},
    }
    spec = crd.SlurmClusterSpec.model_validate(base)
    assert "AccountingStorageEnforce" not in render.render_all(spec, NODES)["slurm.conf"]
    on = crd.SlurmClusterSpec.model_validate(
        {**base, "accounting": {"enabled": True, "enforceLimits": True}}
    )
    conf = render.render_all(on, NODES)["slurm.conf"].splitlines()
    assert "AccountingStorageEnforce=associations,limits,qos,safe" in conf
