"""Simulator speed and memory: prints figures, asserts nothing.

    .venv/bin/python bench/sim_bench.py

Targets (issue 7): 30 days x 3,504 GPUs in <= 2 s; 30 days x 100,000 GPUs in
<= 30 s on one core; memory grows with the number of nodes, not with time.
"""

from __future__ import annotations

import time
import tracemalloc

from gpufleet.domain.policy import default_policy
from gpufleet.sim import simulate
from gpufleet.sim.model import default_model


def timed(gpus: int, days: float, seed: int = 1) -> tuple[float, float, int, int]:
    start = time.perf_counter()
    r = simulate(default_model(), default_policy(), gpus=gpus, days=days, seed=seed)
    took = time.perf_counter() - start
    return took, r.ettr, sum(r.interruptions.values()), r.decisions


def peak_mib(gpus: int, days: float) -> float:
    tracemalloc.start()
    simulate(default_model(), default_policy(), gpus=gpus, days=days, seed=1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    default_model()
    default_policy()
    print("wall time (best of 3), default model and policy")
    print(f"{'GPUs':>8} {'days':>5} {'seconds':>8} {'ETTR':>7} {'interr.':>8} {'decisions':>9}")
    for gpus, days in ((3504, 30), (16384, 54), (100_000, 30)):
        best = min((timed(gpus, days, seed) for seed in (1, 2, 3)), key=lambda x: x[0])
        took, ettr, inter, dec = best
        print(f"{gpus:>8} {days:>5} {took:>8.2f} {ettr * 100:>6.2f}% {inter:>8} {dec:>9}")
    print()
    print("peak traced Python memory (MiB)")
    for gpus in (3504, 100_000):
        row = [f"{peak_mib(gpus, days):.1f} ({days} d)" for days in (30, 120, 360)]
        print(f"{gpus:>8} GPUs: " + "   ".join(row))


if __name__ == "__main__":
    main()
