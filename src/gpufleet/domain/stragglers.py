"""Stragglers: a node that is consistently slower than its peers in the same job.

Synchronous data-parallel training runs at the pace of its slowest rank: every
step ends with a collective that waits for everyone. A GPU that computes 30%
slower (a degraded part, clocks stuck low, a bad PCIe link) logs nothing, trips
no threshold in NVML and fails no health check while it is busy, yet slows the
whole job by 30%. Only the job sees it: the slow rank's *own* work per step
(everything except waiting for its peers) takes longer than everyone else's.

**Job telemetry (the contract).** A job that wants its stragglers found writes
one JSON line per rank per step to
``$GPUFLEET_TELEMETRY_DIR/<job>.<run>/rank-<rank>.<node>.jsonl``::

    {"v": 1, "job": "1234", "run": 0, "rank": 3, "node": "gpu-node-0007",
     "step": 118, "compute_s": 0.412, "t": 1763700000.12}

``run`` is the requeue count (``SLURM_RESTART_COUNT``): a requeued job is a new
run, usually on other nodes. ``compute_s`` is the rank's own work in the step,
measured before the collective (with CUDA: synchronize, or use events, around
forward and backward). ``examples/slurm-ddp/train.py`` writes it.

**Replica groups** (a job of several groups that hold the same weights, such as
torchft's) add optional fields, which older readers ignore::

    {..., "group": "g1", "fingerprint": "0f3a5c9e12ab77d0", "loss": 2.31,
     "grad_norm": 0.87, "gpu": 6}

``group`` is the replica group (``[A-Za-z0-9_-]{1,64}``); ``fingerprint`` is 16
lowercase hex digits, ``blake2b(digest_size=8)`` over the bytes of every parameter
(float32, C order, in ``named_parameters()`` order) right after the step's
optimizer update, written every few steps only; ``loss`` and ``grad_norm`` are the
step's (a non-finite value is kept: it is a signal, not a bad line); ``gpu`` is the
local GPU index the rank ran on. All groups of one training share ``<job>``, ``run``
is 0 and ranks are unique over the training. :mod:`gpufleet.domain.sdc_vote`
compares the groups' fingerprints (silent data corruption). A field that is present
but malformed makes the whole line rejected, never a crash.

The node is in the file name so that a node's agent can find its own ranks
and a bounded sample of its peers (:func:`peers_to_read`) without reading
every rank of a 1,000-node job.

**The decision** (:func:`compare_nodes` and :func:`is_straggler`, pure, called by
the node agent that reads the telemetry of the jobs on its node): over the last ``windowSteps``
steps that every rank has reported, a node's pace is the median of its slowest
rank's ``compute_s``; a node whose pace is ``slowerThan`` times the median pace
of the other nodes is a straggler. Medians make one slow step (a checkpoint
save, a garbage collection) harmless. The agent reports a ``straggler`` fault
at most every ``reportEverySeconds`` while the node stays slow, and the policy's
rule for ``straggler`` decides what that means (by default: an Event, and the
third report within a day reboots the node).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TELEMETRY_VERSION = 1
"""The ``v`` of the lines this module reads and writes."""

RUN_DIR = re.compile(r"^(?P<job>[A-Za-z0-9_-]{1,64})\.(?P<run>\d{1,6})$")
"""Name of one job run's telemetry directory: ``<job>.<run>``."""

RANK_FILE = re.compile(
    r"^rank-(?P<rank>\d{1,7})\.(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,252})\.jsonl$"
)
"""Name of one rank's telemetry file: ``rank-<rank>.<node>.jsonl``."""

GROUP = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A replica group's id."""

FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
"""A weights fingerprint: 8 bytes of blake2b, lowercase hex."""

PEERS_READ = 16
"""Peer nodes whose ranks an agent reads: the median of 16 peers is close to
the median of all of them, and reading stays bounded in a 1,000-node job."""


@dataclass(frozen=True, slots=True)
class StepSample:
    """One rank's report of one step."""

    job: str
    run: int
    rank: int
    node: str
    step: int
    compute_s: float
    at: float
    group: str | None = None
    """The replica group (replica-group jobs only)."""
    fingerprint: str | None = None
    """The weights' fingerprint after this step's update (every few steps only)."""
    loss: float | None = None
    grad_norm: float | None = None
    gpu: int | None = None
    """The local GPU index the rank ran on, when the job knows it."""

    @property
    def run_id(self) -> str:
        """``<job>.<run>``: the directory name, and the key of one run."""
        return run_dir_name(self.job, self.run)


@dataclass(frozen=True, slots=True)
class StragglerRule:
    """When a node is a straggler (``detection.stragglers`` of the policy)."""

    slower_than: float = 1.08
    window_steps: int = 50


@dataclass(frozen=True, slots=True)
class NodePace:
    """How a node's compute per step compares with its peers' in one job run."""

    run_id: str
    node: str
    slowdown: float
    """The node's pace over the median pace of its peers (1.5 = 50% slower)."""
    compute_s: float
    peers_s: float
    peers: int
    first_step: int
    last_step: int

    def describe(self) -> str:
        return (
            f"job {self.run_id}: {self.compute_s:.3f} s of compute per step vs. "
            f"{self.peers_s:.3f} s on {self.peers} peer node(s), {self.slowdown:.2f}x, "
            f"steps {self.first_step}-{self.last_step}"
        )


def run_dir_name(job: str, run: int) -> str:
    """The telemetry directory of one run of a job."""
    return f"{job}.{run}"


def rank_file_name(rank: int, node: str) -> str:
    """The telemetry file of one rank."""
    return f"rank-{rank}.{node}.jsonl"


def node_of_rank_file(name: str) -> str | None:
    """The node in a rank file's name, or None if ``name`` is not a rank file."""
    m = RANK_FILE.match(name)
    return m["node"] if m else None


def peers_to_read(node: str, nodes: Iterable[str], limit: int = PEERS_READ) -> list[str]:
    """Up to ``limit`` other nodes of the job to compare ``node`` with.

    Deterministic for one node (its comparison does not jump between polls),
    different between nodes (no peer is read by every agent).
    """
    others = sorted({n for n in nodes if n != node})
    if len(others) <= limit:
        return others
    return sorted(others, key=lambda peer: zlib.crc32(f"{node}/{peer}".encode()))[:limit]


_OPTIONAL = ("group", "fingerprint", "loss", "grad_norm", "gpu")


def sample_line(sample: StepSample) -> str:
    """The JSON line a rank writes for ``sample`` (without the newline; optional
    fields only when set)."""
    doc: dict[str, object] = {
        "v": TELEMETRY_VERSION,
        "job": sample.job,
        "run": sample.run,
        "rank": sample.rank,
        "node": sample.node,
        "step": sample.step,
        "compute_s": sample.compute_s,
        "t": sample.at,
    }
    for name in _OPTIONAL:
        value = getattr(sample, name)
        if value is not None:
            doc[name] = value
    return json.dumps(doc, separators=(",", ":"))


def parse_sample(line: str) -> StepSample | None:
    """A telemetry line, or None when it is not one (never raises: a job's
    half-written last line or a foreign file must not stop the reader)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, Mapping) or doc.get("v") != TELEMETRY_VERSION:
        return None
    try:
        sample = StepSample(
            job=str(doc["job"]),
            run=int(doc["run"]),
            rank=int(doc["rank"]),
            node=str(doc["node"]),
            step=int(doc["step"]),
            compute_s=float(doc["compute_s"]),
            at=float(doc["t"]),
            group=_text(doc, "group", GROUP),
            fingerprint=_text(doc, "fingerprint", FINGERPRINT),
            loss=_number(doc, "loss"),
            grad_norm=_number(doc, "grad_norm"),
            gpu=_index(doc, "gpu"),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if not RUN_DIR.match(sample.run_id) or sample.rank < 0 or not sample.node:
        return None
    if not math.isfinite(sample.compute_s) or sample.compute_s < 0:
        return None
    return sample


def _text(doc: Mapping[str, object], key: str, pattern: re.Pattern[str]) -> str | None:
    """An optional string field; ValueError when present and not matching ``pattern``."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not pattern.match(value):
        raise ValueError(f"{key}: {value!r}")
    return value


def _number(doc: Mapping[str, object], key: str) -> float | None:
    """An optional number (NaN and infinities kept: a diverged loss is news)."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}: {value!r}")
    return float(value)


def _index(doc: Mapping[str, object], key: str) -> int | None:
    """An optional non-negative whole number."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key}: {value!r}")
    return value


def compare_nodes(samples: Iterable[StepSample], window_steps: int) -> list[NodePace]:
    """Every node's pace against its peers in one job run (``samples`` share a ``run_id``).

    Empty until ``window_steps`` steps are complete (every rank seen so far has
    reported them) on at least two nodes: with one node there is no peer.
    """
    by_step: dict[int, dict[int, StepSample]] = {}
    ranks: set[int] = set()
    run_id = ""
    for s in samples:
        by_step.setdefault(s.step, {})[s.rank] = s
        ranks.add(s.rank)
        run_id = s.run_id
    complete = [step for step in sorted(by_step) if len(by_step[step]) == len(ranks)]
    window = complete[-window_steps:]
    if len(window) < window_steps:
        return []
    per_node: dict[str, list[float]] = {}
    for step in window:
        slowest: dict[str, float] = {}
        for s in by_step[step].values():
            slowest[s.node] = max(slowest.get(s.node, 0.0), s.compute_s)
        for node, seconds in slowest.items():
            per_node.setdefault(node, []).append(seconds)
    pace = {node: statistics.median(values) for node, values in per_node.items()}
    if len(pace) < 2:
        return []
    out: list[NodePace] = []
    for node, own in sorted(pace.items()):
        peers = [p for other, p in pace.items() if other != node]
        peers_s = statistics.median(peers)
        if peers_s > 0:
            out.append(
                NodePace(
                    run_id, node, own / peers_s, own, peers_s, len(peers), window[0], window[-1]
                )
            )
    return out


def is_straggler(pace: NodePace, rule: StragglerRule) -> bool:
    """Whether ``pace`` is slow enough to report."""
    return pace.slowdown >= rule.slower_than


def due(last_report: float | None, now: float, report_every_s: float) -> bool:
    """Whether a straggler may be reported again (first report: at once)."""
    return last_report is None or now - last_report >= report_every_s
