"""Tenants: who owns which namespaces, people, Slurm account and GPU quota (docs/tenants.md).

Every decision of the tenant controller, pure: what is wrong in one tenant
(:func:`validate`), which tenant keeps a name two tenants claim
(:func:`conflicts`: the older one), how one GPU quota is split between
Kubernetes and Slurm (:func:`split`), the Kubernetes objects a tenant should have
(:func:`desired_objects`, as plain data) and what changes Slurm's associations
(:func:`plan_associations`). The adapters in ``gpufleet.tenants`` and
``gpufleet.slurm.associations`` only read and write.

A limit below what runs blocks new work only: nothing here ever asks to stop a
pod or a job (docs/decisions/0280).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.pod_groups import GPU_RESOURCE
from gpufleet.domain.quantities import pod_requests

FINALIZER = "gpufleet.io/tenant"
"""Finalizer on a Tenant: removed once its work ended and what gpufleet wrote for it is gone."""
LABEL_TENANT = "gpufleet.io/tenant"
"""Label on every object gpufleet writes for a tenant: the tenant's name."""
MANAGED_BY = "gpufleet"
"""Value of ``app.kubernetes.io/managed-by`` on the objects gpufleet writes for a tenant."""
MANAGED_DESCRIPTION = "gpufleet tenant {name}"
"""Description of a Slurm account gpufleet created; an account without it is never modified."""
OBJECT_NAME = "gpufleet-tenant-{name}"
"""Name of the ResourceQuota, RoleBinding and NetworkPolicy in each of a tenant's namespaces."""
DEFAULT_ROLE = "edit"
"""ClusterRole the tenant's users and groups are bound to in its namespaces."""
QUOTA_KEY = f"requests.{GPU_RESOURCE}"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_SLURM_NAME = re.compile(r"^[a-z0-9_][a-z0-9_.-]{0,63}$")
_MANAGED = re.compile(r"^gpufleet tenant (\S+)$")
MIN_UID = 1000
MAX_UID = 2**31 - 2


@dataclass(frozen=True)
class User:
    """A person: a Slurm/login identity and the Kubernetes RBAC subject ``User <name>``."""

    name: str
    uid: int
    gid: int
    ssh_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmSettings:
    """The tenant's Slurm account: its name, QOS and partitions."""

    account: str
    qos: tuple[str, ...] = ()
    default_qos: str | None = None
    partitions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tenant:
    """One Tenant as the decisions see it (``gpufleet.api.tenant`` reads it from the object)."""

    name: str
    created: str
    """``metadata.creationTimestamp`` (RFC 3339 UTC): the older tenant keeps a contested name."""
    namespaces: tuple[str, ...] = ()
    users: tuple[User, ...] = ()
    groups: tuple[str, ...] = ()
    slurm: SlurmSettings | None = None
    gpu_quota: int | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False

    @property
    def account(self) -> str:
        return self.slurm.account if self.slurm else self.name

    @property
    def order(self) -> tuple[str, str]:
        return (self.created, self.name)


# --- Validation of one tenant ---------------------------------------------------


def validate(t: Tenant) -> list[str]:
    """What is wrong in one tenant on its own, one clear sentence each (empty: valid)."""
    errors: list[str] = []
    if not _DNS_LABEL.match(t.name):
        errors.append(f"name {t.name!r} is not a DNS label (lowercase letters, digits, '-')")
    seen_ns: set[str] = set()
    for ns in t.namespaces:
        if not _DNS_LABEL.match(ns):
            errors.append(f"namespace {ns!r} is not a DNS label")
        if ns in seen_ns:
            errors.append(f"namespace {ns!r} is listed twice")
        seen_ns.add(ns)
    names: set[str] = set()
    uids: dict[int, str] = {}
    for u in t.users:
        if not _POSIX_NAME.match(u.name):
            errors.append(
                f"user {u.name!r} is not a login name (lowercase letter or '_' first, "
                "then letters, digits, '_' or '-', at most 32)"
            )
        if u.name in names:
            errors.append(f"user {u.name!r} is listed twice")
        names.add(u.name)
        for what, value in (("uid", u.uid), ("gid", u.gid)):
            if not MIN_UID <= value <= MAX_UID:
                errors.append(
                    f"user {u.name!r}: {what} {value} is outside {MIN_UID}..{MAX_UID} "
                    "(system ids are not handed to tenants)"
                )
        other = uids.get(u.uid)
        if other is not None and other != u.name:
            errors.append(f"uid {u.uid} is given to both {other!r} and {u.name!r}")
        uids.setdefault(u.uid, u.name)
        for key in u.ssh_keys:
            if len(key.split()) < 2 or not key.split()[0].startswith(("ssh-", "ecdsa-", "sk-")):
                errors.append(f"user {u.name!r}: {key[:40]!r} is not an OpenSSH public key line")
    if t.slurm is not None:
        s = t.slurm
        if not _SLURM_NAME.match(s.account):
            errors.append(f"Slurm account {s.account!r} is not a valid account name")
        for q in (*s.qos, *s.partitions):
            if not _SLURM_NAME.match(q):
                errors.append(f"Slurm name {q!r} is not valid (lowercase, digits, '_', '.', '-')")
        if s.default_qos is not None and s.default_qos not in s.qos:
            errors.append(f"Slurm defaultQos {s.default_qos!r} is not one of qos {list(s.qos)}")
    elif not _SLURM_NAME.match(t.name):
        errors.append(f"Slurm account {t.name!r} (the tenant's name) is not valid")
    if t.gpu_quota is not None and t.gpu_quota < 0:
        errors.append(f"gpuQuota {t.gpu_quota} is negative")
    return errors


# --- Conflicts across tenants ----------------------------------------------------


def conflicts(tenants: Iterable[Tenant]) -> dict[str, list[str]]:
    """Per tenant, what an older tenant already holds (a tenant with none maps to ``[]``).

    Older means ``(creationTimestamp, name)`` first. A namespace, a user name, a
    uid used under another name or a Slurm account is held by the oldest tenant
    that claims it, whatever that tenant's own state: the newer tenant gets the
    Conflict condition and nothing of it is applied until it is resolved (the
    older never loses what it has, so nothing running is disrupted).
    """
    ns_owner: dict[str, str] = {}
    user_owner: dict[str, str] = {}
    uid_owner: dict[int, tuple[str, str]] = {}
    account_owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for t in sorted(tenants, key=lambda x: x.order):
        found: list[str] = []
        for ns in t.namespaces:
            owner = ns_owner.get(ns)
            if owner is not None and owner != t.name:
                found.append(f"namespace {ns} belongs to tenant {owner}")
        for u in t.users:
            owner = user_owner.get(u.name)
            if owner is not None and owner != t.name:
                found.append(f"user {u.name} belongs to tenant {owner}")
            held = uid_owner.get(u.uid)
            if held is not None and held[0] != u.name:
                found.append(f"uid {u.uid} is user {held[0]} of tenant {held[1]}")
        owner = account_owner.get(t.account)
        if owner is not None and owner != t.name:
            found.append(f"Slurm account {t.account} belongs to tenant {owner}")
        out[t.name] = found
        for ns in t.namespaces:
            ns_owner.setdefault(ns, t.name)
        for u in t.users:
            user_owner.setdefault(u.name, t.name)
            uid_owner.setdefault(u.uid, (u.name, t.name))
        account_owner.setdefault(t.account, t.name)
    return out


# --- One quota, both schedulers --------------------------------------------------


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod holds (its effective request); 0 once it finished."""
    if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
        return 0
    value = pod_requests(pod.get("spec") or {}).get(GPU_RESOURCE)
    return int(value) if value else 0


@dataclass(frozen=True)
class Usage:
    """GPUs a tenant holds now: per namespace in pods, and in Slurm's running jobs."""

    namespaces: Mapping[str, int]
    slurm_gpus: int

    @property
    def kubernetes_gpus(self) -> int:
        return sum(self.namespaces.values())

    @property
    def total(self) -> int:
        return self.kubernetes_gpus + self.slurm_gpus


@dataclass(frozen=True)
class Split:
    """The limits applied now: each side may hold the quota less what the others hold."""

    kubernetes_gpus: int | None
    slurm_gpus: int | None
    namespaces: Mapping[str, int | None]
    """Each namespace's ResourceQuota: the quota less Slurm and the other namespaces."""


def split(quota: int | None, usage: Usage, *, deleting: bool = False) -> Split:
    """One quota for both schedulers, recomputed on every usage change.

    Kubernetes may hold ``Q - Slurm's GPUs``, Slurm ``Q - Kubernetes' GPUs`` (never
    below 0); a tenant's namespaces share the Kubernetes part the same way. Both
    may grab the remainder within one reconcile (docs/decisions/0280). A tenant
    being deleted gets 0 everywhere: no new work. No quota: no limits.
    """
    if deleting:
        return Split(0, 0, {ns: 0 for ns in usage.namespaces})
    if quota is None:
        return Split(None, None, {ns: None for ns in usage.namespaces})
    total = usage.total
    return Split(
        kubernetes_gpus=max(0, quota - usage.slurm_gpus),
        slurm_gpus=max(0, quota - usage.kubernetes_gpus),
        namespaces={ns: max(0, quota - (total - used)) for ns, used in usage.namespaces.items()},
    )


def below_use(quota: int | None, usage: Usage) -> str | None:
    """Why the quota is below what runs (condition QuotaBelowUse), or None."""
    if quota is None or usage.total <= quota:
        return None
    return (
        f"{usage.total} GPUs in use ({usage.kubernetes_gpus} in pods, {usage.slurm_gpus} in "
        f"Slurm jobs) above gpuQuota {quota}: new work waits, running work is not disturbed"
    )


# --- The Kubernetes objects of a tenant -------------------------------------------


@dataclass(frozen=True)
class KubeObject:
    """An object gpufleet writes for a tenant, as plain data (kind, namespace, name, body)."""

    kind: str
    namespace: str
    name: str
    body: Mapping[str, Any]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)


KINDS = ("ResourceQuota", "RoleBinding", "NetworkPolicy")


def labels(tenant: str) -> dict[str, str]:
    """The labels that say gpufleet wrote an object for ``tenant``."""
    return {well_known.LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: tenant}


def owned_by(obj: Mapping[str, Any], tenant: str) -> bool:
    """Whether gpufleet wrote ``obj`` for ``tenant`` (else it is never changed or removed)."""
    got = (obj.get("metadata") or {}).get("labels") or {}
    return all(got.get(k) == v for k, v in labels(tenant).items())


def desired_objects(t: Tenant, limits: Split, *, role: str = DEFAULT_ROLE) -> list[KubeObject]:
    """ResourceQuota (when there is a limit), RoleBinding and NetworkPolicy per namespace.

    The RoleBinding binds ``User <name>`` for each user and ``Group <g>`` for each
    group to ``role``; the NetworkPolicy admits traffic into the namespace only from
    the tenant's own namespaces.
    """
    name = OBJECT_NAME.format(name=t.name)
    meta_labels = labels(t.name)
    out: list[KubeObject] = []
    subjects = [
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u.name} for u in t.users
    ] + [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": g} for g in t.groups]
    for ns in t.namespaces:
        meta = {"name": name, "namespace": ns, "labels": dict(meta_labels)}
        hard = limits.namespaces.get(ns, limits.kubernetes_gpus)
        if hard is not None:
            out.append(
                KubeObject(
                    "ResourceQuota",
                    ns,
                    name,
                    {"metadata": meta, "spec": {"hard": {QUOTA_KEY: str(hard)}}},
                )
            )
        out.append(
            KubeObject(
                "RoleBinding",
                ns,
                name,
                {
                    "metadata": meta,
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": role,
                    },
                    "subjects": subjects,
                },
            )
        )
        out.append(
            KubeObject(
                "NetworkPolicy",
                ns,
                name,
                {
                    "metadata": meta,
                    "spec": {
                        "podSelector": {},
                        "policyTypes": ["Ingress"],
                        "ingress": [
                            {
                                "from": [
                                    {
                                        "namespaceSelector": {
                                            "matchExpressions": [
                                                {
                                                    "key": "kubernetes.io/metadata.name",
                                                    "operator": "In",
                                                    "values": sorted(t.namespaces),
                                                }
                                            ]
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                },
            )
        )
    return out


@dataclass(frozen=True)
class KubeOps:
    """What to write: objects to create or update, to delete, and foreign ones left alone."""

    put: tuple[KubeObject, ...] = ()
    delete: tuple[KubeObject, ...] = ()
    foreign: tuple[tuple[str, str, str], ...] = ()


_COMPARED = ("spec", "roleRef", "subjects")


def _same(desired: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    if any(desired.get(k) != current.get(k) for k in _COMPARED if k in desired):
        return False
    got = (current.get("metadata") or {}).get("labels") or {}
    want = (desired.get("metadata") or {}).get("labels") or {}
    return all(got.get(k) == v for k, v in want.items())


def plan_objects(
    tenant: str,
    desired: Sequence[KubeObject],
    current: Mapping[tuple[str, str, str], Mapping[str, Any]],
) -> KubeOps:
    """Compare what should exist with what does; never change an object without our labels.

    ``current``: the objects found under the desired names and those labelled for
    ``tenant``, by ``(kind, namespace, name)``. The ResourceQuota's ``spec`` is
    compared as written; the apiserver returns it as sent.
    """
    put: list[KubeObject] = []
    foreign: list[tuple[str, str, str]] = []
    wanted = {o.key for o in desired}
    for o in desired:
        cur = current.get(o.key)
        if cur is None:
            put.append(o)
        elif not owned_by(cur, tenant):
            foreign.append(o.key)
        elif not _same(o.body, cur):
            put.append(o)
    delete = [
        KubeObject(key[0], key[1], key[2], cur)
        for key, cur in sorted(current.items())
        if key not in wanted and owned_by(cur, tenant)
    ]
    return KubeOps(tuple(put), tuple(delete), tuple(sorted(foreign)))


# --- Slurm associations -----------------------------------------------------------


@dataclass(frozen=True)
class SlurmAccount:
    """What Slurm holds for one account (or should hold)."""

    name: str
    description: str
    users: frozenset[str]
    gpu_limit: int | None
    qos: frozenset[str]
    default_qos: str | None = None


@dataclass(frozen=True)
class SlurmTenancy:
    """What the Slurm port reads: the accounts and each account's running jobs' GPUs."""

    accounts: Mapping[str, SlurmAccount]
    gpus_running: Mapping[str, int]


@dataclass(frozen=True)
class AddAccount:
    name: str
    description: str


@dataclass(frozen=True)
class SetGpuLimit:
    """``GrpTRES=gres/gpu=N`` on the account; None clears it."""

    account: str
    gpus: int | None


@dataclass(frozen=True)
class SetQos:
    account: str
    qos: frozenset[str]
    default: str | None


@dataclass(frozen=True)
class AddUser:
    user: str
    account: str


@dataclass(frozen=True)
class RemoveUser:
    user: str
    account: str


@dataclass(frozen=True)
class RemoveAccount:
    name: str


AssociationOp = AddAccount | SetGpuLimit | SetQos | AddUser | RemoveUser | RemoveAccount


def managed_description(tenant: str) -> str:
    return MANAGED_DESCRIPTION.format(name=tenant)


def managed_tenant(description: str) -> str | None:
    """The tenant whose account this is, by its description; None: not gpufleet's."""
    m = _MANAGED.match(description.strip())
    return m.group(1) if m else None


def desired_account(t: Tenant, gpu_limit: int | None) -> SlurmAccount:
    s = t.slurm or SlurmSettings(account=t.name)
    return SlurmAccount(
        name=t.account,
        description=managed_description(t.name),
        users=frozenset(u.name for u in t.users),
        gpu_limit=gpu_limit,
        qos=frozenset(s.qos),
        default_qos=s.default_qos,
    )


def plan_associations(
    desired: Mapping[str, SlurmAccount | None], current: SlurmTenancy
) -> list[AssociationOp]:
    """The changes that make Slurm hold ``desired``, touching only gpufleet's accounts.

    ``desired`` maps an account to what it should hold, or to None: remove it
    (its tenant is deleted). An account absent from ``desired`` is not touched;
    an existing account whose description is not the tenant's managed description
    is never modified (:func:`foreign_accounts` names them); an account with
    running jobs is not removed (only its users and limit stay until they end).
    A tenant naming no QOS leaves the account's QOS to Slurm (inherited from its
    parent): it is compared only when the tenant names some.
    """
    ops: list[AssociationOp] = []
    for name in sorted(desired):
        want = desired[name]
        cur = current.accounts.get(name)
        if want is None:
            if cur is None or managed_tenant(cur.description) is None:
                continue
            if current.gpus_running.get(name, 0) > 0:
                continue
            ops.extend(RemoveUser(u, name) for u in sorted(cur.users))
            ops.append(RemoveAccount(name))
            continue
        if cur is None:
            ops.append(AddAccount(name, want.description))
            if want.qos:
                ops.append(SetQos(name, want.qos, want.default_qos))
            if want.gpu_limit is not None:
                ops.append(SetGpuLimit(name, want.gpu_limit))
            ops.extend(AddUser(u, name) for u in sorted(want.users))
            continue
        if cur.description != want.description:
            continue
        if want.qos and (want.qos != cur.qos or want.default_qos != cur.default_qos):
            ops.append(SetQos(name, want.qos, want.default_qos))
        if want.gpu_limit != cur.gpu_limit:
            ops.append(SetGpuLimit(name, want.gpu_limit))
        ops.extend(AddUser(u, name) for u in sorted(want.users - cur.users))
        ops.extend(RemoveUser(u, name) for u in sorted(cur.users - want.users))
    return ops


def foreign_accounts(
    desired: Mapping[str, SlurmAccount | None], current: SlurmTenancy
) -> list[str]:
    """Desired accounts that exist in Slurm without the tenant's managed description."""
    return sorted(
        name
        for name, want in desired.items()
        if want is not None
        and name in current.accounts
        and current.accounts[name].description != want.description
    )


# --- Deletion ----------------------------------------------------------------------


def left_running(pods: Iterable[Mapping[str, Any]], account: str, slurm_gpus: int) -> list[str]:
    """What of a deleted tenant still runs: its GPU pods and its Slurm jobs' GPUs.

    gpufleet waits for them to end on their own (quota 0 stops new work); the
    Tenant keeps its finalizer until this is empty.
    """
    left: list[str] = []
    for pod in pods:
        n = pod_gpus(pod)
        if n:
            meta = pod.get("metadata") or {}
            left.append(f"pod {meta.get('namespace')}/{meta.get('name')} holds {n} GPUs")
    if slurm_gpus > 0:
        left.append(f"Slurm account {account}: running jobs hold {slurm_gpus} GPUs")
    return sorted(left)
