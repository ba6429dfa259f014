"""Slurm accounting on one machine: MariaDB and slurmdbd beside the local cluster's Slurm.

``gpufleet local up --slurm 24.11 --slurm-accounting`` runs what an operator runs
with the chart's ``slurm.accounting.enabled``: slurmctld sends every job to slurmdbd
(the lines the SlurmCluster operator renders, :mod:`gpufleet.domain.slurm_accounting`),
slurmdbd writes them to MariaDB, and ``sacct`` reads them back, with the GPUs each
job held (``gres/gpu`` in ``AllocTRES``).

- **MariaDB** is the host's Debian package (``mariadb-server``; Slurm accepts any
  MySQL-compatible server). A private instance under ``<run>/slurm/accounting``
  (``<run>/accounting`` without Slurm here):
  its own data directory (``mariadb-install-db``), a unix socket for root (who logs
  in by socket, no password), TCP on 127.0.0.1 at a free port for slurmdbd, small
  buffers (32 MiB pool, 8 MiB redo log: about 100 MiB resident).
- Without Slurm here but with the machines ready for the chart (``--images``):
  MariaDB alone, forwarded to every machine at ``10.0.2.100:<port>`` (as the BMCs
  are), the "existing MariaDB" the chart's ``slurm.accounting`` names.
- **slurmdbd** is the Slurm 24.11 root's (the host's 22.05 ships none installed),
  run as root like the cluster's other daemons, with a generated database
  password. It reads ``slurmdbd.conf`` from the directory of ``SLURM_CONF``
  (slurmdbd has no option naming its file).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpufleet.domain import slurm_accounting
from gpufleet.local import vm
from gpufleet.local.processes import ComponentError, ManagedProcess

DB_USER = "slurm"
DB_ADDRESS = "127.0.0.1"
"""Where MariaDB listens and slurmdbd's account may log in from: one address, so the
account's host part always matches the connections slurmdbd (or a machine's forward,
which connects from the host's loopback) makes."""
INSTALL_TIMEOUT_S = 120.0
SQL_TIMEOUT_S = 30.0
MARIADB_OPTIONS = (
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=8M",
)
"""Small enough for a test machine; the defaults (128 MiB pool, 96 MiB log) are for a
server of its own."""
MACHINES_HOST = vm.CLUSTER_ADDRESS
"""The host as the machines reach its forwarded ports."""
PACKAGE_HINT = "apt-get install mariadb-server (scripts/bootstrap-system.sh installs it)"


@dataclass(frozen=True)
class DbdPlace:
    """Where this host's slurmdbd listens and what it shares with the cluster's Slurm."""

    port: int
    host: str
    """The short host name slurmdbd answers to (``DbdHost``: it refuses any other)."""
    slurm_etc: Path
    """The directory of the cluster's slurm.conf: slurmdbd reads slurmdbd.conf there."""
    munge_socket: Path


@dataclass(frozen=True)
class DatabaseEndpoint:
    """The accounting database as a slurmdbd reaches it: what the chart's
    ``slurm.accounting`` values and its password Secret take."""

    host: str
    port: int
    user: str
    password_file: str
    machines_host: str
    """The address machines (and pods on them) reach it at (``vm.CLUSTER_ADDRESS``)."""


@dataclass(frozen=True)
class AccountingLayout:
    """Files and ports of one cluster's MariaDB, and of its slurmdbd when Slurm runs here."""

    root: Path
    logs: Path
    db_port: int
    dbd: DbdPlace | None = None
    """None: MariaDB alone (the chart's slurmdbd in a pod uses it)."""

    def endpoint(self) -> DatabaseEndpoint:
        return DatabaseEndpoint(
            host=DB_ADDRESS,
            port=self.db_port,
            user=DB_USER,
            password_file=str(self.password_file),
            machines_host=MACHINES_HOST,
        )

    @property
    def datadir(self) -> Path:
        return self.root / "mariadb"

    @property
    def db_socket(self) -> Path:
        return self.root / "mariadb.sock"

    @property
    def password_file(self) -> Path:
        return self.root / "db-password"

    @property
    def mariadb_log(self) -> Path:
        return self.logs / "mariadbd.log"

    @property
    def dbd_log(self) -> Path:
        return self.logs / "slurmdbd.log"


@functools.cache
def mariadb_commands() -> dict[str, Path]:
    """``mariadbd``, ``mariadb-install-db`` and ``mariadb`` of the host, or fail naming the
    package. Looked up once per process: :func:`sql` runs on every readiness poll."""
    found: dict[str, Path] = {}
    for name in ("mariadbd", "mariadb-install-db", "mariadb"):
        path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin")
        if path is None:
            raise ComponentError("mariadb", None, f"{name} is missing: {PACKAGE_HINT}")
        found[name] = Path(path)
    return found


def prepare(layout: AccountingLayout) -> None:
    """The data directory (once), the database password, and slurmdbd.conf (mode 0600)
    when slurmdbd runs here."""
    commands = mariadb_commands()
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    if not layout.password_file.exists():
        layout.password_file.write_text(secrets.token_hex(16))
        layout.password_file.chmod(0o600)
    if not (layout.datadir / "mysql").is_dir():
        _install_database(layout, commands["mariadb-install-db"])
    if layout.dbd is not None:
        write_dbd_conf(layout, layout.dbd)


def write_dbd_conf(layout: AccountingLayout, dbd: DbdPlace) -> None:
    config = slurm_accounting.DbdConfig(
        dbd_host=dbd.host,
        dbd_addr="127.0.0.1",
        dbd_port=dbd.port,
        slurm_user="root",
        pid_file=str(layout.root / "slurmdbd.pid"),
        log_file=str(layout.dbd_log),
        auth_info=f"socket={dbd.munge_socket}",
        storage_host=DB_ADDRESS,
        storage_port=layout.db_port,
        storage_user=DB_USER,
        storage_password=layout.password_file.read_text().strip(),
    )
    conf = dbd.slurm_etc / "slurmdbd.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(slurm_accounting.slurmdbd_conf(config))
    os.chmod(conf, 0o600)


def _install_database(layout: AccountingLayout, install_db: Path) -> None:
    log = layout.logs / "mariadb-install-db.log"
    argv = [
        str(install_db),
        "--no-defaults",
        f"--datadir={layout.datadir}",
        "--user=root",
        "--auth-root-authentication-method=socket",
        "--skip-test-db",
        *MARIADB_OPTIONS,
    ]
    try:
        with log.open("wb") as out:
            result = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, check=False
            )
    except subprocess.TimeoutExpired as exc:
        raise ComponentError(
            "mariadb", log, f"mariadb-install-db took over {INSTALL_TIMEOUT_S:.0f} s"
        ) from exc
    if result.returncode != 0:
        raise ComponentError("mariadb", log, f"mariadb-install-db exited {result.returncode}")


def mariadbd(layout: AccountingLayout) -> ManagedProcess:
    commands = mariadb_commands()
    return ManagedProcess(
        "mariadbd",
        [
            commands["mariadbd"],
            "--no-defaults",
            f"--datadir={layout.datadir}",
            f"--socket={layout.db_socket}",
            f"--pid-file={layout.root / 'mariadbd.pid'}",
            f"--bind-address={DB_ADDRESS}",
            f"--port={layout.db_port}",
            # Accounts are by address, never by a name looked up in DNS.
            "--skip-name-resolve",
            # Runs as the cluster's other daemons do; mariadbd insists on being told.
            "--user=root",
            *MARIADB_OPTIONS,
        ],
        layout.mariadb_log,
    )


def sql(layout: AccountingLayout, statement: str) -> str:
    """Run SQL as MariaDB's root over the unix socket; its tab-separated output."""
    result = subprocess.run(
        [
            str(mariadb_commands()["mariadb"]), "--no-defaults", "-S", str(layout.db_socket),
            "-u", "root", "-N", "-B", "-e", statement,
        ],
        capture_output=True, text=True, timeout=SQL_TIMEOUT_S, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ComponentError("mariadb", layout.mariadb_log, f"SQL failed: {result.stderr.strip()}")
    return result.stdout


def mariadb_ok(layout: AccountingLayout) -> bool:
    return layout.db_socket.exists() and sql(layout, "SELECT 1").strip() == "1"


def grant_slurmdbd(layout: AccountingLayout) -> None:
    """slurmdbd's database user (from 127.0.0.1, the generated password) with every right
    on the accounting database only: what docs/install.md asks an operator to create."""
    password = layout.password_file.read_text().strip()
    account = f"'{DB_USER}'@'{DB_ADDRESS}'"
    sql(
        layout,
        f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY '{password}';"
        f"ALTER USER {account} IDENTIFIED BY '{password}';"
        f"GRANT ALL PRIVILEGES ON {slurm_accounting.DEFAULT_DATABASE}.* TO {account};",
    )


def slurmdbd(layout: AccountingLayout, slurmdbd_bin: Path, env: dict[str, str]) -> ManagedProcess:
    """slurmdbd in the foreground; ``env`` carries the cluster's ``SLURM_CONF``."""
    return ManagedProcess("slurmdbd", [slurmdbd_bin, "-D"], layout.dbd_log, env=env)


def deny_on_limit(sacctmgr: Path, env: dict[str, str], qos: str = "normal") -> None:
    """``DenyOnLimit`` on ``qos`` (slurmdbd's default QOS, which every association gets):
    slurmctld then refuses at submission a job that alone exceeds its account's
    ``GrpTRES`` (``sbatch: error: AssocGrpGRES``) instead of queueing it forever
    (decision 0284). A job that fits alone but not beside the account's running ones
    still waits (reason ``AssocGrpGRES``)."""
    subprocess.run(
        [str(sacctmgr), "-i", "modify", "qos", qos, "set", "flags+=DenyOnLimit"],
        env=env, capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip


def slurmdbd_ok(sacctmgr: Path, env: dict[str, str]) -> bool:
    """slurmdbd answers a query (``sacctmgr list cluster`` goes through it to MariaDB)."""
    result = subprocess.run(
        [str(sacctmgr), "-n", "-P", "list", "cluster", "format=cluster"],
        env=env, capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    return result.returncode == 0
