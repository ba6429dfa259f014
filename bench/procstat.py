"""CPU time from ``/proc`` and py-spy profiles, shared by the benchmarks that measure a
component's cost."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str | Path) -> float:
    """User + system CPU seconds from a ``/proc`` stat file: a process's
    (``/proc/<pid>/stat``) or one thread's (``/proc/<pid>/task/<tid>/stat``)."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def process_cpu_seconds(pid: int) -> float:
    return cpu_seconds(f"/proc/{pid}/stat")


def profile(
    pid: int,
    seconds: float,
    out: Path,
    *,
    what: str,
    thread: int | None = None,
    rate: int = 50,
) -> None:
    """Sample process ``pid`` with py-spy (``$PY_SPY`` or ``py-spy`` on PATH) for
    ``seconds`` at ``rate`` samples a second (only the thread whose native id is
    ``thread``, when given); print the functions holding the most samples, self and
    inclusive."""
    spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not spy:
        raise SystemExit("profiling needs py-spy: set PY_SPY or put it on PATH")
    args = [spy, "record", "--format", "raw", "-r", str(rate), "-d", str(int(seconds))]
    args += ["-p", str(pid), "-o", str(out), *(["--threads"] if thread is not None else [])]
    subprocess.run(args, check=True, capture_output=True)
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if thread is not None:
            if not frames[0].startswith(f"thread ({thread})"):
                continue
            frames = frames[1:]
        if not frames:
            continue
        n = int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    print(f"{what}: {total} samples in {seconds:g} s ({rate}/s while on CPU)")
    for title, table in (("self", own), ("inclusive", inclusive)):
        print(f"  top {title}:")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:25]:
            print(f"    {100 * n / max(total, 1):5.1f}%  {frame}")
    print(f"  stacks: {out}")


def snapshot() -> dict[int, tuple[int, str, float]]:
    """Every process's parent, name and CPU seconds so far (from ``/proc/<pid>/stat``):
    two snapshots tell what ran on the machine between them."""
    out: dict[int, tuple[int, str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        comm = text.split("(", 1)[1].rsplit(")", 1)[0]
        fields = text.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def descendants(root: int, snap: dict[int, tuple[int, str, float]]) -> set[int]:
    """``root`` and every process below it in ``snap``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in snap.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


class Machine:
    """What else ran on the machine over a stretch of a benchmark: the load average at
    its start and end, and the CPU of every process that is not ``root`` or below it
    (the benchmark, its cluster and the component measured), top names first."""

    def __init__(self, root: int | None = None) -> None:
        self.root = root if root is not None else os.getpid()
        self.load0 = os.getloadavg()[0]
        self.before = snapshot()
        self.t0 = time.monotonic()

    def done(self) -> dict[str, Any]:
        """The figures since construction: ``load`` (1-minute load average, start and
        end), ``others_pct`` (the other processes, per cent of one core) and ``top``
        (the three heaviest others by name)."""
        after = snapshot()
        took = max(time.monotonic() - self.t0, 1e-9)
        ours = descendants(self.root, after) | descendants(self.root, self.before)
        by_name: dict[str, float] = {}
        for pid, (_, comm, cpu) in after.items():
            if pid in ours:
                continue
            was = self.before.get(pid)
            used = cpu - (was[2] if was is not None and was[1] == comm else 0.0)
            if used > 0:
                name = label(pid, comm)
                by_name[name] = by_name.get(name, 0.0) + used
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:3]
        return {
            "load": (self.load0, os.getloadavg()[0]),
            "others_pct": sum(by_name.values()) / took * 100,
            "top": [(name, used / took * 100) for name, used in top],
        }


def label(pid: int, comm: str) -> str:
    """A process's name, with what an interpreter runs (``python: pytest``, ``python:
    -m gpufleet.cli.main``): many of a machine's busy processes are all ``python``."""
    if not comm.startswith("python"):
        return comm
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return comm
    args = [a for a in args[1:] if a]
    if args[:1] == ["-m"] and len(args) > 1:
        return f"{comm}: -m {args[1]}"
    if args[:1] == ["-c"]:  # execnet starts pytest-xdist's workers so
        return f"{comm}: pytest-xdist worker" if "sys.stdin" in " ".join(args) else f"{comm}: -c"
    script = next((a for a in args if not a.startswith("-")), "")
    return f"{comm}: {Path(script).name}" if script else comm


def describe(m: dict[str, Any]) -> str:
    """One line for :meth:`Machine.done`'s figures."""
    top = ", ".join(f"{name} {pct:.0f}%" for name, pct in m["top"])
    return (
        f"load {m['load'][0]:.1f} -> {m['load'][1]:.1f}; other processes"
        f" {m['others_pct']:.0f}% of a core" + (f" ({top})" if top else "")
    )
