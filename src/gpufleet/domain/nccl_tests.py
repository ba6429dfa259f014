"""The one codec of nccl-tests' ``*_perf`` output (``all_reduce_perf``): text in, values out.

nccl-tests prints a header (``# nThread ... nGpus ...``, then one ``#  Rank  N Group G
Pid P on HOST device D [BUS] NAME`` line per rank), a table with one row per message size
(size, count, type, redop, root, then time, algbw, busbw and #wrong twice: out-of-place
and in-place), ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X``.
A single-node check (health.checks) reads the bandwidth; the domain burn-in
(:mod:`gpufleet.domain.domain_burnin`) reads several runs from one output, each after a
``# gpufleet test: NAME`` line: its all-reduce program prints the same format on the CPU
(gloo) and on GPUs (NCCL), so one codec reads both, and a site's own all_reduce_perf runs
are read the same way.

Pure: no I/O, so it is tested on real output without a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+\w+\s+\w+\s+-?\d+\s+"
    r"(?P<time>[\d.]+)\s+(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+)\s+(?P<wrong>\S+)"
    r"(?:\s+\S+\s+\S+\s+\S+\s+(?P<wrong_in>\S+))?"
)
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<bw>[\d.]+)")
_RANK = re.compile(r"^#\s*Rank\s+(?P<rank>\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(?P<host>\S+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(?P<n>\d+)")

TEST_MARK = "# gpufleet test:"
"""The line that starts one run's output in a multi-run output (the domain burn-in)."""


@dataclass(frozen=True, slots=True)
class NcclTestsResult:
    """``all_reduce_perf`` output: busbw per size (out-of-place) and the average."""

    busbw_by_size: dict[int, float]
    avg_busbw: float | None
    wrong: int
    """Sum of the #wrong columns, out-of-place and in-place (non-zero: corrupted results)."""
    hosts: dict[int, str] = field(default_factory=dict)
    """Rank -> host, from the header (empty when the header was not printed)."""
    out_of_bounds: int = 0
    """``# Out of bounds values``: results outside the expected range."""

    @property
    def peak_busbw(self) -> float | None:
        """Bus bandwidth at the largest message size."""
        if not self.busbw_by_size:
            return None
        return self.busbw_by_size[max(self.busbw_by_size)]

    @property
    def correct(self) -> bool:
        """No wrong element and no value out of bounds."""
        return self.wrong == 0 and self.out_of_bounds == 0


def parse(text: str) -> NcclTestsResult | None:
    """Parse nccl-tests ``*_perf`` output; None when there is no result row."""
    sizes: dict[int, float] = {}
    hosts: dict[int, str] = {}
    wrong = 0
    oob = 0
    for line in text.splitlines():
        if m := _ROW.match(line):
            sizes[int(m["size"])] = float(m["busbw"])
            wrong += sum(int(w) for w in (m["wrong"], m["wrong_in"] or "") if w.isdigit())
        elif m := _RANK.match(line):
            hosts[int(m["rank"])] = m["host"]
        elif m := _OOB.match(line):
            oob += int(m["n"])
    avg = _AVG.search(text)
    if not sizes and avg is None:
        return None
    return NcclTestsResult(sizes, float(avg["bw"]) if avg else None, wrong, hosts, oob)


def split(text: str) -> dict[str, str]:
    """One output holding several runs -> the text of each, by the name after
    :data:`TEST_MARK` (lines before the first mark are dropped)."""
    runs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(TEST_MARK):
            current = runs.setdefault(line[len(TEST_MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in runs.items()}


def parse_runs(text: str) -> dict[str, NcclTestsResult | None]:
    """Every run of a multi-run output, parsed (None: the run printed no result)."""
    return {name: parse(body) for name, body in split(text).items()}
