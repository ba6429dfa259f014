"""``Tenant``: a team's namespaces, people, Slurm account and one GPU quota (docs/tenants.md).

Cluster-scoped, as a tenant owns namespaces. ``spec`` says what the team owns
(:class:`TenantSpec`); the tenant controller (``gpufleet.tenants``) writes its
ResourceQuota, RoleBindings and NetworkPolicy in those namespaces and its Slurm
account, and ``status``: conditions (Ready, Conflict, QuotaBelowUse, Deleting),
the GPUs in use and the limits applied now, and on deletion what still runs.
The decisions are ``gpufleet.domain.tenancy``'s (docs/decisions/0280).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.api.names import API_VERSION, TENANT
from gpufleet.api.schema import AGE, CONDITIONS, Json, column, crd, structural
from gpufleet.domain import tenancy

NAMES = TENANT
KIND = NAMES.kind
PLURAL = NAMES.plural

_CFG = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class TenantUser(BaseModel):
    """A person: the Slurm/login identity and the Kubernetes RBAC subject ``User <name>``."""

    model_config = _CFG

    name: str = Field(description="Login name, Slurm user and Kubernetes user", max_length=32)
    uid: int = Field(ge=tenancy.MIN_UID, le=tenancy.MAX_UID, description="POSIX uid")
    gid: int = Field(ge=tenancy.MIN_UID, le=tenancy.MAX_UID, description="POSIX primary gid")
    ssh_keys: list[str] = Field(
        default_factory=list,
        alias="sshKeys",
        description="OpenSSH public key lines allowed to log in as this user",
    )


class TenantSlurm(BaseModel):
    """The tenant's Slurm account."""

    model_config = _CFG

    account: str | None = Field(
        default=None, description="Slurm account name; absent: the tenant's name", max_length=64
    )
    qos: list[str] = Field(default_factory=list, description="QOS the account may use")
    default_qos: str | None = Field(
        default=None, alias="defaultQos", description="The account's default QOS (one of qos)"
    )
    partitions: list[str] = Field(
        default_factory=list, description="Partitions its jobs run in (informational)"
    )


class TenantNodes(BaseModel):
    """Nodes the tenant owns."""

    model_config = _CFG

    selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels that must all match"
    )


class TenantSpec(BaseModel):
    """What a team owns. gpufleet never creates or deletes the namespaces themselves."""

    model_config = _CFG

    display_name: str | None = Field(
        default=None, alias="displayName", description="A name for people", max_length=200
    )
    namespaces: list[str] = Field(
        default_factory=list, description="Kubernetes namespaces the tenant owns"
    )
    users: list[TenantUser] = Field(default_factory=list, description="The tenant's people")
    groups: list[str] = Field(
        default_factory=list, description="Kubernetes groups also bound in its namespaces"
    )
    slurm: TenantSlurm | None = Field(
        default=None, description="Its Slurm account; absent: an account named as the tenant"
    )
    gpu_quota: int | None = Field(
        default=None,
        ge=0,
        alias="gpuQuota",
        description="GPUs held at once in pods and Slurm jobs together; absent: no limit",
    )
    nodes: TenantNodes | None = Field(default=None, description="Nodes the tenant owns")

    def domain(self, name: str, created: str, *, deleting: bool = False) -> tenancy.Tenant:
        """The tenant as the decisions see it."""
        s = self.slurm
        return tenancy.Tenant(
            name=name,
            created=created,
            namespaces=tuple(self.namespaces),
            users=tuple(tenancy.User(u.name, u.uid, u.gid, tuple(u.ssh_keys)) for u in self.users),
            groups=tuple(self.groups),
            slurm=tenancy.SlurmSettings(
                account=s.account or name,
                qos=tuple(s.qos),
                default_qos=s.default_qos,
                partitions=tuple(s.partitions),
            )
            if s is not None
            else None,
            gpu_quota=self.gpu_quota,
            node_selector=dict(self.nodes.selector) if self.nodes else {},
            deleting=deleting,
        )

    @model_validator(mode="after")
    def _valid(self) -> TenantSpec:
        errors = tenancy.validate(self.domain("x", ""))
        if errors:
            raise ValueError("; ".join(errors))
        return self


def from_object(obj: Mapping[str, Any]) -> tenancy.Tenant:
    """A Tenant object as the decisions see it; raises ``ValueError`` with every problem."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    spec = TenantSpec.model_validate(obj.get("spec") or {})
    t = spec.domain(
        name,
        str(meta.get("creationTimestamp") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )
    errors = tenancy.validate(t)
    if errors:
        raise ValueError("; ".join(errors))
    return t


def problems(obj: Mapping[str, Any]) -> list[str]:
    """Every problem of a Tenant object (empty: valid), one line each, with the field's path."""
    out: list[str] = []
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        out.append(f"apiVersion/kind must be {API_VERSION} {KIND}")
    try:
        from_object(obj)
    except ValidationError as e:
        for err in e.errors():
            where = ".".join(str(p) for p in ("spec", *err["loc"]))
            msg = str(err["msg"]).removeprefix("Value error, ")
            out.extend(f"{where}: {m}" for m in msg.split("; "))
    except ValueError as e:
        out.extend(str(e).split("; "))
    return out


def manifest(name: str, spec: TenantSpec) -> Json:
    """A Tenant object to create."""
    body = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": body}


_GPUS: Json = {
    "type": "object",
    "properties": {
        "kubernetesGpus": {"type": "integer", "nullable": True, "description": "In pods."},
        "slurmGpus": {"type": "integer", "nullable": True, "description": "In Slurm jobs."},
    },
}

STATUS_SCHEMA: Json = {
    "type": "object",
    "description": "Written by the tenant controller, only when it changes.",
    "properties": {
        "usage": {**_GPUS, "description": "GPUs the tenant holds now."},
        "limits": {
            **_GPUS,
            "description": "The split applied now: each side may hold gpuQuota less what the "
            "other holds; null: no limit.",
        },
        "nodes": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The nodes it owns (spec.nodes.selector), labelled and tainted "
            "gpufleet.io/tenant=<name>.",
        },
        "left": {
            "type": "array",
            "items": {"type": "string"},
            "description": "On deletion: what still runs, and what gpufleet did not remove.",
        },
        "observedGeneration": {
            "type": "integer",
            "description": "The metadata.generation of the spec last acted on.",
        },
        "conditions": CONDITIONS,
    },
}


def spec_schema() -> Json:
    return structural(TenantSpec.model_json_schema(by_alias=True))


def crd_manifest() -> Json:
    return crd(
        NAMES,
        spec=spec_schema(),
        status=STATUS_SCHEMA,
        description="A team: its namespaces, people, Slurm account and one GPU quota for "
        "both schedulers.",
        columns=[
            column("Quota", "integer", ".spec.gpuQuota"),
            column("Pods", "integer", ".status.usage.kubernetesGpus"),
            column("Slurm", "integer", ".status.usage.slurmGpus"),
            column("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
            AGE,
        ],
        spec_required=True,
    )
