"""The ``Machine`` resource as provisioning reads it: :mod:`gpufleet.api.machine`.

The model, names and CRD moved to the api package (the lifecycle controller
reads Machines too); this module keeps provisioning's ``machines.X`` spelling.
"""

from __future__ import annotations

from gpufleet.api.machine import (
    KIND,
    PLURAL,
    Bmc,
    ExpectedHardware,
    MachineSpec,
    Topology,
    check_name,
    mac_label,
    manifest,
    normalize_mac,
    spec_of,
)
from gpufleet.api.names import API_VERSION
from gpufleet.api.schema import Json

__all__ = [
    "API_VERSION",
    "KIND",
    "PLURAL",
    "Bmc",
    "ExpectedHardware",
    "Json",
    "MachineSpec",
    "Topology",
    "check_name",
    "mac_label",
    "manifest",
    "normalize_mac",
    "spec_of",
]
