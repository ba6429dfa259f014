"""Soak the deterministic simulation: many seeds, each to its first violation or its end.

Prints one line per seed (its verdict), then the totals: seeds, violations by category,
steps, steps per second and seeds per minute on this machine. With ``--shrink`` the
first seed of every category is shrunk and its replayable spec written to ``--out``
(one JSON file per category), with the shrunk run's story.

    .venv/bin/python bench/dst_soak.py --seeds 200 [--start 0] [--duration 900]
        [--weights forge=0,replica=4] [--breaker-min-nodes 4] [--slurmd-roll] [--pod-scheduler]
        [--shrink --out /tmp/dst]

Replay one: ``.venv/bin/python bench/dst_soak.py --replay /tmp/dst/1_after-step-timeout.json``.
``--keep-going`` runs every seed to its end (the verdict is then its first violation).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import time
from dataclasses import replace

from gpufleet.dst.runner import Result, Spec, describe, ensure_hash_seed, run, shrink
from gpufleet.dst.scenario import Config, with_pod_scheduler, with_roll


def _config(args: argparse.Namespace) -> Config:
    base = Config(duration=args.duration, breaker_min_nodes=args.breaker_min_nodes)
    if args.slurmd_roll:
        base = with_roll(base)
    if args.domain_plan:
        base = replace(base, domains=True, domain_plan=True)
    if args.pod_scheduler:
        base = with_pod_scheduler(base)
    weights = dict(base.weights)
    for item in filter(None, args.weights.split(",")):
        kind, _, value = item.partition("=")
        if kind not in weights:
            raise SystemExit(f"--weights: no event kind {kind!r} (known: {', '.join(weights)})")
        weights[kind] = int(value)
    return replace(base, weights=weights)


def _save(out: pathlib.Path, r: Result, original: Result) -> None:
    assert r.violation is not None
    name = r.violation.category.replace("/", "_")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(r.replay_spec().to_json() + "\n")
    (out / f"{name}.txt").write_text(
        f"original: seed {original.spec.seed}, {original.virtual_s:.0f} virtual s, "
        f"{len(original.events)} events, {sum(1 for c in original.choices if c)} non-default "
        f"choices\n{describe(r, last=400)}\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example: .venv/bin/python bench/dst_soak.py --seeds 200 --shrink --out /tmp/dst; "
        "then --replay /tmp/dst/<category>.json tells that seed's story",
    )
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--duration", type=float, default=900.0)
    ap.add_argument("--weights", default="", help="event kind=weight overrides, comma separated")
    ap.add_argument("--breaker-min-nodes", type=int, default=2)
    ap.add_argument(
        "--slurmd-roll",
        action="store_true",
        help="the slurmd DaemonSet and the Slurm operator's roll, with its events (upgrade, "
        "roll-pause, roll-dry-run, roll-kill; --weights changes them)",
    )
    ap.add_argument(
        "--domain-plan",
        action="store_true",
        help="nodes in two NVLink domains and a MaintenancePlan of scope nvlinkDomain that "
        "empties each in turn (invariant 12)",
    )
    ap.add_argument(
        "--pod-scheduler",
        action="store_true",
        help="gpufleet pod-scheduler's loop and pod groups for it, with its events (pod-group, "
        "pod-kill; invariants 14-16)",
    )
    ap.add_argument("--shrink", action="store_true")
    ap.add_argument("--shrink-runs", type=int, default=150)
    ap.add_argument("--only", default="", help="shrink only these categories (comma separated)")
    ap.add_argument("--out", default="dst-findings")
    ap.add_argument("--replay", default="", help="a spec file written by --shrink")
    ap.add_argument(
        "--keep-going", action="store_true", help="run each seed to its end past violations"
    )
    args = ap.parse_args()
    ensure_hash_seed()
    if args.replay:
        r = run(Spec.from_json(pathlib.Path(args.replay).read_text()))
        print(describe(r, last=60))
        return 1 if r.failed else 0
    cfg = _config(args)
    counts: collections.Counter[str] = collections.Counter()
    shrunk: set[str] = set()
    only = set(filter(None, args.only.split(",")))
    steps = calls = 0
    virtual = 0.0
    run_wall = 0.0
    began = time.perf_counter()
    for seed in range(args.start, args.start + args.seeds):
        r = run(Spec(seed, cfg), keep_trace=False, stop_on_violation=not args.keep_going)
        steps += r.steps
        virtual += r.virtual_s
        calls += r.calls
        run_wall += r.wall_s
        cat = r.violation.category if r.violation else "ok"
        counts[cat] += 1
        verdict = r.violation.line() if r.violation else "ok"
        print(f"seed {seed:6d} {r.virtual_s:7.0f}s {r.wall_s:6.2f}s  {verdict[:220]}", flush=True)
        if args.shrink and r.violation and cat not in shrunk and (not only or cat in only):
            shrunk.add(cat)
            t0 = time.perf_counter()
            small = shrink(r, max_runs=args.shrink_runs)
            _save(pathlib.Path(args.out), small, r)
            print(
                f"  shrunk {cat} in {time.perf_counter() - t0:.0f}s: "
                f"{len(small.events)} events, {sum(1 for c in small.choices if c)} choices",
                flush=True,
            )
    wall = time.perf_counter() - began
    failed = sum(n for c, n in counts.items() if c != "ok")
    print(
        json.dumps(
            {
                "seeds": args.seeds,
                "failed": failed,
                "by_category": dict(sorted(counts.items())),
                "steps": steps,
                "trace_lines": calls,
                "steps_per_s": round(steps / run_wall) if run_wall else None,
                "virtual_s_per_s": round(virtual / run_wall) if run_wall else None,
                "seeds_per_min": round(60 * args.seeds / run_wall, 1) if run_wall else None,
                "wall_s": round(wall, 1),
                "config": {
                    "duration": cfg.duration,
                    "nodes": cfg.nodes,
                    "weights": args.weights,
                    "slurmd_roll": cfg.slurmd_roll,
                    "domain_plan": cfg.domain_plan,
                    "pod_scheduler": cfg.pod_scheduler,
                },
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
