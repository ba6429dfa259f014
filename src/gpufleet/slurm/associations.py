"""Tenants' Slurm accounts through ``sacctmgr`` and ``squeue`` (the tenant controller's
Slurm port, :class:`gpufleet.tenants.ports.SlurmAssociations`).

Why the command-line tools and not slurmrestd's ``/slurmdb/`` endpoints (decision
0283): ``sacctmgr`` needs only munge and a route to slurmdbd, which every Slurm image
of the chart already has beside a munged sidecar (as the pod scheduler's ``sbatch``),
and root is an accounting administrator by default; the REST endpoints need a
slurmrestd loaded with its accounting plugins, connected to slurmdbd, and a JWT of an
administrator, none of which the fleet runs today. Every output is read in
``--parsable2`` form (``|`` between fields, no header) and parsed once here
(:func:`parse_accounts`, :func:`parse_associations`, :func:`parse_running`).

What is read: every account (name, description), its account-level association (the
``GrpTRES`` GPU limit, QOS and default QOS) and its users' associations; and from
``squeue`` the GPUs held by each account's running jobs. What is written: only the
ops the pure plan (:func:`gpufleet.domain.tenancy.plan_associations`) returns, which
touch only accounts whose description is gpufleet's for that tenant. Nothing here
stops or changes a running job: a lower ``GrpTRES`` keeps new jobs out, and
``sacctmgr`` itself refuses to remove an account or user with active jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.domain import slurm_accounting
from gpufleet.domain.tenancy import (
    AddAccount,
    AddUser,
    AssociationOp,
    RemoveAccount,
    RemoveUser,
    SetGpuLimit,
    SetQos,
    SlurmAccount,
    SlurmTenancy,
)
from gpufleet.slurm.scontrol import run_tool

ORGANIZATION = "gpufleet"
"""``Organization`` of the accounts gpufleet adds (shown by ``sacctmgr show account``)."""
ACCOUNT_FIELDS = ("account", "descr")
ASSOC_FIELDS = ("account", "user", "partition", "grptres", "qos", "defaultqos")
RUNNING_STATES = "RUNNING,COMPLETING"
"""Job states whose GPUs count against a ``GrpTRES`` limit (slurmctld's own usage)."""


@dataclass(frozen=True, slots=True)
class Association:
    """One row of ``sacctmgr show assoc``: an account's own (``user`` empty) or a user's."""

    account: str
    user: str
    partition: str
    gpu_limit: int | None
    qos: frozenset[str]
    default_qos: str | None


def _rows(text: str, fields: Sequence[str], what: str) -> list[dict[str, str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(fields):
            raise ValueError(f"{what}: expected {len(fields)} fields separated by '|': {line!r}")
        rows.append(dict(zip(fields, values, strict=True)))
    return rows


def gpu_limit_of(grptres: str) -> int | None:
    """``GrpTRES`` (``cpu=64,gres/gpu=16``) -> its GPU limit; None when it sets none."""
    value = slurm_accounting.parse_tres(grptres).get(slurm_accounting.GPU_TRES)
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"GrpTRES {grptres!r}: the GPU limit is not a count")
    return int(value)


def parse_accounts(text: str) -> dict[str, str]:
    """``sacctmgr -n -P show account format=account,descr`` -> account: description."""
    return {r["account"]: r["descr"] for r in _rows(text, ACCOUNT_FIELDS, "sacctmgr accounts")}


def parse_associations(text: str) -> list[Association]:
    """``sacctmgr -n -P show assoc format=account,user,partition,grptres,qos,defaultqos``."""
    return [
        Association(
            account=r["account"],
            user=r["user"],
            partition=r["partition"],
            gpu_limit=gpu_limit_of(r["grptres"]),
            qos=frozenset(q for q in r["qos"].split(",") if q),
            default_qos=r["defaultqos"] or None,
        )
        for r in _rows(text, ASSOC_FIELDS, "sacctmgr associations")
    ]


def parse_running(text: str) -> dict[str, int]:
    """``squeue -h -a -t RUNNING,COMPLETING -O Account:|,tres-alloc:|`` -> account: GPUs
    its jobs hold (every account with a running job, 0 for jobs without GPUs)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        account, sep, rest = line.partition("|")
        if not sep:
            raise ValueError(f"squeue: expected 'account|tres|': {line!r}")
        tres = rest.rstrip().removesuffix("|")
        gpus = slurm_accounting.gpus_of(slurm_accounting.parse_tres(tres))
        out[account.strip()] = out.get(account.strip(), 0) + gpus
    return out


def tenancy(
    accounts: Mapping[str, str], associations: Sequence[Association], running: Mapping[str, int]
) -> SlurmTenancy:
    """What the port reads, from the three parsed outputs. An account's limit and QOS
    are its own association's (users inherit them); its users are every user with an
    association under it (on any partition)."""
    own = {a.account: a for a in associations if not a.user}
    users: dict[str, set[str]] = {}
    for a in associations:
        if a.user:
            users.setdefault(a.account, set()).add(a.user)
    result = {}
    for name, description in accounts.items():
        assoc = own.get(name)
        result[name] = SlurmAccount(
            name=name,
            description=description,
            users=frozenset(users.get(name, ())),
            gpu_limit=assoc.gpu_limit if assoc else None,
            qos=assoc.qos if assoc else frozenset(),
            default_qos=assoc.default_qos if assoc else None,
        )
    return SlurmTenancy(accounts=result, gpus_running=dict(running))


def sacctmgr_args(op: AssociationOp, cluster: str | None = None) -> list[str]:
    """The ``sacctmgr`` arguments (after ``-i``, which answers its questions) of one op."""
    on = [f"cluster={cluster}"] if cluster else []
    match op:
        case AddAccount(name, description):
            return [
                "add", "account", name, f"description={description}",
                f"organization={ORGANIZATION}", *on,
            ]  # fmt: skip
        case SetGpuLimit(account, gpus):
            limit = -1 if gpus is None else gpus  # -1 clears a limit
            return [
                "modify", "account", "where", f"name={account}", *on,
                "set", f"GrpTRES={slurm_accounting.GPU_TRES}={limit}",
            ]  # fmt: skip
        case SetQos(account, qos, default):
            return [
                "modify", "account", "where", f"name={account}", *on,
                "set", f"QOS={','.join(sorted(qos))}", f"DefaultQOS={default or -1}",
            ]  # fmt: skip
        case AddUser(user, account):
            return ["add", "user", user, f"account={account}", *on]
        case RemoveUser(user, account):
            return ["remove", "user", "where", f"name={user}", f"account={account}", *on]
        case RemoveAccount(name):
            # No cluster: restricted to one, sacctmgr removes the association and keeps
            # the account (with gpufleet's description, found again next poll).
            return ["remove", "account", "where", f"name={name}"]
    raise TypeError(f"not an association op: {op!r}")  # pragma: no cover - exhaustive


class SacctmgrAssociations:
    """The tenant controller's Slurm port over ``sacctmgr`` (slurmdbd) and ``squeue``
    (slurmctld). ``bin_dir``: where the Slurm tools are (None: PATH); ``env``: extra
    environment (``SLURM_CONF``); ``cluster``: the accounting cluster to write to (None:
    every cluster slurmdbd holds, which is the one cluster of a SlurmCluster)."""

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        cluster: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._bin = bin_dir
        self._env = dict(env or {})
        self._cluster = cluster
        self._timeout = timeout_s

    def _tool(self, name: str) -> str:
        return str(self._bin / name) if self._bin else name

    async def _run(self, tool: str, *args: str) -> str:
        return await run_tool([self._tool(tool), *args], self._env, self._timeout)

    async def read(self) -> SlurmTenancy:
        where = [f"cluster={self._cluster}"] if self._cluster else []
        accounts = await self._run(
            "sacctmgr", "-n", "-P", "show", "account", f"format={','.join(ACCOUNT_FIELDS)}"
        )
        assocs = await self._run(
            "sacctmgr", "-n", "-P", "show", "assoc", *where, f"format={','.join(ASSOC_FIELDS)}"
        )
        running = await self._run(
            "squeue", "-h", "-a", "-t", RUNNING_STATES, "-O", "Account:|,tres-alloc:|"
        )
        return tenancy(parse_accounts(accounts), parse_associations(assocs), parse_running(running))

    async def apply(self, ops: Sequence[AssociationOp]) -> None:
        for op in ops:
            await self._run("sacctmgr", "-i", *sacctmgr_args(op, self._cluster))
