"""``Machine``: one physical server's inventory and boot status.

``spec`` is what the data centre says is in the rack (validated by
:class:`MachineSpec` and by the CRD's schema generated from it); ``status`` is
what provisioning did with it (armed, which token was issued when, which Node
it became). Machines are cluster-scoped, like the Nodes they become, and carry
one ``mac.gpufleet.io/<hex>`` label per MAC so a booting MAC is found with one
label-selector query.

The model normalises what people type (MACs in any notation, spaces in a GPU
model); the CRD is stricter and holds the stored form: those constraints are
``json_schema_extra`` (schema only), so the model's checks and messages stay.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufleet.api.names import API_VERSION, MACHINE
from gpufleet.api.schema import AGE, CONDITIONS, Json, column, crd, structural
from gpufleet.domain import well_known
from gpufleet.domain.inventory import Hardware

NAMES = MACHINE
KIND = NAMES.kind
PLURAL = NAMES.plural

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_SECRET_REF = re.compile(r"^[a-z0-9][-a-z0-9]*/[a-z0-9][-a-z0-9.]*$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def normalize_mac(mac: str) -> str:
    """``aa:bb:cc:dd:ee:ff`` from any of ``AA-BB-…``, ``aabb.ccdd…``, ``aabbccddeeff``.

    Raises ValueError for anything that is not 6 bytes of hex.
    """
    digits = re.sub(r"[-:.]", "", mac.strip().lower())
    if not re.fullmatch(r"[0-9a-f]{12}", digits):
        raise ValueError(f"not a MAC address: {mac!r}")
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def mac_label(mac: str) -> str:
    """The Machine label key that marks this MAC."""
    return well_known.LABEL_MAC_PREFIX + normalize_mac(mac).replace(":", "")


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class Bmc(_Model):
    """How the lifecycle controller and the boot watchdog reach the machine's BMC (Redfish)."""

    endpoint: str = Field(
        description="Redfish service root URL, e.g. https://10.0.0.5",
        json_schema_extra={"pattern": r"^https?://"},
    )
    credentials_secret: str = Field(
        alias="credentialsSecret",
        description="namespace/name of a Secret with keys endpoint, username, password "
        "(the lifecycle controller's gpufleet.io/bmc-secret format)",
        json_schema_extra={"pattern": _SECRET_REF.pattern},
    )

    @field_validator("endpoint")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"BMC endpoint must be an http(s) URL, got {v!r}")
        return v.rstrip("/")

    @field_validator("credentials_secret")
    @classmethod
    def _ref(cls, v: str) -> str:
        if not _SECRET_REF.match(v):
            raise ValueError(f"credentialsSecret must be namespace/name, got {v!r}")
        return v


class ExpectedHardware(_Model):
    """What the machine must have: its Node is compared with this when it joins, and a
    difference sends it to triage (InventoryMismatch) instead of burn-in."""

    gpu_model: str = Field(
        alias="gpuModel",
        min_length=1,
        description="e.g. NVIDIA-H100-80GB-HBM3",
        json_schema_extra={"maxLength": 63},
    )
    gpu_count: int = Field(alias="gpuCount", ge=0, le=64, description="GPUs the node must show")
    hca_count: int = Field(
        alias="hcaCount", ge=0, le=64, description="InfiniBand HCAs the node must show"
    )

    @field_validator("gpu_model")
    @classmethod
    def _label_safe(cls, v: str) -> str:
        v = re.sub(r"\s+", "-", v.strip())
        if not _LABEL_VALUE.match(v):
            raise ValueError(f"gpuModel must be usable as a label value, got {v!r}")
        return v

    def hardware(self) -> Hardware:
        return Hardware(self.gpu_model, self.gpu_count, self.hca_count)


class Topology(_Model):
    """Where the machine sits in the InfiniBand fabric (becomes Node labels: Slurm's topology
    and the maintenance plans' failure domains)."""

    leaf: str = Field(default="", description="InfiniBand leaf switch")
    block: str = Field(default="", description="InfiniBand block (group of leaves)")

    @field_validator("leaf", "block")
    @classmethod
    def _label_safe(cls, v: str) -> str:
        if not _LABEL_VALUE.match(v):
            raise ValueError(f"must be usable as a label value, got {v!r}")
        return v


class MachineSpec(_Model):
    """What the data centre says is in the rack: how to recognise the machine when it boots,
    how to reach its BMC, and what hardware its Node must show."""

    macs: list[str] = Field(
        min_length=1,
        description="MAC addresses of the boot NICs (stored in lower case)",
        json_schema_extra={"items": {"type": "string", "pattern": _MAC.pattern}},
    )
    serial: str = Field(min_length=1, description="chassis serial number, as the BMC reports it")
    bmc: Bmc
    pool: str = Field(
        default="default",
        description="node pool (disruption budget scope)",
        json_schema_extra={"minLength": 1, "maxLength": 63},
    )
    hardware: ExpectedHardware
    topology: Topology = Topology()
    enrollment_digest: str | None = Field(
        default=None,
        alias="enrollmentDigest",
        description="sha256:<hex> of the machine's enrollment secret (the secret is never stored)",
        json_schema_extra={"pattern": _DIGEST.pattern},
    )

    @field_validator("macs")
    @classmethod
    def _macs(cls, v: list[str]) -> list[str]:
        out = [normalize_mac(m) for m in v]
        if len(set(out)) != len(out):
            raise ValueError("a MAC is listed twice")
        return out

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: str) -> str:
        if not v or not _LABEL_VALUE.match(v):
            raise ValueError(f"pool must be usable as a label value, got {v!r}")
        return v

    @field_validator("enrollment_digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v and not _DIGEST.match(v):
            raise ValueError("enrollmentDigest must be sha256:<64 hex digits>")
        return v or None


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"machine name {name!r} must be a DNS label (lower-case letters, digits, '-'): "
            "it becomes the Node's name"
        )
    return name


def manifest(name: str, spec: MachineSpec) -> Json:
    """A Machine object to create or apply (status is written by provisioning)."""
    labels = {mac_label(m): "true" for m in spec.macs}
    labels[well_known.LABEL_POOL] = spec.pool
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": check_name(name), "labels": labels},
        "spec": spec.model_dump(by_alias=True, exclude_none=True),
    }


def spec_of(body: Json) -> MachineSpec:
    """The validated spec of a Machine object (raises pydantic's ValidationError)."""
    return MachineSpec.model_validate(body.get("spec") or {})


# ----------------------------------------------------------------------- CRD


def _str(description: str) -> Json:
    return {"type": "string", "description": description}


def _time(description: str) -> Json:
    return {"type": "string", "format": "date-time", "description": description + " (RFC 3339)"}


STATUS_SCHEMA: Json = {
    "type": "object",
    "description": "What provisioning did with the machine: armed or not, the join token "
    "issued, the boot in progress, the Node it became.",
    # Defaulted by the apiserver: a Machine nobody has written a status for yet reads as
    # what it is (Registered, armed: its first boot may get a token), for kubectl's
    # columns and every reader alike.
    "default": {},
    "properties": {
        "armed": {
            "type": "boolean",
            "default": True,
            "description": "the next boot may get a join token",
        },
        "armedBy": _str("who armed it last (the lifecycle controller for a reimage, or a person)"),
        "armedAt": _time("when it was armed last"),
        "tokenId": _str("the id of the last join token issued (the secret is never stored)"),
        "tokenIssuedAt": _time("when that token was issued"),
        "tokenExpiresAt": _time("when that token expires, used or not"),
        "tokensIssued": {"type": "integer", "description": "join tokens issued, all boots"},
        "lastBootAt": _time("when the machine last asked for a token (its last boot)"),
        "image": {
            "type": "string",
            "description": "the image version the machine boots (set by a reimage to a "
            "version; absent: the provisioning service's default image)",
        },
        "boot": {
            "type": "object",
            "description": "the boot in progress or the last one: when it was asked for, how far "
            "it came, how it ended",
            "properties": {
                "requestedAt": _time("when the power-on was asked for"),
                "requestedBy": _str("who asked for it (a reimage, an operator)"),
                "attempt": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "power-ons of this boot so far, the first included "
                    "(at most the policy's provisioning.bootAttempts)",
                },
                "networkBootAt": _time("when the machine asked for its iPXE script"),
                "outcome": {
                    "type": "string",
                    "enum": ["InProgress", "Joined", "Failed"],
                    "description": "InProgress, Joined (its Node registered) or Failed "
                    "(every attempt stalled)",
                },
                "stage": _str("how far it came: requested, network-boot, token-issued, joined"),
                "reason": _str("why it failed or stalled, one word (e.g. NoNetworkBoot)"),
                "message": _str("why, in words, with what to check"),
            },
        },
        "node": _str("the Node the machine became"),
        "phase": {
            "type": "string",
            "enum": ["Registered", "Armed", "Booting", "Joined", "Mismatch", "Failed"],
            "default": "Registered",
            "description": "Registered (known, not booted yet), Armed (the next boot gets a "
            "token), Booting (a token was issued), Joined (its Node registered with the "
            "expected hardware), Mismatch (it registered with other hardware: triage), "
            "Failed (the boot failed)",
        },
        "observed": _str("the hardware the joined Node showed (GPU model and count, HCAs)"),
        "message": _str("the last thing that happened, in words"),
        "observedGeneration": {
            "type": "integer",
            "description": "the metadata.generation of the spec last acted on",
        },
        "conditions": CONDITIONS,
    },
}
"""Written by provisioning (gpufleet.provision.issuer) and the controller (join, rearm)."""


def spec_schema() -> Json:
    return structural(MachineSpec.model_json_schema(by_alias=True))


def crd_manifest() -> Json:
    """The CustomResourceDefinition of ``Machine``."""
    return crd(
        NAMES,
        spec=spec_schema(),
        status=STATUS_SCHEMA,
        description="A physical server: inventory and boot status (docs/provisioning.md).",
        spec_required=True,
        columns=[
            column("Pool", "string", ".spec.pool"),
            column("GPU", "string", ".spec.hardware.gpuModel"),
            column("Phase", "string", ".status.phase"),
            column("Armed", "boolean", ".status.armed"),
            column("Node", "string", ".status.node"),
            AGE,
        ],
    )
