"""Start-up time of ``gpufleet`` commands that do not talk to a cluster.

Runs each command ``--runs`` times as a fresh process (the installed console script,
as a person or a completion script runs it) and prints, per command, the median and
90th percentile of the wall time and of the CPU time the process used (user +
system: on a shared machine the wall time includes waiting for a core, the CPU time
does not). With ``--importtime`` it also prints the modules that cost most to import
for the first command (``python -X importtime``, cumulative microseconds).

``--against SRC`` compares with another source tree (``mkdir /tmp/before && git archive
<commit> src | tar -x -C /tmp/before``, then ``--against /tmp/before/src``): both run as
``python -m gpufleet.cli.main``, one run of each in turn, so that both see the same load
on a shared machine.

    .venv/bin/python bench/cli_startup.py [--runs 20] [--importtime] [--against SRC]
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


def _once(argv: list[str], src: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``gpufleet argv`` (from ``src`` if given)."""
    env = _env()
    command = [str(SCRIPT)]
    if src is not None:
        env["PYTHONPATH"] = src
        command = [sys.executable, "-m", "gpufleet.cli.main"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([*command, *argv], stdout=subprocess.DEVNULL, check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _floor() -> tuple[float, float]:
    """What any typer command pays before gpufleet's code: the interpreter, typer, the
    pydantic typer builds its option types with, and Rich's help formatter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    code = "import typer, typer.rich_utils, pydantic"
    subprocess.run([sys.executable, "-c", code], check=True, env=_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
    for micros, module in sorted(rows, reverse=True)[:top]:
        print(f"  {micros / 1000:8.1f}  {module}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command")
    parser.add_argument("--importtime", action="store_true", help="print the top importers")
    parser.add_argument("--top", type=int, default=15, help="modules shown with --importtime")
    parser.add_argument("--against", help="another tree's src/ to run in turn with this one")
    args = parser.parse_args()
    print(f"{SCRIPT}, {args.runs} runs each, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print(f"{'command':<44} {'wall median':>11} {'wall p90':>9} {'cpu median':>11} {'cpu p90':>8}")
    policy = Path(tempfile.mkdtemp()) / "policy.yaml"
    shown = subprocess.run(
        [str(SCRIPT), "policy", "show"], stdout=subprocess.PIPE, text=True, check=True
    ).stdout
    policy.write_text(shown)
    trees = [None] if args.against is None else [str(ROOT / "src"), args.against]
    floor: list[tuple[float, float]] = []  # one run per round: the same load as the commands
    for template in COMMANDS:
        argv = [str(policy) if a == "POLICY" else a for a in template]
        runs: dict[str | None, list[tuple[float, float]]] = {t: [] for t in trees}
        for tree in trees:
            _once(argv, tree)  # warm the page cache and the .pyc files
        for _ in range(args.runs):
            for tree in trees:
                runs[tree].append(_once(argv, tree))
            floor.append(_floor())
        for tree in trees:
            wall = [w for w, _ in runs[tree]]
            cpu = [c for _, c in runs[tree]]
            label = (
                "gpufleet " + " ".join(template) + (" (against)" if tree == args.against else "")
            )
            print(
                f"{label:<44} {statistics.median(wall):>10.3f}s {_p90(wall):>8.3f}s"
                f" {statistics.median(cpu):>10.3f}s {_p90(cpu):>7.3f}s"
            )
    wall = [w for w, _ in floor]
    cpu = [c for _, c in floor]
    print(
        f"{'floor: python -c import typer, pydantic, rich':<44} {statistics.median(wall):>10.3f}s"
        f" {_p90(wall):>8.3f}s {statistics.median(cpu):>10.3f}s {_p90(cpu):>7.3f}s"
    )
    if args.importtime:
        importtime(list(COMMANDS[0]), args.top)


if __name__ == "__main__":
    main()
