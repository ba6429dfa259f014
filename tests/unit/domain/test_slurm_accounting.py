"""slurm.conf's accounting lines and slurmdbd.conf (gpufleet.domain.slurm_accounting)."""

from __future__ import annotations

import pytest

from gpufleet.domain import slurm_accounting as acct


def test_no_accounting_gathers_nothing() -> None:
    assert acct.slurm_conf_lines(None) == [
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
    ]


def test_accounting_counts_gpus_and_names_a_private_munge_only_when_asked() -> None:
    lines = acct.slurm_conf_lines("dbd.example", 7000)
    assert "AccountingStorageHost=dbd.example" in lines
    assert "AccountingStoragePort=7000" in lines
    assert "AccountingStorageTRES=gres/gpu" in lines
    assert not [line for line in lines if line.startswith("AccountingStoragePass=")]
    private = acct.slurm_conf_lines("h", munge_socket="/run/x/munge.socket")
    assert "AccountingStoragePass=/run/x/munge.socket" in private
    assert not [line for line in lines if line.startswith("AccountingStorageEnforce=")]


def test_limits_are_enforced_only_when_asked_and_never_without_accounting() -> None:
    lines = acct.slurm_conf_lines("h", enforce_limits=True)
    assert "AccountingStorageEnforce=associations,limits,qos,safe" in lines
    assert not [
        line for line in acct.slurm_conf_lines(None, enforce_limits=True) if "Enforce" in line
    ]


def _config(**overrides: str) -> acct.DbdConfig:
    base = {
        "dbd_host": "dbd-0",
        "storage_host": "mariadb",
        "storage_user": "slurm",
        "storage_password": "s3cret",
        "pid_file": "/run/slurmdbd.pid",
    }
    return acct.DbdConfig(**{**base, **overrides})


def test_slurmdbd_conf_names_the_database_and_its_account() -> None:
    conf = acct.slurmdbd_conf(_config()).splitlines()
    assert "StorageType=accounting_storage/mysql" in conf
    assert "StorageLoc=slurm_acct_db" in conf
    assert "StoragePass=s3cret" in conf
    assert "DbdPort=6819" in conf
    # Optional lines appear only when set.
    assert not [line for line in conf if line.startswith(("DbdAddr=", "LogFile=", "AuthInfo="))]


@pytest.mark.parametrize("password", ["", "two\nlines", " padded "])
def test_a_password_slurmdbd_would_misread_is_refused(password: str) -> None:
    with pytest.raises(ValueError, match="password"):
        acct.slurmdbd_conf(_config(storage_password=password))


def test_tres_as_sacct_prints_it() -> None:
    # sacct -X -P -o AllocTRES, from slurmdbd 24.11.
    tres = acct.parse_tres("billing=8,cpu=8,gres/gpu=8,mem=4000M,node=1")
    assert acct.gpus_of(tres) == 8 and tres["mem"] == "4000M"
    assert acct.gpus_of(acct.parse_tres("billing=1,cpu=1,mem=500M,node=1")) == 0
    assert acct.parse_tres("") == {}
