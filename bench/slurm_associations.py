"""What the tenant controller's Slurm port costs per poll, on real slurmctld + slurmdbd.

Starts a 2-node local cluster with Slurm 24.11, accounting (MariaDB, slurmdbd) and limits
enforced, then through :class:`gpufleet.slurm.associations.SacctmgrAssociations`:
creates ``--tenants`` accounts of ``--users`` users each with a GPU limit (the first
pass of a controller over a fleet's tenants: every op one ``sacctmgr -i``), then times
``--runs`` reads (two ``sacctmgr`` queries and one ``squeue``: what every poll does)
and one pass that changes every limit. Prints JSON: ops applied and seconds, read
seconds (median, max), accounts read back, the limits pass's seconds.

    python bench/slurm_associations.py --tenants 50 --users 4 --runs 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from gpufleet.domain import tenancy
from gpufleet.domain.tenancy import SlurmAccount
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterSpec, LocalCluster
from gpufleet.slurm.associations import SacctmgrAssociations


def desired(tenants: int, users: int, limit: int) -> dict[str, SlurmAccount | None]:
    return {
        f"t{i:03d}": SlurmAccount(
            name=f"t{i:03d}",
            description=tenancy.managed_description(f"t{i:03d}"),
            users=frozenset(f"u{i:03d}x{j}" for j in range(users)),
            gpu_limit=limit,
            qos=frozenset({"normal"}),
            default_qos="normal",
        )
        for i in range(tenants)
    }


async def measure(
    port: SacctmgrAssociations, tenants: int, users: int, runs: int
) -> dict[str, object]:
    t0 = time.monotonic()
    ops = tenancy.plan_associations(desired(tenants, users, 8), await port.read())
    await port.apply(ops)
    created = time.monotonic() - t0
    reads = []
    for _ in range(runs):
        t = time.monotonic()
        current = await port.read()
        reads.append(time.monotonic() - t)
    assert tenancy.plan_associations(desired(tenants, users, 8), current) == []
    t = time.monotonic()
    changed = tenancy.plan_associations(desired(tenants, users, 4), current)
    await port.apply(changed)
    limits_s = time.monotonic() - t
    return {
        "tenants": tenants,
        "users_per_tenant": users,
        "ops_first_pass": len(ops),
        "first_pass_s": round(created, 2),
        "read_s_median": round(statistics.median(reads), 3),
        "read_s_max": round(max(reads), 3),
        "accounts_read": len(current.accounts),
        "limit_ops": len(changed),
        "limits_pass_s": round(limits_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, default=50)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    spec = ClusterSpec(
        nodes=2, redfish=False, slurm_version="24.11", slurm_accounting=True,
        slurm_enforce_limits=True,
    )  # fmt: skip
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        port = SacctmgrAssociations(env=info.slurm_env(), cluster="gpufleet")
        print(json.dumps(asyncio.run(measure(port, a.tenants, a.users, a.runs)), indent=1))


if __name__ == "__main__":
    main()
