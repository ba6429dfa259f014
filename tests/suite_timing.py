"""Where the test run's time went, printed at the end of every run (the README's test command
shows it) and written as JSON when ``GPUFLEET_TEST_TIMES`` names a file.

A module's time is the sum of its tests' setup, call and teardown, so the set-up of a module
fixture (a cluster, a boot) counts against the module that asked for it. Under pytest-xdist the
reports reach the controller with the worker that ran them, so the same table shows which
worker ran what and how busy each was. The machine's CPU use over the run (``/proc/stat``) says
whether the run was waiting or computing: a run near 100 % of every core gains nothing from
more workers.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TOP = 15
"""Modules listed by name in the summary; the rest are summed."""


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine since boot; None where /proc/stat is absent."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def module_of(nodeid: str) -> str:
    """``tests/x/test_y.py::test_z[a]@group`` -> ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


@dataclass
class ModuleTime:
    seconds: float = 0.0
    tests: int = 0
    first_start: float = float("inf")
    last_stop: float = 0.0
    workers: set[str] = field(default_factory=set)


class TimingReport:
    """Collects every test report (controller side) and prints the summary."""

    def __init__(self) -> None:
        self.started = time.time()
        self.cpu_start = _cpu_ticks()
        self.modules: dict[str, ModuleTime] = {}
        self.tests: dict[str, float] = {}
        self.busy: dict[str, float] = {}
        self.outcomes: dict[str, str] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = module_of(report.nodeid)
        entry = self.modules.setdefault(module, ModuleTime())
        entry.seconds += report.duration
        if report.when == "call":
            entry.tests += 1
        start = getattr(report, "start", None)
        stop = getattr(report, "stop", None)
        if start is not None and stop is not None:
            entry.first_start = min(entry.first_start, start)
            entry.last_stop = max(entry.last_stop, stop)
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
        entry.workers.add(worker)
        self.busy[worker] = self.busy.get(worker, 0.0) + report.duration
        test = report.nodeid.split("@", 1)[0]
        self.tests[test] = self.tests.get(test, 0.0) + report.duration
        if report.failed:
            self.outcomes[test] = "failed" if report.when == "call" else "error"
        elif report.skipped and test not in self.outcomes:
            self.outcomes[test] = "skipped"
        elif report.when == "call" and test not in self.outcomes:
            self.outcomes[test] = "passed"

    def summary(self) -> dict[str, Any]:
        wall = time.time() - self.started
        cpu = None
        end = _cpu_ticks()
        if self.cpu_start is not None and end is not None and end[1] > self.cpu_start[1]:
            cpu = (end[0] - self.cpu_start[0]) / (end[1] - self.cpu_start[1])
        groups: dict[str, float] = {}
        for module, entry in self.modules.items():
            top = "/".join(module.split("/")[:2])
            groups[top] = groups.get(top, 0.0) + entry.seconds
        counts = {k: 0 for k in ("passed", "failed", "error", "skipped")}
        for outcome in self.outcomes.values():
            counts[outcome] += 1
        return {
            "outcomes": counts,
            "wall_s": round(wall, 1),
            "cpu_busy_fraction": None if cpu is None else round(cpu, 3),
            "cores": os.cpu_count(),
            "workers": {w: round(s, 1) for w, s in sorted(self.busy.items())},
            "directories": {d: round(s, 1) for d, s in sorted(groups.items())},
            "modules": {
                m: {
                    "seconds": round(e.seconds, 1),
                    "tests": e.tests,
                    "span_s": round(e.last_stop - e.first_start, 1) if e.last_stop else None,
                    "start_s": round(e.first_start - self.started, 1) if e.last_stop else None,
                    "workers": sorted(e.workers),
                }
                for m, e in sorted(self.modules.items(), key=lambda kv: -kv[1].seconds)
            },
            "slowest_tests": {
                t: round(s, 1) for t, s in sorted(self.tests.items(), key=lambda kv: -kv[1])[:TOP]
            },
        }

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.modules:
            return
        data = self.summary()
        write = terminalreporter.write_line
        terminalreporter.section("where the time went")
        cpu = data["cpu_busy_fraction"]
        write(
            f"pytest wall {data['wall_s']:.0f} s on {data['cores']} cores"
            + ("" if cpu is None else f", machine CPU busy {cpu:.0%} of the run")
        )
        write(
            "per worker (sum of its tests): "
            + ", ".join(f"{w} {s:.0f} s" for w, s in data["workers"].items())
        )
        write(
            "per directory: " + ", ".join(f"{d} {s:.0f} s" for d, s in data["directories"].items())
        )
        write(f"{'module':<58} {'tests':>5} {'seconds':>8} {'starts':>7}  worker")
        modules = list(data["modules"].items())
        for module, entry in modules[:TOP]:
            start = "" if entry["start_s"] is None else f"{entry['start_s']:.0f}"
            write(
                f"{module:<58} {entry['tests']:>5} {entry['seconds']:>8.1f} {start:>7}"
                f"  {','.join(entry['workers'])}"
            )
        rest = modules[TOP:]
        if rest:
            write(
                f"{f'{len(rest)} other modules':<58} {sum(e['tests'] for _, e in rest):>5}"
                f" {sum(e['seconds'] for _, e in rest):>8.1f}"
            )
        out = os.environ.get("GPUFLEET_TEST_TIMES")
        if out:
            Path(out).write_text(json.dumps(data, indent=1) + "\n")
