"""What resolving a node's policy costs: ``domain.policy_groups.policy_for`` and ``group_of``.

The controller resolves a Node's policy on every node pass, the agent on every change of
its Node's labels, the simulator once per node. This measures, per call, the built-in
policy (no overrides), and a policy with ``--overrides`` overrides (each a matchLabels on
the pool, a budget and an XID 79 rule) for a node that the last override matches (every
selector checked) and one none matches; and what loading such a policy costs (every
override's resolution is validated at load). Prints the median of ``--repeat`` timings of
``--calls`` calls each, in microseconds per call (CPU time of this process).

    .venv/bin/python bench/policy_groups.py [--overrides 8] [--calls 5000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import yaml

from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.policy import load_policy
from gpufleet.domain.policy_groups import group_of, policy_for

POOL = "gpufleet.io/pool"


def per_call_us(fn: Callable[[], Any], calls: int, repeat: int) -> float:
    """The median over ``repeat`` runs of the CPU time of one call, in microseconds."""
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(calls):
            fn()
        runs.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--overrides", type=int, default=8)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    plain = load_policy(DEFAULT_POLICY_YAML)
    spec["overrides"] = [
        {
            "name": f"group-{i}",
            "nodeSelector": {"matchLabels": {POOL: f"pool-{i}"}},
            "budget": {"maxNodes": 1},
            "rules": [{"match": {"xid": 79}, "action": "reimage"}],
        }
        for i in range(args.overrides)
    ]
    text = json.dumps(spec)
    grouped = load_policy(text)
    last = {POOL: f"pool-{args.overrides - 1}", "kubernetes.io/hostname": "node-1"}
    none = {POOL: "elsewhere", "kubernetes.io/hostname": "node-1"}
    n, r = args.calls, args.repeat
    rows = [
        ("policy_for, no overrides", per_call_us(lambda: policy_for(plain, last), n, r)),
        (
            f"policy_for, {args.overrides} overrides, the last matches",
            per_call_us(lambda: policy_for(grouped, last), n, r),
        ),
        (
            f"policy_for, {args.overrides} overrides, none matches",
            per_call_us(lambda: policy_for(grouped, none), n, r),
        ),
        (
            f"group_of, {args.overrides} overrides, the last matches",
            per_call_us(lambda: group_of(grouped, last), n, r),
        ),
        ("load_policy, no overrides", per_call_us(lambda: load_policy(DEFAULT_POLICY_YAML), 5, r)),
        (
            f"load_policy, {args.overrides} overrides",
            per_call_us(lambda: load_policy(text), 5, r),
        ),
    ]
    for what, us in rows:
        print(f"{what:<48} {us:10.1f} us/call")


if __name__ == "__main__":
    main()
