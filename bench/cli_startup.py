"""Start-up time of ``gpufleet`` commands that do not talk to a cluster.

Runs each command ``--runs`` times as a fresh process (the installed console script,
as a person or a completion script runs it) and prints, per command, the median and
90th percentile of the wall time and of the CPU time the process used (user +
system: on a shared machine the wall time includes waiting for a core, the CPU time
does not). With ``--importtime`` it also prints the modules that cost most to import
for the first command (``python -X importtime``, cumulative microseconds).

    .venv/bin/python bench/cli_startup.py [--runs 20] [--importtime]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "gpufleet"

COMMANDS = (
    ["--help"],
    ["version"],
    ["--version"],
    ["sim", "--help"],
    ["policy", "--help"],
    ["policy", "validate", "POLICY"],
    ["slurm", "render", "--help"],
    ["status", "--help"],
    ["nodes", "--help"],
)


def _once(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``gpufleet argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(SCRIPT), *argv], stdout=subprocess.DEVNULL, check=True, env=_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("_GPUFLEET_COMPLETE", None)
    env["COLUMNS"] = "100"
    return env


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def importtime(argv: list[str], top: int) -> None:
    """The modules that cost most to import for ``gpufleet argv`` (cumulative)."""
    code = (
        f"import sys; sys.argv = ['gpufleet', *{argv!r}]\n"
        "from gpufleet.cli.main import main\nmain()"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split("|"))
        if cumulative.isdigit():
            rows.append((int(cumulative), name))
    print(f"\nimport time, gpufleet {' '.join(argv)} (cumulative ms, top {top}):")
    for cumulative, name in sorted(rows, reverse=True)[:top]:
        print(f"  {cumulative / 1000:8.1f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command")
    parser.add_argument("--importtime", action="store_true", help="print the top importers")
    parser.add_argument("--top", type=int, default=15, help="modules shown with --importtime")
    args = parser.parse_args()
    print(f"{SCRIPT}, {args.runs} runs each, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print(f"{'command':<44} {'wall median':>11} {'wall p90':>9} {'cpu median':>11} {'cpu p90':>8}")
    policy = Path(tempfile.mkdtemp()) / "policy.yaml"
    policy.write_text(
        subprocess.run(
            [str(SCRIPT), "policy", "show"], stdout=subprocess.PIPE, text=True, check=True
        ).stdout
    )
    for template in COMMANDS:
        argv = [str(policy) if a == "POLICY" else a for a in template]
        _once(argv)  # warm the page cache and the .pyc files
        walls, cpus = zip(*(_once(argv) for _ in range(args.runs)), strict=True)
        shown = " ".join(template)
        wall, cpu = list(walls), list(cpus)
        print(
            f"{'gpufleet ' + shown:<44} {statistics.median(wall):>10.3f}s {_p90(wall):>8.3f}s"
            f" {statistics.median(cpu):>10.3f}s {_p90(cpu):>7.3f}s"
        )
    if args.importtime:
        importtime(list(COMMANDS[0]), args.top)


if __name__ == "__main__":
    main()
