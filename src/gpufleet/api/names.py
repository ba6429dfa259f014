"""The API group, version and the names of every gpufleet custom resource.

Names are part of the API (DESIGN.md, Contracts): a renamed plural breaks every
installed CRD and every ``kubectl get``, so they live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain import well_known

GROUP = well_known.GROUP
VERSION = well_known.VERSION
API_VERSION = f"{GROUP}/{VERSION}"


@dataclass(frozen=True)
class Names:
    """How a kind is spelled in the apiserver, kubectl and the CRD."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    namespaced: bool = False
    categories: tuple[str, ...] = ()

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


FLEET_POLICY = Names("FleetPolicy", "fleetpolicies", ("fpol",), categories=("gpufleet",))
NODE_REMEDIATION = Names("NodeRemediation", "noderemediations", ("nrem",), categories=("gpufleet",))
MACHINE = Names("Machine", well_known.MACHINE_PLURAL, ("gfm",), categories=("gpufleet",))
SLURM_CLUSTER = Names(
    "SlurmCluster", "slurmclusters", ("slurm",), namespaced=True, categories=("gpufleet",)
)
MAINTENANCE_PLAN = Names(
    "MaintenancePlan", "maintenanceplans", ("mplan",), categories=("gpufleet",)
)
TENANT = Names("Tenant", "tenants", ("tn",), categories=("gpufleet",))

ALL = (FLEET_POLICY, NODE_REMEDIATION, MACHINE, SLURM_CLUSTER, MAINTENANCE_PLAN, TENANT)
