"""The NVLink fabric of a node: Fabric Manager registration, the IMEX domain, and
the NVLink clique the node belongs to.

Sources (both backends hand out the raw forms, so the same code judges both):

* per GPU, NVML's ``nvmlDeviceGetGpuFabricInfoV`` in the GPU's raw value set
  (:mod:`nvml_values` keys ``fabric_state``, ``fabric_status``,
  ``fabric_clique_id``, ``fabric_cluster_uuid``, ``fabric_health_summary``,
  ``fabric_health_mask``), or the ``Fabric`` block of ``nvidia-smi -q`` where
  NVML cannot give it (:func:`parse_smi_fabric`);
* the local IMEX daemon's answer to ``nvidia-imex-ctl -c <config> -q``:
  ``READY`` when it serves the domain (the check NVIDIA's DRA driver makes,
  cmd/compute-domain-daemon/main.go of NVIDIA/k8s-dra-driver-gpu).

What applies where (no false fault on a node without the feature):

* fabric state ``Not Supported`` (PCIe GPUs, one GPU, no NVSwitch): nothing
  to judge;
* HGX H100/H200/B200 (NVSwitch, one node): registration must complete with
  ``Success``; the cluster UUID is all zero and no clique is published;
* multi-node NVLink (GB200/GB300 NVL72: a non-zero cluster UUID): the same,
  plus the clique labels and, where the host runs IMEX (its node config file
  exists; with the DRA driver's ComputeDomains IMEX runs in pods instead and is
  the driver's to watch), the IMEX daemon must answer ``READY``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind

# nvmlGpuFabricState_t
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3
STATE_NAMES = {
    NOT_SUPPORTED: "Not Supported",
    NOT_STARTED: "Not Started",
    IN_PROGRESS: "In Progress",
    COMPLETED: "Completed",
}
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*
SUMMARY_NAMES = {0: "Not Supported", 1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}
# NVML_GPU_FABRIC_HEALTH_MASK degraded-bandwidth field (bits 0-1): 1 = degraded
_DEGRADED_BW_TRUE = 1
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
IMEX_CONFIG = "/etc/nvidia-imex/config.cfg"
IMEX_NODES_CONFIG = "/etc/nvidia-imex/nodes_config.cfg"


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's fabric registration; None fields are unknown."""

    index: int
    state: int | None
    status: str | None
    """``Success`` or the NVML error NVML reported for the registration."""
    clique_id: int | None = None
    cluster_uuid: str | None = None
    health_summary: int | None = None
    degraded_bandwidth: bool | None = None

    @property
    def multi_node(self) -> bool:
        """Part of a multi-node NVLink domain (NVL72): a real cluster UUID."""
        return bool(self.cluster_uuid) and self.cluster_uuid != ZERO_UUID


def from_raw(raw: Mapping[str, Any]) -> GpuFabric | None:
    """The fabric fields of one GPU's raw value set; None when it has none (a
    backend or driver without the query) or no index."""
    index = raw.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or "fabric_state" not in raw:
        return None
    state = raw.get("fabric_state")
    status = raw.get("fabric_status")
    clique = raw.get("fabric_clique_id")
    summary = raw.get("fabric_health_summary")
    mask = raw.get("fabric_health_mask")
    uuid = raw.get("fabric_cluster_uuid")
    return GpuFabric(
        index=index,
        state=state if _is_int(state) and state in STATE_NAMES else None,
        status="Success" if status == 0 else (status if isinstance(status, str) else None),
        clique_id=clique if _is_int(clique) else None,
        cluster_uuid=uuid.lower() if isinstance(uuid, str) and _UUID.match(uuid) else None,
        health_summary=summary if _is_int(summary) and summary in SUMMARY_NAMES else None,
        degraded_bandwidth=(mask & 0x3) == _DEGRADED_BW_TRUE if isinstance(mask, int) else None,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def unreadable(gpus: Iterable[GpuFabric]) -> str | None:
    """Why the fabric cannot be judged (a GPU whose state or status is unknown)."""
    bad = [g.index for g in gpus if g.state is None or (g.state == COMPLETED and g.status is None)]
    return f"fabric state of GPU {', '.join(map(str, bad))} unreadable" if bad else None


def faults(
    gpus: Iterable[GpuFabric], *, node: str, now: float, imex: str | None = None
) -> list[FaultEvent]:
    """The fabric faults these GPUs (and the local IMEX answer, when IMEX applies)
    show. State faults: they stay while the condition lasts."""
    out: list[FaultEvent] = []
    for g in gpus:
        if g.state is None or g.state == NOT_SUPPORTED:
            continue
        where = f"GPU {g.index} fabric"
        if g.state != COMPLETED:
            _add(
                out,
                FaultKind.FABRIC_NOT_READY,
                g,
                node,
                now,
                f"{where} state {STATE_NAMES[g.state]}",
            )
        elif g.status != "Success":
            _add(
                out,
                FaultKind.FABRIC_NOT_READY,
                g,
                node,
                now,
                f"{where} registration failed: {g.status}",
            )
        elif g.multi_node and not g.clique_id:
            _add(out, FaultKind.FABRIC_NOT_READY, g, node, now, f"{where} has no NVLink clique")
        elif g.health_summary in (2, 3) or g.degraded_bandwidth:
            summary = SUMMARY_NAMES.get(g.health_summary or 0, "Not Supported")
            bw = ", bandwidth degraded" if g.degraded_bandwidth else ""
            _add(out, FaultKind.FABRIC_DEGRADED, g, node, now, f"{where} health {summary}{bw}")
    if imex is not None and imex.strip() != "READY":
        answer = " ".join(imex.split())[:120] or "no answer"
        out.append(
            FaultEvent(
                FaultKind.IMEX_NOT_READY,
                node,
                now,
                evidence=Evidence(message=f"IMEX daemon not READY: {answer}"),
            )
        )
    return out


def _add(
    out: list[FaultEvent], kind: FaultKind, g: GpuFabric, node: str, now: float, message: str
) -> None:
    counters: dict[str, float] = {}
    if g.clique_id is not None:
        counters["clique_id"] = g.clique_id
    out.append(
        FaultEvent(
            kind,
            node,
            now,
            evidence=Evidence(gpu_index=g.index, counters=counters, message=message),
        )
    )


def _registered(g: GpuFabric) -> bool:
    return g.state == COMPLETED and g.status == "Success"


def topology_labels(gpus: Iterable[GpuFabric]) -> dict[str, str | None] | None:
    """The Node labels of the NVLink domain: the cluster UUID and the clique
    (``<cluster UUID>.<clique id>``, unique across cliques), or None values to
    remove them on a node outside any multi-node domain; None (leave the labels
    as they are) when a GPU's registration is not complete or they disagree."""
    found = list(gpus)
    if not found or any(g.state is None for g in found):
        return None
    if any(g.state != NOT_SUPPORTED and not _registered(g) for g in found):
        return None  # registering or failed: the fabric condition speaks; labels wait
    if not any(g.multi_node for g in found):
        return {well_known.LABEL_NVLINK_CLUSTER: None, well_known.LABEL_NVLINK_CLIQUE: None}
    ids = {
        (g.cluster_uuid, g.clique_id)
        for g in found
        if g.state == COMPLETED and g.status == "Success"
    }
    if len(ids) != 1 or any(g.state != COMPLETED for g in found):
        return None
    ((uuid, clique),) = ids
    if not uuid or not clique:
        return None
    return {
        well_known.LABEL_NVLINK_CLUSTER: uuid,
        well_known.LABEL_NVLINK_CLIQUE: f"{uuid}.{clique}",
    }


# --------------------------------------------------------------- nvidia-smi -q

_SMI_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
_SMI_FIELD = re.compile(r"^(\s+)([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*$")
_SMI_STATE = {v.lower(): k for k, v in STATE_NAMES.items()}
_SMI_SUMMARY = {v.lower(): k for k, v in SUMMARY_NAMES.items()}


def parse_smi_fabric(text: str) -> list[dict[str, Any]]:
    """The ``Fabric`` block of each GPU in ``nvidia-smi -q`` output, as raw value
    sets with the NVML keys (``index`` in output order). ``N/A`` is unknown
    for CliqueId/ClusterUUID and ``Not Supported`` for the state."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    fabric_indent: int | None = None
    for line in text.splitlines():
        if _SMI_GPU.match(line):
            current = {"index": len(out), "pci_bus_id": line.split()[1]}
            out.append(current)
            fabric_indent = None
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped == "Fabric":
            if current is None:  # a Fabric block on its own (``nvidia-smi -q | grep``)
                current = {"index": len(out)}
                out.append(current)
            fabric_indent = indent
            continue
        if current is None:
            continue
        if fabric_indent is None:
            continue
        if stripped and indent <= fabric_indent:
            fabric_indent = None
            continue
        m = _SMI_FIELD.match(line)
        if m is None:
            continue
        key, value = m[2].strip(), m[3].strip()
        low = value.lower()
        if key == "State":
            current["fabric_state"] = _SMI_STATE.get(low, NOT_SUPPORTED if low == "n/a" else -1)
        elif key == "Status":
            current["fabric_status"] = 0 if low == "success" else value
        elif key == "CliqueId":
            current["fabric_clique_id"] = int(value) if value.isdigit() else value
        elif key == "ClusterUUID":
            current["fabric_cluster_uuid"] = value
        elif key == "Summary":
            current["fabric_health_summary"] = _SMI_SUMMARY.get(low, -1)
        elif key == "Bandwidth":
            if low == "degraded":
                current["fabric_health_mask"] = _DEGRADED_BW_TRUE
            elif low == "full":
                current["fabric_health_mask"] = 2
    return out
