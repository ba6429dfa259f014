"""The tenant controller: Tenants to ResourceQuotas, RoleBindings, NetworkPolicies and Slurm
associations (docs/tenants.md); decisions in ``gpufleet.domain.tenancy``."""
