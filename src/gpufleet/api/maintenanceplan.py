"""``MaintenancePlan``: roll a reimage, a reboot, a node command or a drain-verify-return
across nodes.

``spec`` says what, where and how fast (:class:`MaintenancePlanSpec`); the
lifecycle controller (``gpufleet.lifecycle.maintenance``) picks the batches with
:func:`gpufleet.domain.maintenance.next_batch`, asks for each node through the
ordinary decision path, and writes ``status``: counts, one entry per node,
the plan's phase and conditions (docs/operations.md, docs/decisions/0110).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpufleet.api.names import API_VERSION, MAINTENANCE_PLAN
from gpufleet.api.schema import AGE, CONDITIONS, Json, column, crd, structural
from gpufleet.domain import boot_images, maintenance, well_known
from gpufleet.domain.policy import DrainMode, RequeueMode

NAMES = MAINTENANCE_PLAN
KIND = NAMES.kind
PLURAL = NAMES.plural

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
DEFAULT_DOMAIN_LABEL = well_known.LABEL_IB_LEAF


class MaintenancePlanSpec(BaseModel):
    """What to change, on which nodes, how many at once, and when to stop."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    node_selector: dict[str, str] = Field(
        alias="nodeSelector",
        description="Node labels that must all match (as a Pod's nodeSelector); "
        "{} selects every node",
    )
    action: maintenance.Action = Field(
        description="reimage (to spec.image, through the BMC), reboot (through the BMC), "
        "command (the node's agent runs spec.command), or noop (drain, hold in maintenance, "
        "verify, return)"
    )
    image: str | None = Field(
        default=None,
        description="The image version a reimage installs: the provisioning service serves "
        "<images-url>/<version>/ to the re-imaged machines; recorded on each verified node",
        json_schema_extra={"maxLength": 63, "pattern": boot_images.VERSION.pattern},
    )
    command: str | None = Field(
        default=None,
        description="For action command: the name of a maintenance command installed on the "
        "nodes (an executable in the agent's --maintenance-commands directory, e.g. "
        "/etc/gpufleet/maintenance.d/<name>); the plan names it, the node decides what it runs",
        json_schema_extra={"maxLength": 63, "pattern": maintenance.COMMAND_NAME.pattern},
    )
    command_timeout_seconds: int = Field(
        default=int(maintenance.DEFAULT_COMMAND_TIMEOUT_S),
        ge=10,
        le=86400,
        alias="commandTimeoutSeconds",
        description="For action command: the agent kills the command after this long (a "
        "failure); a node whose agent never answers fails 120 s later",
    )
    max_unavailable: int = Field(
        default=1,
        ge=1,
        alias="maxUnavailable",
        description="Nodes of the plan out at once (one batch); the pool's disruption budget "
        "bounds it too",
    )
    failure_domain_label: str = Field(
        default=DEFAULT_DOMAIN_LABEL,
        alias="failureDomainLabel",
        description="Node label naming the failure domain (rack, leaf); nodes without it share one",
    )
    max_per_domain: int = Field(
        default=1, ge=1, alias="maxPerDomain", description="Nodes of one failure domain per batch"
    )
    scope: maintenance.Scope = Field(
        default=maintenance.Scope.NODE,
        description="node: nodes in batches (maxUnavailable, maxPerDomain); nvlinkDomain: whole "
        "NVLink domains (switch firmware, NVSwitch tray service): every tray of a domain "
        "drained together, the command run on each only once all are empty, all returned "
        "together; the domain's own disruption budget is exceeded for it (the pool's, the "
        "fleet's and the group's still hold); action command or noop",
    )
    max_domains: int = Field(
        default=1,
        ge=1,
        alias="maxDomains",
        description="For scope nvlinkDomain: whole NVLink domains out at once (one batch)",
    )
    max_failures: int = Field(
        default=1,
        ge=1,
        alias="maxFailures",
        description="The plan stops once this many nodes failed (verification or triage)",
    )
    requeue: RequeueMode = Field(
        default=RequeueMode.LET_FINISH,
        description="Slurm jobs on a node: let-finish (the node waits for them) or now (requeue)",
    )
    drain_mode: DrainMode = Field(
        default=DrainMode.EVICT,
        alias="drainMode",
        description="How pods leave (evict respects PodDisruptionBudgets)",
    )
    start_at: datetime | None = Field(
        default=None,
        alias="startAt",
        description="No node starts before this time (RFC 3339 with a zone): a maintenance "
        "window; none: at once",
    )
    slurm_reservation: bool = Field(
        default=True,
        alias="slurmReservation",
        description="With startAt: the Slurm syncer holds the plan's unfinished nodes in a "
        "maintenance reservation (gpufleet-maint-<plan>) from that time, so Slurm starts no "
        "job on them that would still run then; each node leaves it once finished",
    )
    paused: bool = Field(default=False, description="Start no new node (nodes out finish)")
    abort: bool = Field(
        default=False, description="Stop for good: no new node starts, nodes out finish"
    )

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise ValueError(f"not a label: {key}={value}")
        return v

    @field_validator("failure_domain_label")
    @classmethod
    def _label_key(cls, v: str) -> str:
        if not _LABEL_KEY.match(v):
            raise ValueError(f"not a label key: {v!r}")
        return v

    @field_validator("image")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        return boot_images.check_version(v) if v else v

    @field_validator("start_at")
    @classmethod
    def _zoned(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("startAt needs a time zone, e.g. 2026-01-31T02:00:00Z")
        return v

    @field_validator("command")
    @classmethod
    def _command_name(cls, v: str | None) -> str | None:
        if v is not None and not maintenance.COMMAND_NAME.match(v):
            raise ValueError(
                f"not a command name: {v!r} (a file name in the agent's maintenance commands"
                " directory: letters, digits, '.', '_', '-'; no path)"
            )
        return v

    @model_validator(mode="after")
    def _image_for_reimage(self) -> MaintenancePlanSpec:
        if self.action is maintenance.Action.REIMAGE and not self.image:
            raise ValueError("a reimage needs spec.image (the image version to install)")
        if self.action is maintenance.Action.COMMAND and not self.command:
            raise ValueError("action command needs spec.command (the maintenance command's name)")
        if self.action is not maintenance.Action.COMMAND and self.command:
            raise ValueError(f"spec.command is for action command, not {self.action}")
        if (
            self.scope is maintenance.Scope.NVLINK_DOMAIN
            and self.action not in maintenance.DOMAIN_ACTIONS
        ):
            raise ValueError(
                f"scope nvlinkDomain runs action command or noop, not {self.action} (a reboot "
                "or reimage of trays needs no empty domain: use scope node)"
            )
        return self

    def rollout(self) -> maintenance.Rollout:
        return maintenance.Rollout(
            max_unavailable=self.max_unavailable,
            max_per_domain=self.max_per_domain,
            max_failures=self.max_failures,
            paused=self.paused,
            aborted=self.abort,
            start_at=self.start_at.timestamp() if self.start_at is not None else None,
            scope=self.scope,
            max_domains=self.max_domains,
        )


def manifest(name: str, spec: MaintenancePlanSpec) -> Json:
    """A MaintenancePlan object to create."""
    body: dict[str, Any] = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": body}


_NODE_STATUS: Json = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "The Node."},
        "phase": {
            "type": "string",
            "enum": [p.value for p in maintenance.NodePhase],
            "description": "Pending (not started), Requested (asked for; a rail may hold it), "
            "Draining, Updating (the change is being made), Verifying, Succeeded (verified, "
            "back in production) or Failed (verification failed, or triage or rma).",
        },
        "domain": {
            "type": "string",
            "description": "Its failure domain (the value of spec.failureDomainLabel); for "
            "scope nvlinkDomain, its NVLink domain.",
        },
        "startedAt": {
            "type": "number",
            "nullable": True,
            "description": "When it started (epoch seconds); null: not started.",
        },
        "message": {"type": "string", "description": "Where it is, in words."},
        "imageVersion": {
            "type": "string",
            "description": "For a reimage: the image version the node was verified on.",
        },
    },
}

STATUS_SCHEMA: Json = {
    "type": "object",
    "description": "Written by the lifecycle controller, only when it changes.",
    "properties": {
        "phase": {
            "type": "string",
            "enum": [p.value for p in maintenance.PlanPhase],
            "description": "Scheduled (its startAt has not come), Progressing, Paused, "
            "Stopped (maxFailures nodes failed), Aborted or Completed.",
        },
        "message": {"type": "string", "description": "Where the plan is, in words."},
        "total": {"type": "integer", "description": "Nodes the plan selected."},
        "succeeded": {"type": "integer", "description": "Nodes verified and back."},
        "failed": {"type": "integer", "description": "Nodes that failed."},
        "inProgress": {"type": "integer", "description": "Nodes out now (this batch)."},
        "pending": {"type": "integer", "description": "Nodes not started yet."},
        "progress": {"type": "string", "description": "finished/total, e.g. 3/8"},
        "nodes": {
            "type": "array",
            "description": "Every node of the plan, with its phase.",
            "items": _NODE_STATUS,
        },
        "observedGeneration": {
            "type": "integer",
            "description": "The metadata.generation of the spec last acted on.",
        },
        "conditions": CONDITIONS,
    },
}
"""Written by the controller (``gpufleet.lifecycle.maintenance``), only when it changes."""


def spec_schema() -> Json:
    return structural(MaintenancePlanSpec.model_json_schema(by_alias=True))


def crd_manifest() -> Json:
    return crd(
        NAMES,
        spec=spec_schema(),
        status=STATUS_SCHEMA,
        description="A rollout of a reimage, reboot, node command or drain-verify-return "
        "across nodes, in batches bounded by the disruption budget and failure domains.",
        columns=[
            column("Action", "string", ".spec.action"),
            column("Image", "string", ".spec.image"),
            column("Command", "string", ".spec.command"),
            {**column("Scope", "string", ".spec.scope"), "priority": 1},
            column("Phase", "string", ".status.phase"),
            column("Progress", "string", ".status.progress"),
            column("Start", "string", ".spec.startAt"),
            column("Failed", "integer", ".status.failed"),
            AGE,
        ],
        spec_required=True,
    )
