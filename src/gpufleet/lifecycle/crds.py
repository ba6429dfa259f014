"""The lifecycle controller's custom resources, by the names it uses.

The models and CRDs live in :mod:`gpufleet.api` (``FleetPolicy``:
:mod:`gpufleet.api.fleetpolicy`, ``NodeRemediation``:
:mod:`gpufleet.api.noderemediation`); every CRD YAML is written by
``python -m gpufleet.api.crds``.
"""

from __future__ import annotations

from gpufleet.api import fleetpolicy, noderemediation
from gpufleet.api.names import GROUP, VERSION

FLEET_POLICY_PLURAL = fleetpolicy.PLURAL
NODE_REMEDIATION_PLURAL = noderemediation.PLURAL
policy_schema = fleetpolicy.spec_schema

__all__ = [
    "FLEET_POLICY_PLURAL",
    "GROUP",
    "NODE_REMEDIATION_PLURAL",
    "VERSION",
    "policy_schema",
]
