"""Reaction time of the lifecycle controller: problem condition written -> node cordoned.

Starts a local cluster with N KWOK nodes (8 GPUs each; no Slurm, no BMCs unless ``--bmc``),
installs the CRDs and a FleetPolicy whose safety rails do not interfere
(the point is reaction time, not the rails), starts ``gpufleet controller`` as
a child process, then writes an XID 79 problem condition on ``--samples``
distinct nodes at ``--rate`` per second, exactly as the node agent does. A
watch on Nodes timestamps the moment each one turns unschedulable.

With ``--burst`` the faults are written all at once instead (``--writers``
threads in parallel: a leaf switch or a rack PDU takes out 16-32 nodes in the
same second), and the time the burst took to write is printed with it.

The floor: before each round, the same number of nodes that the controller does not
manage (``nvidia.com/gpu.present=false``; it runs with ``--node-selector
nvidia.com/gpu.present=true``, as the chart does) get, written the same way, the
same fault report followed at once by a cordon from the bench itself, timed from
the report to the watch seeing the cordon: two writes and a watch delivery on the
same cluster under the same load, what any isolation needing a report and a cordon
takes at least. gpufleet's latency is also given as a ratio to it.

Per round: p50/p99/max latency, the floor's, the ratios; the controller's CPU (per
cent of one core while faults arrive, CPU-milliseconds per fault until cordoned and
until every faulted node rests) and its API requests and writes per fault (from its
``gpufleet_controller_api_requests_total``), the upper bounds of the p50/p99 buckets of
its own ``gpufleet_time_to_cordon_seconds`` (fault time to cordon written, as the
controller sees it), and what else ran on the machine meanwhile (load average, the
CPU of every process that is not the bench, its cluster or the controller). With
``--repeat N`` (default 3) every round runs N times on one cluster, each time on nodes
not faulted before, and every figure is the median of the N with its spread
(min-max). Once per fleet: the controller's CPU at rest and RSS, how long after its
start it acts on every node (a fault written on the last node, once it holds every
record, and its cordon), when every node carries its state label (adoption writes are
paced: decision 0124), and a restart. Run:

    .venv/bin/python bench/reaction.py --nodes 500
    .venv/bin/python bench/reaction.py --nodes 500 2000 5000 --samples 100 --repeat 1
    .venv/bin/python bench/reaction.py --nodes 2000 --rounds 32 100 --repeat 3
    .venv/bin/python bench/reaction.py --nodes 12500 --rounds 32 100 1000/60
    .venv/bin/python bench/reaction.py --nodes 12500 --rounds 32 100 1000/60 --slurm-bursts 32 100
    .venv/bin/python bench/reaction.py --nodes 300 --rounds 60/30 --repeat 1 --bmc
    .venv/bin/python bench/reaction.py --nodes 12500 --rounds 1000/60 --bmc --bmc-seed 1

``--rounds`` runs several rounds on one cluster, one after another, each on nodes not
faulted before (a burst of 32, of 100, then 1,000 spread over a minute). ``--slurm-bursts``
then measures the Slurm side at the same fleet size (bench/slurm_sync.py, on a cluster of
its own with Slurm: fault -> DRAIN one at a time and in bursts, the syncer at rest), so one
command drives every figure of docs/controller.md's and docs/slurm.md's 12,500-node tables.

A storm with BMCs (``--bmc``): without it a faulted node has no BMC, so every BMC rung of
its ladder (XID 79 starts at reboot, then power-cycle, reimage) fails at once and it rushes
to triage: the controller's work after the cordon is a few writes. With ``--bmc`` the bench
starts the repository's Redfish emulator (``python -m gpufleet.local.redfish``, a child
process, one endpoint per node on 127.0.0.1) serving one BMC for every node the rounds will
fault (their faults summed over ``--repeat``: 1,000/60 x 3 is 3,000 BMCs, 3,000 ports of
the 10,000 the local cluster picks from; not the floor's nodes, which the controller does
not manage), and gives each the way production does: a Secret ``gpufleet-system/bmc-<node>``
(``endpoint``, ``username``, ``password``; plain http, so no ``--bmc-ca-bundle``) and the
Node annotation ``gpufleet.io/bmc-secret``; the controller reads the Secrets with the
bench's admin kubeconfig. Each BMC draws its timings from ``--bmc-seed`` (printed; a random
one by default): a boot of 90-300 s (``--bmc-boot-seconds``; PowerState reads Off until
it is done, and a reset during a boot starts it over), an OS that takes 20-90 s to shut
down for a graceful reset (``--bmc-shutdown-seconds``); 15% answer every reset only after
2-8 s (past the controller's 4-second request timeout for the longer ones: an answer
lost), 5% refuse their first reset (503, not performed), 5% perform it and answer 500
(bench/bmc_storm.py). So
the rungs of early faults run, minutes long and each BMC at its own pace, while later
faults arrive, and the cordon latency is measured with that work going on. The controller
is given ``--graceful-settle 300`` (the production default; the test harness's 20 s is
for the emulator's 3-second OS). The ladder keeps the harness's 120 s per rung
(controller_harness.policy_spec), so that a node's ladder ends within minutes and a
round ends: a power cycle or reimage ends first at the controller's own wait for the
machine to power on (60 s, remediate.redfish.POWER_WAIT_S, not an option), a reboot
whose OS takes more than a minute to shut down at the rung's 120 s (the production
default of 1,200 s would turn those timeouts into the same power-on failure). What the
storm shows (run it to see): a boot of minutes, shown as PowerState Off, outlasts that
60-second wait, so with the default 90-300 s boots every BMC rung fails, each after a
minute or two and each BMC in its own time, and the node reaches triage about five
minutes after its fault; ``--bmc-boot-seconds 30 300`` lets the fastest boots pass. Per
round it adds: the Reset POSTs the emulator received while the faults were written, until
every faulted node rested and over the run (by HTTP status), the emulator's CPU
meanwhile ("BMC emulator CPU %") and at rest, and the BMC steps the controller finished
(by step and outcome, with their mean duration); at the end, every BMC step and act of
the run from the controller's /metrics and what the BMCs' own counters say. Each BMC's
server thread looks for a shutdown every 5 s, not 0.5 s: 3,000 idle BMCs cost 9% of a
core at 0.5 s and 1.2% at 5 s (measured on the 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # controller_harness imports waiting

import bmc_storm  # noqa: E402 (bench/)
from gpufleet.domain import conditions, well_known  # noqa: E402
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem  # noqa: E402
from gpufleet.local import processes  # noqa: E402
from gpufleet.local.cluster import ClusterSpec, LocalCluster  # noqa: E402
from integration.controller_harness import (  # noqa: E402
    Api,
    ControllerProcess,
    install,
    policy_spec,
    put_policy,
    wait_for,
)
from procstat import Machine, describe, process_cpu_seconds, profile  # noqa: E402 (bench/)

WRITES = ("POST", "PATCH", "PUT", "DELETE")
MANAGED = ("nvidia.com/gpu.present", "true")
"""The label the controller is told to manage (the chart's default selector); the floor's
nodes carry it ``false``, so the controller decides nothing about them."""
RESTING = ("triage", "rma", "production", "maintenance")
"""States a faulted node rests in once its ladder is walked (without ``--bmc`` every BMC
step fails at once and the node ends in triage; with it, its rungs take minutes)."""


def api_requests(metrics: str, verbs: tuple[str, ...] | None = None) -> dict[str, float]:
    """The controller's requests so far (``verbs`` only, when given), by ``VERB resource``,
    from its ``gpufleet_controller_api_requests_total``."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if not line.startswith("gpufleet_controller_api_requests_total{"):
            continue
        labels = line.split("{", 1)[1].split("}", 1)[0].replace('"', "")
        parts = dict(p.split("=", 1) for p in labels.split(","))
        verb = parts.get("verb", "")
        if verbs is None or verb in verbs:
            out[f"{verb} {parts.get('resource', '')}"] = float(line.rsplit(" ", 1)[1])
    return out


def api_writes(metrics: str) -> dict[str, float]:
    """The controller's writes so far, by ``VERB resource``."""
    return api_requests(metrics, WRITES)


def labelled(api: Api, selector: str = well_known.LABEL_STATE) -> int:
    """Nodes matching ``selector`` (default: any lifecycle state), counted from paged
    metadata-only lists: cheap enough to ask every second of a 12,500-node fleet."""
    count, token = 0, ""
    while True:
        r = api.http.get(
            "/api/v1/nodes",
            params={"labelSelector": selector, "limit": 5000, "continue": token},
            headers={"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"},
        )
        r.raise_for_status()
        body = r.json()
        count += len(body.get("items") or [])
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return count


def per_fault(before: dict[str, float], after: dict[str, float], faults: int) -> dict[str, float]:
    keys = set(before) | set(after)
    diff = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / faults for k in keys}
    return {k: v for k, v in sorted(diff.items()) if v > 0}


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def histogram_counts(text: str, name: str) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts by upper bound."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def histogram_quantiles(
    text: str, name: str, since: dict[float, float] | None = None
) -> tuple[float, float]:
    """p50 and p99 upper bounds from a Prometheus histogram's cumulative buckets (of the
    observations after ``since``, the counts read earlier, when given)."""
    before = since or {}
    buckets = sorted(
        (le, n - before.get(le, 0.0)) for le, n in histogram_counts(text, name).items()
    )
    if not buckets or buckets[-1][1] == 0:
        return (float("nan"), float("nan"))
    total = buckets[-1][1]
    p50 = next(le for le, n in buckets if n >= 0.5 * total)
    p99 = next(le for le, n in buckets if n >= 0.99 * total)
    return (p50, p99)


def permissive_policy() -> dict[str, Any]:
    spec = policy_spec()
    spec["safety"] = {
        "budget": {"maxNodes": 100000, "maxPercent": 100, "minNodes": 1},
        "breaker": {
            "maxNodes": 100000,
            "maxPercent": 100,
            "minNodes": 100000,
            "windowSeconds": 600,
            "cooldownSeconds": 0,
        },
        "rateLimit": {"maxActions": 100000, "windowSeconds": 600},
    }
    return spec


class CordonWatch(threading.Thread):
    """Timestamps the first time each Node is seen unschedulable; for the floor's nodes
    (``floor_names``), the first time in the current floor round (``floor_seen``)."""

    def __init__(self, info: Any) -> None:
        super().__init__(daemon=True)
        self.info = info
        self.seen: dict[str, float] = {}
        self.unschedulable: dict[str, bool] = {}
        """Each Node's ``spec.unschedulable`` as last seen."""
        self.floor_names: set[str] = set()
        self.floor_seen: dict[str, float] = {}
        self.events = 0
        """Node watch events received (what any Node watcher, the controller too, receives)."""
        self.stop = False

    def run(self) -> None:
        try:
            self._watch()
        except httpx.HTTPError:
            if not self.stop:  # the cluster stopping under a stopped watch is expected
                raise

    def _watch(self) -> None:
        with httpx.Client(
            base_url=self.info.apiserver_url,
            verify=str(self.info.ca_file),
            headers={"Authorization": f"Bearer {self.info.token}"},
            timeout=None,
        ) as http:
            rv = http.get("/api/v1/nodes?limit=1").json()["metadata"]["resourceVersion"]
            while not self.stop:
                with http.stream(
                    "GET", f"/api/v1/nodes?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
                ) as resp:
                    for line in resp.iter_lines():
                        now = time.time()
                        if not line:
                            continue
                        ev = json.loads(line)
                        obj = ev["object"]
                        if ev["type"] != "BOOKMARK":
                            self.events += 1
                        rv = obj["metadata"].get("resourceVersion", rv)
                        name = obj["metadata"].get("name")
                        if name and ev["type"] != "BOOKMARK":
                            self.note(name, bool(obj.get("spec", {}).get("unschedulable")), now)
                        if self.stop:
                            return

    def note(self, name: str, unschedulable: bool, now: float) -> None:
        self.unschedulable[name] = unschedulable
        if not unschedulable:
            return
        self.seen.setdefault(name, now)
        if name in self.floor_names:
            self.floor_seen.setdefault(name, now)


def settle(watch: CordonWatch, n: int, timeout: float = 1800.0) -> None:
    """Wait until the cluster's own start-up writes to Nodes have died down: at most the
    heartbeat rate (KWOK renews a Node's status every 600 to 1,210 s) plus 1 event/s."""
    limit = n / 600 + 1
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        e0 = watch.events
        time.sleep(5)
        rate = (watch.events - e0) / 5
        if rate <= limit:
            print(
                f"[{n} nodes] Node events settled at {rate:.1f}/s after"
                f" {time.monotonic() - t0:.0f} s",
                flush=True,
            )
            return
    print(f"[{n} nodes] Node events still above {limit:.1f}/s after {timeout:.0f} s", flush=True)


def measure_idle(pid: int, watch: CordonWatch, seconds: float) -> tuple[float, float]:
    """The controller's CPU at rest, in windows of 5 s (printed: the first windows show
    what is still being digested); returns the last 10 s and the Node events per second."""
    windows: list[float] = []
    e0, t_start = watch.events, time.monotonic()
    left = seconds
    while left > 0:
        step = min(5.0, left)
        c0, t0 = process_cpu_seconds(pid), time.monotonic()
        time.sleep(step)
        windows.append((process_cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100)
        left -= step
    rate = (watch.events - e0) / (time.monotonic() - t_start)
    print("  CPU at rest per 5 s window: " + " ".join(f"{w:.1f}%" for w in windows), flush=True)
    tail = windows[-2:] if len(windows) >= 2 else windows
    return statistics.mean(tail), rate


class Round:
    """How one round of faults comes: ``count`` faults on distinct nodes, written all at
    once (a burst) or evenly over ``seconds``. Spelled ``32`` (a burst of 32) or
    ``1000/60`` (1,000 over a minute) on the command line."""

    def __init__(self, count: int, seconds: float | None = None) -> None:
        if count < 1 or (seconds is not None and seconds <= 0):
            raise ValueError("a round needs at least one fault and a positive duration")
        self.count, self.seconds = count, seconds

    @classmethod
    def parse(cls, text: str) -> Round:
        try:
            count, _, over = text.partition("/")
            return cls(int(count), float(over) if over else None)
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"{text!r}: a round is N (a burst of N) or N/SECONDS (N spread over SECONDS)"
            ) from e

    @property
    def burst(self) -> bool:
        return self.seconds is None

    @property
    def how(self) -> str:
        if self.burst:
            return f"burst of {self.count}"
        return f"{self.count} over {self.seconds:g} s"


def write_faults(
    api: Api,
    names: list[str],
    round_: Round,
    writers: int,
    then: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Write one XID 79 condition per node as ``round_`` says (a burst: ``writers`` in
    parallel), each followed at once by ``then(node)`` when given; returns when each
    condition was written (wall clock)."""
    written: dict[str, float] = {}

    def one(i: int, name: str) -> None:
        at = time.time()
        fault = FaultEvent(FaultKind.XID, name, at=at, xid=79, evidence=Evidence(gpu_index=i % 8))
        written[name] = time.time()
        api.set_condition(name, conditions.problem(Subsystem.PCIE, [fault]))
        if then is not None:
            then(name)

    if round_.seconds is None:
        chunks = [list(enumerate(names))[k::writers] for k in range(writers)]

        def write_chunk(chunk: list[tuple[int, str]]) -> None:
            for i, name in chunk:
                one(i, name)

        threads = [threading.Thread(target=write_chunk, args=(c,)) for c in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return written
    rate = len(names) / round_.seconds
    w0 = time.monotonic()
    for i, name in enumerate(names):
        one(i, name)
        pause = (i + 1) / rate - (time.monotonic() - w0)
        if pause > 0:
            time.sleep(pause)
    return written


def quantiles(
    seen: dict[str, float], written: dict[str, float], names: list[str]
) -> dict[str, float]:
    """p50, p99 and max of written -> seen over ``names``, in milliseconds."""
    lat = sorted((seen[x] - written[x]) * 1000 for x in names)
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))],
        "max_ms": lat[-1],
    }


def set_unschedulable(api: Api, name: str, value: bool) -> None:
    """A plain cordon (or uncordon), as ``kubectl cordon`` writes it."""
    api.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": value}})


def measure_floor(
    api: Api, watch: CordonWatch, names: list[str], round_: Round, writers: int, n: int
) -> dict[str, float]:
    """The floor of ``round_`` on ``names`` (nodes the controller does not manage): each
    gets the fault report and, at once from the same writer, a cordon; timed from the
    report to the watch seeing the cordon. The nodes are uncordoned afterwards, outside
    the measurement, for the next round."""
    watch.floor_seen.clear()
    watch.floor_names = set(names)
    written = write_faults(api, names, round_, writers, lambda x: set_unschedulable(api, x, True))
    wait_for("every floor cordon seen", lambda: all(x in watch.floor_seen for x in names), 900)
    floor = {f"floor_{k}": v for k, v in quantiles(watch.floor_seen, written, names).items()}
    watch.floor_names = set()
    for x in names:
        set_unschedulable(api, x, False)
    wait_for(
        "the floor's nodes schedulable again",
        lambda: not any(watch.unschedulable.get(x) for x in names),
        timeout=300,
    )
    print(
        f"[{n} nodes, {round_.how}] floor (report + cordon + watch) p50"
        f" {floor['floor_p50_ms']:.0f} ms, p99 {floor['floor_p99_ms']:.0f} ms,"
        f" max {floor['floor_max_ms']:.0f} ms",
        flush=True,
    )
    return floor


def measure_round(
    api: Api, ctl: ControllerProcess, watch: CordonWatch, names: list[str], round_: Round,
    writers: int, n: int, managed: int, profile_s: float = 0.0,
    bmcs: bmc_storm.Emulator | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One round on ``names`` (not faulted before): latency to cordon, the controller's CPU
    meanwhile and per fault, its own histogram's buckets, its API requests and writes per
    fault until cordoned and until every one of the ``managed`` nodes rests, and what else
    ran on the machine. With ``profile_s``, py-spy samples the controller for that long
    from just before the first fault is written. With ``bmcs`` (``--bmc``): the Reset POSTs
    the emulator received while the faults were written, until every node rests and
    over the run so far, its CPU, and the BMC steps the controller finished meanwhile."""
    assert ctl.proc is not None
    pid = ctl.proc.pid
    sampler = None
    if profile_s:
        out = Path(tempfile.gettempdir()) / f"reaction-round-{n}-{round_.count}.txt"
        sampler = threading.Thread(
            target=profile,
            args=(pid, profile_s, out),
            kwargs={"what": f"controller, {round_.how}", "rate": 250},
        )
        sampler.start()
        time.sleep(1.0)  # py-spy attached
    metrics = ctl.metrics()
    own0 = histogram_counts(metrics, "gpufleet_time_to_cordon_seconds")
    requests0 = api_requests(metrics)
    steps0 = bmc_storm.controller_steps(metrics)
    posts0 = bmcs.posts() if bmcs is not None else None
    machine = Machine()
    c0, w0 = process_cpu_seconds(pid), time.monotonic()
    e0 = bmcs.cpu_seconds() if bmcs is not None else 0.0
    written = write_faults(api, names, round_, writers)
    posts_written = bmcs.posts() if bmcs is not None else None
    spread = max(written.values()) - min(written.values())
    wait_for("every cordon", lambda: all(x in watch.seen for x in names), timeout=900)
    cpu_cordon = process_cpu_seconds(pid) - c0
    busy_cpu = cpu_cordon / (time.monotonic() - w0) * 100
    if sampler is not None:
        sampler.join()
    metrics = ctl.metrics()
    own = histogram_quantiles(metrics, "gpufleet_time_to_cordon_seconds", since=own0)
    to_cordon = per_fault(requests0, api_requests(metrics), len(names))
    cordoned = quantiles(watch.seen, written, names)
    print(
        f"[{n} nodes, {round_.how}] every fault cordoned: p50 {cordoned['p50_ms']:.0f} ms,"
        f" p99 {cordoned['p99_ms']:.0f} ms, max {cordoned['max_ms']:.0f} ms (now waiting for"
        " every faulted node to rest)",
        flush=True,
    )

    def resting() -> bool:
        return labelled(api, f"{well_known.LABEL_STATE} in ({','.join(RESTING)})") >= managed

    # With BMCs, a ladder of three rungs of minutes each (and a boot that outlasts one).
    wait_for("every faulted node at rest", resting, timeout=3600 if bmcs else 900, step=1.0)
    time.sleep(5)  # the last status and Event writes of the last decisions
    cpu_rest = process_cpu_seconds(pid) - c0
    metrics = ctl.metrics()
    to_rest = per_fault(requests0, api_requests(metrics), len(names))
    ran = machine.done()
    bmc_row: dict[str, float] = {}
    if bmcs is not None and posts0 is not None and posts_written is not None:
        took = time.monotonic() - w0
        bmc_cpu = (bmcs.cpu_seconds() - e0) / took * 100
        posts_rest = bmcs.posts()
        in_window, how_window = bmc_storm.count_posts(posts0, posts_written)
        to_rest_n, how_rest = bmc_storm.count_posts(posts0, posts_rest)
        run_n = sum(posts_rest.values())
        bmc_row = {
            "bmc_posts_window": in_window,
            "bmc_posts_rest": to_rest_n,
            "bmc_posts_run": run_n,
            "bmc_cpu_pct": bmc_cpu,
            "rest_s": took,
        }
        print(
            f"[{n} nodes, {round_.how}] BMC Reset POSTs received while the faults were"
            f" written ({spread:.1f} s): {in_window} ({how_window}); until every faulted node"
            f" rested ({took:.0f} s after the first fault): {to_rest_n} ({how_rest}); over the"
            f" run: {run_n}. BMC emulator CPU {bmc_cpu:.1f}% of a core meanwhile. Steps the"
            " controller finished meanwhile: "
            + bmc_storm.step_delta(steps0, bmc_storm.controller_steps(metrics)),
            flush=True,
        )
    for title, table in (("until cordoned", to_cordon), ("until at rest", to_rest)):
        print(
            f"[{n} nodes, {round_.how}] API requests per fault {title}:"
            f" {sum(table.values()):.1f}, writes {writes(table):.1f} ("
            + ", ".join(f"{k} {v:.2f}" for k, v in table.items())
            + ")",
            flush=True,
        )
    row = {
        "how": round_.how,
        "faults": len(names),
        **cordoned,
        "cpu_busy_pct": busy_cpu,
        "cpu_ms_cordon": cpu_cordon * 1000 / len(names),
        "cpu_ms_rest": cpu_rest * 1000 / len(names),
        "own_p50_ms": own[0] * 1000,
        "own_p99_ms": own[1] * 1000,
        "spread_ms": spread * 1000,
        "requests_cordon": sum(to_cordon.values()),
        "requests_rest": sum(to_rest.values()),
        "writes_cordon": writes(to_cordon),
        "writes_rest": writes(to_rest),
        "load": ran["load"][1],
        "others_pct": ran["others_pct"],
        **bmc_row,
    }
    print(
        f"[{n} nodes, {round_.how}] cordoned p50 {row['p50_ms']:.0f} ms, p99"
        f" {row['p99_ms']:.0f} ms, max {row['max_ms']:.0f} ms; controller"
        f" {busy_cpu:.0f}% of a core meanwhile, {row['cpu_ms_cordon']:.1f} CPU-ms per fault"
        f" until cordoned, {row['cpu_ms_rest']:.1f} until at rest; machine: {describe(ran)}",
        flush=True,
    )
    return row


def writes(table: dict[str, float]) -> float:
    """The writes among requests by ``VERB resource``."""
    return sum(v for k, v in table.items() if k.split(" ", 1)[0] in WRITES)


def controller(info: Any, logs: Path, bmc: bool = False) -> ControllerProcess:
    """The controller the bench measures, managing only the nodes labelled
    :data:`MANAGED` (not the floor's). With ``bmc``, a GracefulRestart is given the
    production default of 300 s to show (``--graceful-settle``; the test harness gives
    the emulator's 3-second OS 20 s, less than the minute the storm's OSes take)."""
    settle = ("--graceful-settle", "300") if bmc else ()
    return ControllerProcess(
        info, logs, policy="bench", extra_args=("--node-selector", "=".join(MANAGED), *settle)
    )


def run_one(
    n: int,
    rounds: list[Round],
    keep: bool,
    profile_s: float = 0.0,
    idle_s: float = 20.0,
    writers: int = 16,
    profile_rounds: float = 0.0,
    repeat: int = 1,
    bmc: bmc_storm.Timings | None = None,
) -> list[dict[str, Any]]:
    # The cluster's own BMCs would serve every node; with --bmc the bench serves only
    # the nodes it will fault (bench/bmc_storm.py).
    spec = ClusterSpec(nodes=n, slurm=False, redfish=False, ready_timeout_s=1200)
    print(f"[{n} nodes] starting the local cluster ...", flush=True)
    t0 = time.monotonic()
    cluster = LocalCluster(spec)
    with cluster as info:
        print(f"[{n} nodes] cluster ready in {time.monotonic() - t0:.0f} s", flush=True)
        api = Api(info)
        install(api)
        put_policy(api, "bench", permissive_policy())
        floor_nodes = info.node_names[-max(r.count for r in rounds) :]
        managed = info.node_names[: -len(floor_nodes)]
        for x in floor_nodes:
            api.patch(f"/api/v1/nodes/{x}", {"metadata": {"labels": {MANAGED[0]: "false"}}})
        logs = info.run_dir / "logs"
        bmcs = None
        if bmc is not None:
            faulted = managed[: sum(r.count for r in rounds) * repeat]
            t1 = time.monotonic()
            bmcs = bmc_storm.Emulator.start(cluster, info.run_dir, faulted, bmc)
            bmcs.give_secrets(api)
            print(
                f"[{n} nodes] BMC emulator serving the {len(faulted)} nodes the rounds fault,"
                f" Secrets and annotations written in {time.monotonic() - t1:.0f} s:"
                f" {bmcs.describe()}; {bmc.describe()}; log {bmcs.log}",
                flush=True,
            )
        started = time.monotonic()
        ctl = controller(info, logs, bmc=bmcs is not None).start()
        try:
            assert ctl.proc is not None
            pid = ctl.proc.pid
            acting_s, probe_ms, adopted_s = adopt(ctl, api, managed, started)
            print(
                f"[{n} nodes] every record held and acted on {acting_s:.1f} s after start"
                f" (a fault on the last node cordoned {probe_ms:.0f} ms after it was written);"
                f" every node labelled {adopted_s:.1f} s after start",
                flush=True,
            )
            watch = CordonWatch(info)
            watch.start()
            settle(watch, n)
            b0, bt0 = (bmcs.cpu_seconds() if bmcs else 0.0), time.monotonic()
            idle_cpu, idle_events = measure_idle(pid, watch, idle_s)
            bmc_idle = (bmcs.cpu_seconds() - b0) / (time.monotonic() - bt0) * 100 if bmcs else 0.0
            print(
                f"[{n} nodes] at rest: {idle_cpu:.1f}% of a core over the last"
                f" {min(idle_s, 10):g} s; {idle_events:.1f} Node events/s"
                + (f"; BMC emulator {bmc_idle:.1f}% over {idle_s:g} s" if bmcs else ""),
                flush=True,
            )
            if profile_s:
                out = Path(tempfile.gettempdir()) / f"reaction-idle-{n}.txt"
                profile(pid, profile_s, out, what="controller at rest")
            # The adoption's probe (the last managed node) is faulted already: not a sample.
            rows, used = [], 0
            for run in range(repeat):
                for round_ in rounds:
                    print(f"[{n} nodes] run {run + 1} of {repeat}: {round_.how}", flush=True)
                    names = managed[used : used + round_.count]
                    used += round_.count
                    floor = measure_floor(
                        api, watch, floor_nodes[: round_.count], round_, writers, n
                    )
                    row = measure_round(
                        api, ctl, watch, names, round_, writers, n, len(managed),
                        profile_rounds, bmcs,
                    )  # fmt: skip
                    row["ratio_p50"] = row["p50_ms"] / floor["floor_p50_ms"]
                    row["ratio_p99"] = row["p99_ms"] / floor["floor_p99_ms"]
                    rows.append({**row, **floor})
            watch.stop = True
            rss, rss_peak = rss_mib(pid), rss_mib(pid, "VmHWM")
            if bmcs is not None:
                bmc_summary(ctl, bmcs, n)
            restart_s, reads = restart(ctl, info, logs, len(managed), bmc=bmcs is not None)
            print(
                f"[{n} nodes] a restarted controller held every record {restart_s:.1f} s after"
                f" start; requests it sent meanwhile: "
                + ", ".join(f"{k} {v:.0f}" for k, v in sorted(reads.items())),
                flush=True,
            )
            fleet = {
                "nodes": n,
                "gpus": n * info.gpus_per_node,
                "cpu_idle_pct": idle_cpu,
                "rss_mib": rss,
                "rss_peak_mib": rss_peak,
                "adopted_s": adopted_s,
                "acting_s": acting_s,
                "restart_s": restart_s,
                **({"bmc_idle_pct": bmc_idle} if bmcs else {}),
            }
            return [{**fleet, **row} for row in rows]
        finally:
            ctl.stop()
            if bmcs is not None:
                bmcs.close()
            if keep:
                kept = Path(tempfile.gettempdir()) / f"reaction-controller-{n}.log"
                shutil.copyfile(ctl.log, kept)
                print(f"controller log: {kept}")


def metric_or_none(read: Callable[[], float | None]) -> float | None:
    """A figure read from a controller's /metrics, or None while it does not answer yet."""
    try:
        return read()
    except httpx.HTTPError:
        return None


def adopt(
    ctl: ControllerProcess, api: Api, names: list[str], started: float
) -> tuple[float, float, float]:
    """A first adoption, measured from the controller's start: when it holds every node's
    record, when a fault then written on the last node is cordoned (it acts on every
    node), and when every node carries its state label (the adoption writes, paced:
    decision 0124). Polls the controller's /metrics, not the apiserver, so the bench
    adds no 12,500-node lists while it watches."""
    n = len(names)
    wait_for(
        "every record held",
        lambda: (metric_or_none(ctl.records_held) or 0) >= n,
        timeout=900,
        step=0.5,
    )
    probe = names[-1]
    written = write_faults(api, [probe], Round(1), writers=1)[probe]
    wait_for(
        f"{probe} cordoned",
        lambda: api.get(f"/api/v1/nodes/{probe}")["spec"].get("unschedulable") is True,
        timeout=900,
        step=0.1,
    )
    probe_ms = (time.time() - written) * 1000  # write_faults reads the wall clock
    cordoned = time.monotonic()
    wait_for(
        "every adoption written",
        lambda: metric_or_none(lambda: ctl.metric("gpufleet_controller_adoption_pending ")) == 0,
        timeout=3600,
        step=2.0,
    )
    wait_for("every node labelled", lambda: labelled(api) >= n, timeout=600, step=2.0)
    return cordoned - started, probe_ms, time.monotonic() - started


def bmc_summary(ctl: ControllerProcess, bmcs: bmc_storm.Emulator, n: int) -> None:
    """Over the whole run: the BMC steps the controller finished (count, mean duration)
    and its BMC acts by result, from its /metrics; what the BMCs say they received and
    did, from each one's counters."""
    metrics = ctl.metrics()
    steps = bmc_storm.controller_steps(metrics)
    acts = bmc_storm.controller_bmc_actions(metrics)
    counters = bmcs.counters()
    print(
        f"[{n} nodes] over the run, steps the controller finished: "
        + (", ".join(f"{k} x{c:.0f} (mean {t / c:.0f} s)" for k, (c, t) in steps.items()) or "none")
        + "; its BMC acts: "
        + (", ".join(f"{k} x{v:.0f}" for k, v in acts.items()) or "none")
        + "; the BMCs' counters: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counters.items())),
        flush=True,
    )


def restart(
    ctl: ControllerProcess, info: Any, logs: Path, n: int, bmc: bool = False
) -> tuple[float, dict[str, float]]:
    """Stop the controller, start another: how long until it holds every node's record
    (Nodes already labelled: a restart, not a first adoption), and the requests it sent
    meanwhile by ``VERB resource`` (a thundering herd shows here)."""
    ctl.stop()
    started = time.monotonic()
    fresh = controller(info, logs, bmc=bmc).start()
    try:
        wait_for(
            "every record held again",
            lambda: (metric_or_none(fresh.records_held) or 0) >= n,
            timeout=600,
            step=0.5,
        )
        took = time.monotonic() - started
        return took, api_requests(fresh.metrics())
    finally:
        fresh.stop()


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of each (fleet, round) as one entry: every figure the median of the runs,
    with its spread (min, max) under ``spread``."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["nodes"], r["how"]), []).append(r)
    out = []
    for runs in groups.values():
        entry: dict[str, Any] = {"repeat": len(runs), "spread": {}}
        for key, value in runs[0].items():
            if isinstance(value, (int, float)) and key not in ("nodes", "gpus", "faults"):
                values = [r[key] for r in runs]
                entry[key] = statistics.median(values)
                entry["spread"][key] = [min(values), max(values)]
            else:
                entry[key] = value
        out.append(entry)
    return out


def cell(entry: dict[str, Any], key: str, digits: int = 0) -> str:
    """``median (min-max)``, or the median alone for one run."""
    lo, hi = entry["spread"][key]
    text = f"{entry[key]:.{digits}f}"
    return text if entry["repeat"] == 1 else f"{text} ({lo:.{digits}f}-{hi:.{digits}f})"


def table(
    title: str, entries: list[dict[str, Any]], columns: list[tuple[str, str, int]], how: bool = True
) -> None:
    """One table of ``columns`` (heading, key, decimals) after each entry's fleet (and
    round, with ``how``)."""
    cells = [[cell(e, key, digits) for _, key, digits in columns] for e in entries]
    widths = [
        max(len(head), *(len(row[i]) for row in cells)) for i, (head, _, _) in enumerate(columns)
    ]
    print(f"\n{title}")
    print(
        f"{'nodes':>6} " + (f"{'how':>16} " if how else "")
        + " ".join(f"{head:>{w}}" for (head, _, _), w in zip(columns, widths, strict=True))
    )  # fmt: skip
    for e, row in zip(entries, cells, strict=True):
        print(
            f"{e['nodes']:>6} " + (f"{e['how']:>16} " if how else "")
            + " ".join(f"{c:>{w}}" for c, w in zip(row, widths, strict=True))
        )  # fmt: skip


LATENCY = [
    ("p50 ms", "p50_ms", 0), ("p99 ms", "p99_ms", 0), ("max ms", "max_ms", 0),
    ("floor p50", "floor_p50_ms", 0), ("floor p99", "floor_p99_ms", 0),
    ("x p50", "ratio_p50", 1), ("x p99", "ratio_p99", 1),
    ("own p50<=", "own_p50_ms", 0), ("own p99<=", "own_p99_ms", 0), ("write ms", "spread_ms", 0),
]  # fmt: skip
COST = [
    ("CPU busy %", "cpu_busy_pct", 0), ("CPU ms/f cordon", "cpu_ms_cordon", 1),
    ("CPU ms/f rest", "cpu_ms_rest", 1), ("req/f cordon", "requests_cordon", 1),
    ("w/f cordon", "writes_cordon", 1), ("req/f rest", "requests_rest", 1),
    ("w/f rest", "writes_rest", 1), ("load", "load", 1), ("others %", "others_pct", 0),
]  # fmt: skip
FLEET = [
    ("CPU idle %", "cpu_idle_pct", 1), ("RSS MiB", "rss_mib", 0), ("peak MiB", "rss_peak_mib", 0),
    ("acting s", "acting_s", 1), ("adopt s", "adopted_s", 1), ("restart s", "restart_s", 1),
]  # fmt: skip
BMC = [
    ("resets in window", "bmc_posts_window", 0), ("resets to rest", "bmc_posts_rest", 0),
    ("resets in run", "bmc_posts_run", 0), ("rest s", "rest_s", 0),
    ("BMC emulator CPU %", "bmc_cpu_pct", 1),
]  # fmt: skip
"""With ``--bmc``: the Reset POSTs the emulator received while the round's faults were
written, until every faulted node rested and over the run so far; seconds from the first
fault to the last node at rest; the emulator's CPU meanwhile."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[500])
    parser.add_argument("--samples", type=int, default=100, help="faults written (distinct nodes)")
    parser.add_argument("--rate", type=float, default=2.0, help="faults written per second")
    parser.add_argument(
        "--burst",
        action="store_true",
        help="write all --samples faults at once (--writers in parallel) instead of at --rate",
    )
    parser.add_argument(
        "--rounds",
        type=Round.parse,
        nargs="+",
        metavar="N[/SECONDS]",
        help="rounds of faults one after another on one cluster, each on nodes not faulted"
        " before: N is a burst of N, N/SECONDS N faults spread over SECONDS"
        " (replaces --samples, --rate and --burst)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="run every round this many times on the cluster (each time on nodes not faulted"
        " before, its floor measured just before it); figures are the median with min-max",
    )
    parser.add_argument("--writers", type=int, default=16, help="parallel writers of a burst")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=20.0,
        help="how long the controller's CPU at rest is measured (the figure: the last 10 s)",
    )
    parser.add_argument(
        "--profile-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sample the controller at rest with py-spy for SECONDS and print where it spends",
    )
    parser.add_argument(
        "--profile-rounds",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sample the controller with py-spy for SECONDS from the start of each round"
        " (250 samples/s) and print where it spends",
    )
    parser.add_argument(
        "--slurm-bursts",
        type=int,
        nargs="+",
        metavar="N",
        help="then the Slurm side on a fleet of the largest --nodes: bench/slurm_sync.py"
        " (fault -> Slurm DRAIN one at a time and in bursts of N, the syncer at rest) on a"
        " cluster of its own with --slurmd-nodes slurmd daemons",
    )
    parser.add_argument(
        "--bmc",
        action="store_true",
        help="serve a Redfish BMC (the repository's emulator) for every node the rounds"
        " fault, with realistic timings drawn per BMC from --bmc-seed: the ladder's BMC"
        " rungs then take minutes while later faults arrive (bench/bmc_storm.py)",
    )
    parser.add_argument(
        "--bmc-seed",
        type=int,
        default=None,
        help="seed of the BMCs' timings (default: a random one, printed)",
    )
    parser.add_argument(
        "--bmc-boot-seconds",
        type=float,
        nargs=2,
        default=[90.0, 300.0],
        metavar=("MIN", "MAX"),
        help="with --bmc: a boot takes between MIN and MAX s (PowerState Off meanwhile)",
    )
    parser.add_argument(
        "--bmc-shutdown-seconds",
        type=float,
        nargs=2,
        default=[20.0, 90.0],
        metavar=("MIN", "MAX"),
        help="with --bmc: a graceful reset waits between MIN and MAX s for the OS",
    )
    parser.add_argument(
        "--slurmd-nodes",
        type=int,
        default=100,
        help="with --slurm-bursts: nodes with a slurmd (the rest are in slurm.conf only)",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat needs at least one run")
    if args.slurm_bursts and max(args.slurm_bursts) > args.slurmd_nodes:
        parser.error("a Slurm burst needs as many nodes with a slurmd (--slurmd-nodes)")
    bmc = None
    if args.bmc:
        seed = (
            args.bmc_seed if args.bmc_seed is not None else random.SystemRandom().randrange(10**6)
        )
        bmc = bmc_storm.Timings(
            seed=seed,
            boot_s=(args.bmc_boot_seconds[0], args.bmc_boot_seconds[1]),
            shutdown_s=(args.bmc_shutdown_seconds[0], args.bmc_shutdown_seconds[1]),
        )
        print(f"BMC timings: {bmc.describe()} (--bmc-seed {seed} repeats them)", flush=True)
    rows = []
    for n in args.nodes:
        if args.rounds:
            rounds = args.rounds
        elif args.burst:
            rounds = [Round(args.samples)]
        else:
            rounds = [Round(args.samples, args.samples / args.rate)]
        # Faulted nodes are never reused; the floor's nodes are, round after round; the
        # adoption's probe takes one more.
        needed = sum(r.count for r in rounds) * args.repeat + max(r.count for r in rounds) + 1
        if needed > n:
            parser.error(f"the rounds and their floor need {needed} nodes, more than {n}")
        rows += run_one(n, rounds, args.keep_logs, args.profile_idle, args.idle_seconds,
                        args.writers, args.profile_rounds, args.repeat, bmc)  # fmt: skip
    entries = summarise(rows)
    table("fault -> cordon (ms; x: gpufleet / floor)", entries, LATENCY)
    table("cost per fault (controller) and what else ran", entries, COST)
    fleets = {e["nodes"]: {**e, "repeat": 1} for e in entries}  # measured once per fleet
    fleet_columns = FLEET
    if bmc is not None:
        table("BMCs (--bmc): Reset POSTs received, the emulator's CPU", entries, BMC)
        fleet_columns = [*FLEET, ("BMC emulator CPU idle %", "bmc_idle_pct", 1)]
    table("per fleet (measured once)", list(fleets.values()), fleet_columns, how=False)
    print(
        f"\nmedian (min-max) of {args.repeat} run(s); bursts: {args.writers} writers; floor:"
        " the same faults on nodes the controller does not manage, each cordoned by the bench"
        " at once, report -> cordon seen; CPU in % of one core; CPU ms/f: the controller's"
        " CPU-milliseconds per fault until cordoned, until at rest; req/f, w/f: its API"
        " requests and writes per fault; write ms: first to last fault written; load: the"
        " 1-minute load average at the round's end; others %: every process outside the"
        " bench, its cluster and the controller; acting s: start -> a fault on the last node"
        f" cordoned; adopt s: -> every node labelled; machine: {os.cpu_count()} cores;"
        f" commit {commit()}"
        + (
            f"; BMCs: {bmc.describe()}; resets in window: Reset POSTs received while the"
            " round's faults were written; to rest: until every faulted node rested"
            if bmc is not None
            else ""
        )
    )
    print("json: " + json.dumps([as_json(e) for e in entries]))
    if args.slurm_bursts:
        import slurm_sync  # bench/, the script's directory

        print(f"\nThe Slurm side at {max(args.nodes)} nodes (bench/slurm_sync.py):", flush=True)
        slurm_sync.main(
            ["--nodes", str(max(args.nodes)), "--slurmd-nodes", str(args.slurmd_nodes),
             "--faults", "20", "--settle", "60", "--idle-seconds", "120",
             "--burst", *(str(b) for b in args.slurm_bursts)]
        )  # fmt: skip


JSON_KEYS = (
    "p50_ms", "p99_ms", "max_ms", "floor_p50_ms", "floor_p99_ms", "ratio_p50", "ratio_p99",
    "cpu_ms_cordon", "cpu_ms_rest", "requests_cordon", "requests_rest", "writes_cordon",
    "writes_rest",
)  # fmt: skip
"""The figures of a round that docs/data/reaction.json keeps (bench/plot_reaction.py)."""


def as_json(e: dict[str, Any]) -> dict[str, Any]:
    """A summarised round as docs/data/reaction.json holds it: medians, and their spread
    when repeated, rounded to what the measurement can tell."""

    def r(v: float) -> float:
        return round(v, 2) if abs(v) < 10 else round(v, 1) if abs(v) < 100 else round(v)

    out: dict[str, Any] = {k: e[k] for k in ("nodes", "faults", "how", "repeat")}
    out.update({k: r(e[k]) for k in JSON_KEYS})
    if e["repeat"] > 1:
        out["spread"] = {k: [r(v) for v in e["spread"][k]] for k in JSON_KEYS}
    return out


def commit() -> str:
    """The commit measured (``+`` when the tree had changes)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


if __name__ == "__main__":
    with processes.terminate_on_signals():  # a killed bench still stops its cluster
        main()
