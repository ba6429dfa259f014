"""The live goodput ledger: read the job telemetry and the NodeRemediations, publish the ledger.

The ledger itself is pure (:mod:`gpufleet.domain.goodput`); this module does its I/O:
it reads the telemetry directory (the shared file system the node agents already read
for stragglers and fingerprints), lists the NodeRemediations, writes ``status.goodput``
on each closed one that cost a training something, and keeps the Prometheus gauges.
``gpufleet goodput --write-status --serve PORT`` runs it (decision 0277).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from gpufleet.domain import goodput, well_known
from gpufleet.domain.goodput import CATEGORIES, Incident, Ledger, Progress
from gpufleet.domain.stragglers import RANK_FILE, RUN_DIR
from gpufleet.kubeapi import ApiError, KubePort, custom

log = logging.getLogger(__name__)

DEFAULT_PORT = 29444
"""``gpufleet goodput --serve``'s /metrics port (agent 29440, controller 29441,
syncer 29442, provisioning 29443; decision 0099)."""

REMEDIATIONS = custom("noderemediations")


class TelemetryReader:
    """The step lines under a telemetry directory, each parsed once across passes.

    A rank's file only grows (one line per step), so each pass reads the bytes after
    what it read before, up to the last complete line (a half-written line waits for
    the next pass). A file that got shorter was replaced: it is read again from its
    start. The parse is most of a pass's cost (docs/goodput.md, "What a pass costs")."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[Path, tuple[int, list[Progress]]] = {}

    def progress(self) -> list[Progress]:
        """Every step line now under the directory."""
        seen: set[Path] = set()
        out: list[Progress] = []
        for path in self._rank_files():
            seen.add(path)
            out.extend(self._read(path))
        for gone in set(self._files) - seen:
            del self._files[gone]
        return out

    def _rank_files(self) -> Iterator[Path]:
        if not self.root.is_dir():
            return
        for run in sorted(self.root.iterdir()):
            if run.is_dir() and RUN_DIR.match(run.name):
                yield from (f for f in sorted(run.iterdir()) if RANK_FILE.match(f.name))

    def _read(self, path: Path) -> list[Progress]:
        offset, lines = self._files.get(path, (0, []))
        try:
            size = path.stat().st_size
            if size < offset:  # replaced by a shorter file: from its start
                offset, lines = 0, []
            if size > offset:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read(size - offset)
                end = chunk.rfind(b"\n") + 1
                for line in chunk[:end].decode(errors="replace").splitlines():
                    p = goodput.progress_of(line)
                    if p is not None:
                        lines.append(p)
                offset += end
        except OSError as exc:  # a file being rotated away: read at the next pass
            log.warning("telemetry %s not read: %s", path, exc)
        self._files[path] = (offset, lines)
        return lines


def documents_from_file(path: Path) -> list[Mapping[str, Any]]:
    """NodeRemediation objects from ``kubectl get nrem -o json`` (or yaml), or a list of them.

    Raises OSError (unreadable) or ValueError (not YAML, not a list or a List of objects)."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise ValueError(f"not valid YAML or JSON{where}: {problem}") from None
    if isinstance(data, Mapping):
        data = data.get("items", [data])
    if not isinstance(data, list):
        raise ValueError("not a list of NodeRemediations (kubectl get nrem -o json)")
    return [d for d in data if isinstance(d, Mapping)]


def ours(doc: Mapping[str, Any]) -> bool:
    """A NodeRemediation the lifecycle controller made (anyone may create one: a forged
    one is neither charged nor written to)."""
    labels = (doc.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(well_known.LABEL_MANAGED_BY) == well_known.CONTROLLER)


def incidents(docs: Sequence[Mapping[str, Any]]) -> list[Incident]:
    """The controller's NodeRemediations as the ledger's incidents."""
    return [i for d in docs if ours(d) and (i := goodput.incident_of(d)) is not None]


async def list_remediations(client: KubePort) -> list[Mapping[str, Any]]:
    return list((await client.list(REMEDIATIONS)).items)


async def write_status(client: KubePort, led: Ledger, docs: Sequence[Mapping[str, Any]]) -> int:
    """``status.goodput`` on each closed NodeRemediation whose value changed; the count written.

    A merge patch of ``status.goodput`` alone: the controller's own status fields stay
    as it wrote them (it patches the fields it owns and never this one)."""
    current = {
        str((d.get("metadata") or {}).get("name", "")): (d.get("status") or {}).get("goodput")
        for d in docs
    }
    written = 0
    for row in led.incidents:
        if not row.incident.closed:
            continue
        value = goodput.status_of(row)
        if current.get(row.incident.name) == value:
            continue
        try:
            await client.patch(
                REMEDIATIONS, row.incident.name, {"status": {"goodput": value}}, status=True
            )
            written += 1
        except ApiError as exc:
            log.warning(
                "NodeRemediation %s: status.goodput not written: %s", row.incident.name, exc
            )
    return written


class Metrics:
    """``gpufleet_goodput_*``: the fleet's ledger as gauges (recomputed at each pass)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.lost = Gauge(
            "gpufleet_goodput_lost_gpu_seconds",
            "GPU-seconds the trainings in the telemetry lost, by category (detection,"
            " isolation, recovery, redone, degraded); docs/goodput.md.",
            ["category"],
            registry=r,
        )
        self.productive = Gauge(
            "gpufleet_goodput_productive_gpu_seconds",
            "GPU-seconds of steps the trainings kept.",
            registry=r,
        )
        self.allocated = Gauge(
            "gpufleet_goodput_allocated_gpu_seconds",
            "GPU-seconds the trainings held (ranks x first step to last).",
            registry=r,
        )
        self.trainings = Gauge(
            "gpufleet_goodput_trainings", "Trainings in the telemetry directory.", registry=r
        )
        self.passes = Gauge(
            "gpufleet_goodput_last_pass_timestamp_seconds",
            "When the ledger was last computed (Unix time).",
            registry=r,
        )
        for c in CATEGORIES:
            self.lost.labels(category=c).set(0)

    def update(self, led: Ledger, now: float) -> None:
        for c, v in led.lost.items():
            self.lost.labels(category=c).set(v)
        self.productive.set(led.productive)
        self.allocated.set(led.allocated)
        self.trainings.set(len(led.trainings))
        self.passes.set(now)

    def serve(self, port: int, address: str) -> int:
        """Serve /metrics for the life of the process; the bound port (0 picks a free one)."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        bound: int = server.server_address[1]
        return bound


def compute(telemetry: Path | TelemetryReader, docs: Sequence[Mapping[str, Any]]) -> Ledger:
    """The ledger of everything in ``telemetry`` against the NodeRemediations ``docs``."""
    reader = telemetry if isinstance(telemetry, TelemetryReader) else TelemetryReader(telemetry)
    return goodput.ledger(reader.progress(), incidents(docs))


async def run(
    client: KubePort,
    telemetry: Path,
    *,
    every: float,
    metrics: Metrics | None,
    write: bool,
    passes: int | None = None,
) -> Ledger:
    """Compute, publish and write every ``every`` seconds (``passes``: stop after that many)."""
    import time

    done = 0
    reader = TelemetryReader(telemetry)
    while True:
        docs = await list_remediations(client)
        led = compute(reader, docs)
        if metrics is not None:
            metrics.update(led, time.time())
        if write:
            n = await write_status(client, led, docs)
            if n:
                log.info("status.goodput written on %d NodeRemediation(s)", n)
        done += 1
        if passes is not None and done >= passes:
            return led
        await asyncio.sleep(every)


def to_data(led: Ledger) -> dict[str, Any]:
    """The ledger as plain data (``-o json``)."""

    def hours(d: Mapping[str, float]) -> dict[str, float]:
        return {k: round(v, 3) for k, v in d.items()}

    return {
        "allocatedGpuSeconds": round(led.allocated, 3),
        "productiveGpuSeconds": round(led.productive, 3),
        "goodput": round(led.goodput, 6),
        "lostGpuSeconds": hours(led.lost),
        "trainings": [
            {
                "training": t.training,
                "ranks": t.ranks,
                "groups": t.groups,
                "start": t.start,
                "end": t.end,
                "stepSeconds": round(t.step_seconds, 6),
                "allocatedGpuSeconds": round(t.allocated, 3),
                "productiveGpuSeconds": round(t.productive, 3),
                "goodput": round(t.goodput, 6),
                "lostGpuSeconds": hours(t.lost),
                "byIncident": {k or "(none)": hours(v) for k, v in t.by_incident.items()},
            }
            for t in led.trainings
        ],
        "incidents": [
            {
                "name": r.incident.name,
                "node": r.incident.node,
                "fault": r.incident.fault,
                "reported": r.incident.reported,
                "out": r.incident.out,
                "back": r.incident.back,
                "trainings": list(r.trainings),
                "lostGpuSeconds": hours(r.lost),
            }
            for r in led.incidents
        ],
    }


def dump(led: Ledger) -> str:
    return json.dumps(to_data(led), indent=2)
