"""Start-up time of ``gpufleet`` commands that do not talk to a cluster.

Measures every command's ``--help`` (walked from the command tree, so a new command is
measured without touching this file) and the commands that work offline (``version``,
``policy validate FILE``, ``policy explain --policy FILE``, ``slurm render``, ``slurm
token``, ``health scan-log``, completion), each ``--runs`` times as a fresh process of
the installed console script, as a person or a completion script runs it. Prints, per
command, the median CPU time of the process (user + system: on a shared machine the
wall time includes waiting for a core, the CPU time does not) with its spread (min-max)
and the median wall time, and flags each whose median CPU time is over ``--limit``
(0.3 s, the target of docs/cli.md). Beside them, the floor: what any typer command pays
before gpufleet's code.

With ``--importtime`` it also prints the modules that cost most to import for one
command (``python -X importtime``, cumulative). ``--against SRC`` compares with another
source tree (``mkdir /tmp/before && git archive <commit> src | tar -x -C /tmp/before``,
then ``--against /tmp/before/src``): both run from their source (``python -c``, the
console script's call), one run of each in turn, so that both see the same load on a
shared machine.

    .venv/bin/python bench/cli_startup.py [--runs 5] [--only WORD] [--importtime "nodes --help"]
        [--against SRC] [--limit 0.3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "gpufleet"
FLOOR = "import typer, typer.rich_utils"
"""What any typer command imports before its own code: typer and Rich's help formatter."""
FROM_SOURCE = "from gpufleet.cli.main import main; main(prog_name='gpufleet')"
"""A tree's command, as the console script runs it (its name, for completion too)."""


def help_commands() -> list[list[str]]:
    """``--help`` of the root and of every command and group under it."""
    from gpufleet.cli.main import command_tree

    def walk(cmd: Any, path: list[str]) -> list[list[str]]:
        found = [[*path, "--help"]]
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            found += walk(sub, [*path, name])
        return found

    return walk(command_tree(), [])


def offline_commands(tmp: Path) -> list[list[str]]:
    """Commands that do their work without a cluster, with the files they read."""
    policy = tmp / "policy.yaml"
    policy.write_text(_run_text(["policy", "show"]))
    nodes = tmp / "nodes.json"
    node = {
        "metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {"capacity": {"cpu": "96", "memory": "1Ti"}},
    }
    nodes.write_text(json.dumps({"items": [node]}))
    key = tmp / "jwt.key"
    key.write_bytes(b"k" * 32)
    kernel_log = tmp / "kern.log"
    kernel_log.write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    return [
        ["version"],
        ["--version"],
        ["version", "-o", "json"],
        ["policy", "validate", str(policy)],
        ["policy", "explain", "--xid", "79", "--policy", str(policy)],
        ["slurm", "render", str(ROOT / "examples" / "slurmcluster.yaml"), "--nodes", str(nodes)],
        ["slurm", "token", "--jwt-key-file", str(key)],
        ["health", "scan-log", str(kernel_log)],
        ["--show-completion", "bash"],
        ["COMPLETE", "gpufleet po"],
        ["COMPLETE", "gpufleet maintenance cr"],
    ]


def _run_text(argv: list[str]) -> str:
    return subprocess.run(
        [str(SCRIPT), *argv], stdout=subprocess.PIPE, text=True, check=True, env=_env()
    ).stdout


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("_GPUFLEET_COMPLETE", None)
    env["COLUMNS"] = "100"
    return env


def _once(argv: list[str], src: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``gpufleet argv`` (from ``src`` if given).
    ``COMPLETE "words"`` is what bash's completion function runs for those words."""
    env = _env()
    command = [str(SCRIPT)]
    if src is not None:
        env["PYTHONPATH"] = src
        command = [sys.executable, "-c", FROM_SOURCE]
    if argv[0] == "COMPLETE":
        words = argv[1]
        env.update(
            _GPUFLEET_COMPLETE="complete_bash",
            COMP_WORDS=words,
            COMP_CWORD=str(len(words.split()) - 1),
        )
        argv = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([*command, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _floor() -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR], check=True, env=_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _label(argv: list[str], tmp: Path) -> str:
    if argv[0] == "COMPLETE":
        return f"completion: {argv[1]}<TAB>"
    return "gpufleet " + " ".join(
        a.replace(str(tmp), "TMP").replace(str(ROOT) + "/", "") for a in argv
    )


def _row(label: str, runs: list[tuple[float, float]], limit: float) -> tuple[str, bool]:
    cpu = [c for _, c in runs]
    wall = [w for w, _ in runs]
    median = statistics.median(cpu)
    over = median > limit
    line = (
        f"{label[:62]:<62} {median:6.3f}s {min(cpu):6.3f}-{max(cpu):5.3f}s"
        f" {statistics.median(wall):6.3f}s {'OVER' if over else ''}"
    )
    return line, over


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
    parser.add_argument("--runs", type=int, default=5, help="runs per command")
    parser.add_argument("--limit", type=float, default=0.3, help="CPU seconds flagged over")
    parser.add_argument("--only", help="measure only the commands whose line has this word")
    parser.add_argument("--importtime", metavar="ARGS", help='e.g. "nodes --help"')
    parser.add_argument("--top", type=int, default=15, help="modules shown with --importtime")
    parser.add_argument("--against", help="another tree's src/ to run in turn with this one")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-cli-startup-"))
    commands = help_commands() + offline_commands(tmp)
    if args.only:
        commands = [c for c in commands if args.only in " ".join(c)]
    print(
        f"{SCRIPT}, median of {args.runs} runs each, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f} at the start"
    )
    print(f"{'command':<62} {'cpu':>7} {'cpu min-max':>12} {'wall':>7}")
    trees = [None] if args.against is None else [str(ROOT / "src"), args.against]
    floor: list[tuple[float, float]] = []  # one run per round: the same load as the commands
    over: list[str] = []
    for argv in commands:
        runs: dict[str | None, list[tuple[float, float]]] = {t: [] for t in trees}
        for tree in trees:
            _once(argv, tree)  # warm the page cache and the .pyc files
        for _ in range(args.runs):
            for tree in trees:
                runs[tree].append(_once(argv, tree))
        floor.append(_floor())
        for tree in trees:
            against = args.against is not None and tree == args.against
            suffix = " (against)" if against else ""
            label = _label(argv, tmp)[: 62 - len(suffix)] + suffix
            line, flagged = _row(label, runs[tree], args.limit)
            print(line, flush=True)
            if flagged and not against:
                over.append(label)
    line, _ = _row(f"floor: python -c '{FLOOR}'", floor, args.limit)
    print(line)
    print(
        f"load {os.getloadavg()[0]:.2f} at the end; {len(over)} of {len(commands)} over "
        f"{args.limit:g} s of CPU" + (": " + ", ".join(over) if over else "")
    )
    if args.importtime:
        importtime(args.importtime.split(), args.top)


if __name__ == "__main__":
    main()
