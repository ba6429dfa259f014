"""Slurm accounting through slurmdbd: the slurm.conf lines and slurmdbd.conf (pure).

The SlurmCluster operator (the chart's Slurm) and the local cluster's
``--slurm-accounting`` render the same accounting lines from here, so the local
test of slurmctld + slurmdbd + MariaDB runs what the operator ships.

GPU use is accounted by naming ``gres/gpu`` in ``AccountingStorageTRES``: without
it sacct's ``AllocTRES`` lists CPUs, memory and nodes only, and a GPU-hour report
per account (what a fleet is paid for) cannot be made. Only the untyped
``gres/gpu`` is named: it counts every GPU whatever its type (``gpu:h100:8``
counts 8), and a typed entry per GPU model would have to follow the fleet's
hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.domain import slurm_isolation

GPU_TRES = "gres/gpu"
"""The trackable resource that counts a job's GPUs (sacct ``AllocTRES``)."""
DEFAULT_DBD_PORT = 6819
"""slurmdbd's registered port."""
DEFAULT_DATABASE = "slurm_acct_db"
"""slurmdbd's default ``StorageLoc``: the database its MariaDB user needs rights on."""
ENFORCE = "associations,limits,qos,safe"
"""``AccountingStorageEnforce`` with limits on (decision 0283): a job runs only under an
association (user, account) slurmdbd knows, within its account's limits (a tenant's
``GrpTRES=gres/gpu=N``) and with a QOS its account may use; ``safe`` starts a job
under a ``GrpTRESMins`` limit only if it can run to its end within it."""


def slurm_conf_lines(
    host: str | None,
    port: int = DEFAULT_DBD_PORT,
    *,
    munge_socket: str | None = None,
    enforce_limits: bool = False,
) -> list[str]:
    """slurm.conf's accounting lines: through slurmdbd at ``host:port``, or none (None).

    ``jobacct_gather/linux`` samples each job's processes for sacct's CPU and memory
    columns; with no accounting there is nowhere to send them, so gathering is off too.
    ``munge_socket``: the munged that signs slurmdbd connections when it is not at
    munge's default socket. Slurm takes it from ``AccountingStoragePass``, not from
    ``AuthInfo`` (which covers slurmctld and slurmd only).
    ``enforce_limits``: :data:`ENFORCE` (tenants' GPU quotas apply; every user who
    submits needs an association). Off, slurmdbd records jobs and limits are not
    checked.
    """
    if host is None:
        return [
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
        ]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={host}",
        f"AccountingStoragePort={port}",
        f"AccountingStorageTRES={GPU_TRES}",
        *([f"AccountingStoragePass={munge_socket}"] if munge_socket else []),
        *([f"AccountingStorageEnforce={ENFORCE}"] if enforce_limits else []),
        "JobAcctGatherType=jobacct_gather/linux",
    ]


@dataclass(frozen=True, slots=True)
class DbdConfig:
    """What slurmdbd.conf says: where slurmdbd listens and the database it writes."""

    dbd_host: str
    """The name slurmdbd answers to (``DbdHost``: its own short host name or a Service)."""
    storage_host: str
    storage_user: str
    storage_password: str
    pid_file: str
    slurm_user: str = "slurm"
    dbd_port: int = DEFAULT_DBD_PORT
    storage_port: int = 3306
    database: str = DEFAULT_DATABASE
    dbd_addr: str | None = None
    """The address slurmdbd binds (``DbdAddr``); None: every address."""
    log_file: str | None = None
    """None: slurmdbd logs to stderr (a pod's log)."""
    auth_info: str | None = None
    """``AuthInfo`` (e.g. ``socket=/path/munge.socket``); None: munge's default socket."""
    private_data: tuple[str, ...] = slurm_isolation.PRIVATE_DATA
    """What sacct and sacctmgr show each user only of their own (``PrivateData``, as
    slurmctld's for squeue; decision 0286); empty: everything visible to everyone."""


def slurmdbd_conf(config: DbdConfig) -> str:
    """slurmdbd.conf. It holds the database password: slurmdbd refuses it unless the
    file is owned by ``SlurmUser`` and readable by no one else (mode 0600)."""
    c = config
    for name, value in (("password", c.storage_password), ("user", c.storage_user)):
        if not value or "\n" in value or value != value.strip():
            raise ValueError(
                f"slurmdbd.conf: the storage {name} must be one line without surrounding blanks"
            )
    lines = [
        "# Rendered by gpufleet (gpufleet.domain.slurm_accounting).",
        "AuthType=auth/munge",
        *([f"AuthInfo={c.auth_info}"] if c.auth_info else []),
        f"DbdHost={c.dbd_host}",
        *([f"DbdAddr={c.dbd_addr}"] if c.dbd_addr else []),
        f"DbdPort={c.dbd_port}",
        f"SlurmUser={c.slurm_user}",
        f"PidFile={c.pid_file}",
        *([f"LogFile={c.log_file}"] if c.log_file else []),
        "StorageType=accounting_storage/mysql",
        f"StorageHost={c.storage_host}",
        f"StoragePort={c.storage_port}",
        f"StorageUser={c.storage_user}",
        f"StoragePass={c.storage_password}",
        f"StorageLoc={c.database}",
        *filter(None, [slurm_isolation.private_data_line(c.private_data)]),
    ]
    return "\n".join(lines) + "\n"


def parse_tres(text: str) -> dict[str, str]:
    """sacct's TRES column (``billing=2,cpu=2,gres/gpu=2,mem=1000M,node=1``) as a mapping."""
    out: dict[str, str] = {}
    for item in text.strip().split(","):
        name, sep, value = item.partition("=")
        if sep and name:
            out[name] = value
    return out


def gpus_of(tres: Mapping[str, str]) -> int:
    """GPUs in a parsed TRES mapping (0 when ``gres/gpu`` is absent: not accounted)."""
    value = tres.get(GPU_TRES, "0")
    return int(value) if value.isdigit() else 0
