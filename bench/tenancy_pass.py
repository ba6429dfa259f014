"""CPU cost of the tenant controller's decisions for one pass, at fleet sizes.

Builds ``--tenants`` tenants, each with ``--namespaces`` namespaces and ``--users`` users
(every tenant valid, one in ten claiming an older tenant's namespace: a conflict), and
times, ``--runs`` times each, what a pass decides without I/O: ``validate`` of every
tenant, ``conflicts`` across all, and per tenant ``split``, ``desired_objects`` and
``plan_objects`` against the objects as they would read back (nothing to write), plus
``plan_associations`` for every account. Prints the median and the spread (min-max) of
the CPU time of the whole pass (``time.process_time``: on a shared machine the wall time
includes waiting for a core).

    .venv/bin/python bench/tenancy_pass.py [--tenants 1000] [--namespaces 3] [--users 20]
        [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpufleet.domain import tenancy
from gpufleet.domain.tenancy import SlurmTenancy, Tenant, Usage, User


def fleet(n: int, namespaces: int, users: int) -> list[Tenant]:
    out = []
    for i in range(n):
        ns = [f"t{i}-ns{j}" for j in range(namespaces)]
        if i % 10 == 9:
            ns[0] = f"t{i - 1}-ns0"  # the older tenant's: a conflict
        people = tuple(User(f"u{i}x{k}", 10_000 + i * users + k, 10_000 + i) for k in range(users))
        out.append(
            Tenant(
                name=f"t{i}",
                created=f"2026-01-01T00:00:{i % 60:02d}Z",
                namespaces=tuple(ns),
                users=people,
                gpu_quota=64,
            )
        )
    return out


def one_pass(tenants: list[Tenant], current: SlurmTenancy) -> int:
    written = 0
    for t in tenants:
        assert not tenancy.validate(t)
    conflicts = tenancy.conflicts(tenants)
    desired: dict[str, tenancy.SlurmAccount | None] = {}
    for t in tenants:
        if conflicts[t.name]:
            continue
        usage = Usage({ns: 8 for ns in t.namespaces}, 16)
        limits = tenancy.split(t.gpu_quota, usage)
        objs = tenancy.desired_objects(t, limits)
        existing = {o.key: dict(o.body) for o in objs}
        ops = tenancy.plan_objects(t.name, objs, existing)
        written += len(ops.put) + len(ops.delete)
        desired[t.account] = tenancy.desired_account(t, limits.slurm_gpus)
    written += len(tenancy.plan_associations(desired, current))
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--namespaces", type=int, default=3)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    tenants = fleet(args.tenants, args.namespaces, args.users)
    conflicts = tenancy.conflicts(tenants)
    current = SlurmTenancy(
        {
            t.account: tenancy.desired_account(t, 64 - 3 * 8)
            for t in tenants
            if not conflicts[t.name]
        },
        {},
    )
    times = []
    for _ in range(args.runs):
        start = time.process_time()
        writes = one_pass(tenants, current)
        times.append(time.process_time() - start)
    assert writes == 0, f"{writes} writes in a pass where everything is applied"
    print(
        f"{args.tenants} tenants x {args.namespaces} namespaces x {args.users} users "
        f"({sum(1 for v in conflicts.values() if v)} in conflict): one pass's decisions "
        f"{statistics.median(times) * 1000:.0f} ms CPU (median of {args.runs}; "
        f"{min(times) * 1000:.0f}-{max(times) * 1000:.0f})"
    )


if __name__ == "__main__":
    main()
