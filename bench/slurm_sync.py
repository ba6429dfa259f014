"""Slurm syncer benchmarks on a local cluster (real apiserver, real slurmctld + slurmd).

Prints, never asserts:

* Kubernetes fault -> Slurm DRAIN latency (p50/p99/max): from just before the
  PATCH that raises a gpufleet problem condition on a Node, to the moment
  ``scontrol update state=DRAIN`` returned (the syncer's clock, same process);
* a full sync pass at N nodes (``/nodes`` + ``/jobs`` + every node reconciled):
  "keeps up" means a pass fits in the poll interval;
* the syncer at rest: its thread's CPU (and slurmrestd's and slurmctld's) over
  ``--idle-seconds`` with every node in production, and how many nodes its polls
  reconciled (a poll at rest reconciles only what changed: docs/slurm.md);
* a burst: ``--burst`` nodes (default 10%) faulted at once -> all drained;
* the syncer's CPU-milliseconds per fault (its thread's CPU from the first fault
  written to the last DRAIN, its polls meanwhile included, over the faults).

With ``--slurmd-nodes K`` only the first K nodes get a slurmd; the others are in
slurm.conf only (not responding, then down): a 12,500-node Slurm fleet on one machine.

    .venv/bin/python bench/slurm_sync.py --nodes 4 --faults 100
    .venv/bin/python bench/slurm_sync.py --nodes 500 --faults 50
    .venv/bin/python bench/slurm_sync.py --nodes 12500 --slurmd-nodes 100 --faults 20 --burst 32 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.domain import well_known
from gpufleet.kubeapi.resources import Patch
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, running
from gpufleet.slurm.background import SlurmEndpoints, SyncerThread
from gpufleet.slurm.syncer import Syncer, SyncSettings
from procstat import cpu_seconds, profile  # bench/, the script's directory


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def wait_until(what: str, check: Callable[[], Any], timeout: float, step: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def set_state(api: SyncKube, node: str, state: str) -> None:
    body = {"metadata": {"labels": {well_known.LABEL_STATE: state}}}
    api.patch(f"/api/v1/nodes/{node}", body, Patch.STRATEGIC)


def set_condition(api: SyncKube, node: str, status: str, reason: str) -> None:
    """A GpuProblem condition as the node agent writes it (merged by type)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cond = {
        "type": "GpuProblem",
        "status": status,
        "reason": reason,
        "message": "bench",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }
    api.patch(f"/api/v1/nodes/{node}/status", {"status": {"conditions": [cond]}}, Patch.STRATEGIC)


def sinfo_nodes(info: ClusterInfo) -> dict[str, dict[str, Any]]:
    """``sinfo --json`` node records by name: what slurmctld itself says."""
    out = subprocess.run(
        ["sinfo", "--json"], env=info.slurm_env(), capture_output=True, text=True, timeout=30
    )
    return {n["name"]: n for n in json.loads(out.stdout)["nodes"]} if out.returncode == 0 else {}


def daemon_pid(info: ClusterInfo, name: str) -> int | None:
    """The pid of the cluster's ``slurmrestd`` or ``slurmctld`` (None if not found)."""
    for pid in processes.processes_using(info.run_dir):
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
        if exe == name:
            return pid
    return None


def at_rest(rs: SyncerThread, info: ClusterInfo, seconds: float) -> None:
    """CPU of the syncer's thread, slurmrestd and slurmctld with nothing happening."""
    s = rs.syncer
    assert s is not None
    tid = rs._thread.native_id
    stats = {"syncer thread": f"/proc/self/task/{tid}/stat"}
    for name in ("slurmrestd", "slurmctld"):
        pid = daemon_pid(info, name)
        if pid is not None:
            stats[name] = f"/proc/{pid}/stat"
    before = {k: cpu_seconds(v) for k, v in stats.items()}
    passes0, reconciles0 = s.stats.passes, s.stats.reconciles
    t0 = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - t0
    used = {k: (cpu_seconds(v) - before[k]) / took * 100 for k, v in stats.items()}
    passes = s.stats.passes - passes0
    per_pass = (s.stats.reconciles - reconciles0) / max(passes, 1)
    print(
        f"at rest over {took:.0f} s: "
        + ", ".join(f"{k} {v:.1f}%" for k, v in used.items())
        + f" of a core; {passes} polls, {per_pass:.1f} nodes reconciled per poll"
    )


def wait_verb(s: Syncer, node: str, verb: str, before: int, timeout: float = 10) -> float:
    """When the syncer carried out ``verb`` on ``node`` (its clock), after index ``before``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t in s.stats.timings[before:]:
            if t.node == node and t.verb == verb:
                return t.acted
        time.sleep(0.005)
    raise AssertionError(f"no {verb} of {node} within {timeout} s")


def fault_to_drain(
    s: Syncer, kube: SyncKube, names: list[str], count: int, timeout: float = 10
) -> list[float]:
    """``count`` faults one at a time on ``names`` in turn, each healed (and resumed)
    before the next: the milliseconds from each fault's patch to its DRAIN."""
    lat: list[float] = []
    for i in range(count):
        node = names[i % len(names)]
        before = len(s.stats.timings)
        started = time.monotonic()
        set_condition(kube, node, "True", "Xid79")
        acted = wait_verb(s, node, "drain", before, timeout)
        lat.append((acted - started) * 1000)
        before = len(s.stats.timings)
        set_condition(kube, node, "False", "Healthy")
        wait_verb(s, node, "resume", before, timeout)
    return lat


def in_production(info: ClusterInfo) -> tuple[SyncKube, SlurmEndpoints]:
    """An apiserver client with every node of the cluster in production, and the
    cluster's Slurm endpoints (for a :class:`SyncerThread`)."""
    assert info.slurmrestd_url and info.slurm_jwt and info.slurm_conf
    kube = SyncKube(info.apiserver_url, info.token, info.ca_file)
    for n in info.node_names:
        set_state(kube, n, "production")
    endpoints = SlurmEndpoints(
        info.kubeconfig, info.slurmrestd_url, info.slurm_jwt, info.slurm_conf
    )
    return kube, endpoints


def burst_drain(
    s: Syncer, kube: SyncKube, info: ClusterInfo, burst: list[str], syncer_stat: str
) -> None:
    """Fault every node of ``burst`` at once (one writer, as fast as the apiserver takes
    the patches), print when all were drained, each node's fault -> DRAIN and the
    syncer's CPU per fault (``syncer_stat``: its thread's stat file), then heal them and
    wait until Slurm resumed them all."""
    first = len(s.stats.timings)
    cpu0 = cpu_seconds(syncer_stat)
    start = time.monotonic()
    patched_at: dict[str, float] = {}
    for n in burst:
        patched_at[n] = time.monotonic()
        set_condition(kube, n, "True", "Xid79")
    patched = time.monotonic() - start
    wait_until(
        "burst drained",
        lambda: all((v := (s.slurm or {}).get(n)) is not None and v.ours for n in burst),
        120,
        step=0.05,
    )
    took = time.monotonic() - start
    cpu_ms = (cpu_seconds(syncer_stat) - cpu0) * 1000 / len(burst)
    confirmed = sinfo_nodes(info)
    ok = sum(1 for n in burst if "DRAIN" in (confirmed[n].get("state_flags") or []))
    print(
        f"burst: {len(burst)} nodes faulted (patches took {patched:.2f} s) -> all drained "
        f"{took:.2f} s after the first patch; sinfo confirms {ok}/{len(burst)};"
        f" syncer {cpu_ms:.1f} CPU-ms per fault"
    )
    per_node = [
        (t.acted - patched_at[t.node]) * 1000
        for t in s.stats.timings[first:]
        if t.verb == "drain" and t.node in patched_at
    ]
    if per_node:
        print(
            f"  burst of {len(burst)}, fault -> DRAIN per node (from its own patch): "
            f"p50 {pct(per_node, 50):.0f} ms, p99 {pct(per_node, 99):.0f} ms, "
            f"max {max(per_node):.0f} ms"
        )
    for n in burst:
        set_condition(kube, n, "False", "Healthy")
    wait_until(
        "burst resumed",
        lambda: not any((v := (s.slurm or {}).get(n)) is not None and v.drained for n in burst),
        120,
        0.1,
    )


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with ``argv`` (default: the command line); bench/reaction.py's
    ``--slurm-bursts`` calls it after the controller's rounds."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--faults", type=int, default=100)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--slurmd-nodes", type=int, default=None, help="nodes with a slurmd")
    ap.add_argument(
        "--burst",
        type=int,
        nargs="+",
        default=[0],
        help="nodes in each burst, one burst after another (0: 10%% of the slurmd nodes)",
    )
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=90.0, help="wait before measuring at rest")
    ap.add_argument(
        "--profile-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="after the at-rest figure, sample the syncer's thread with py-spy for SECONDS"
        " and print where it spends",
    )
    ap.add_argument(
        "--full-pass-s",
        type=float,
        default=SyncSettings.full_pass_s,
        help="reconcile every node this often (0: after every poll, the syncer's old way)",
    )
    ap.add_argument(
        "--max-poll-share",
        type=float,
        default=SyncSettings.max_poll_share,
        help="share of the time a poll may take (1: poll back to back, the old way)",
    )
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    spec = ClusterSpec(
        nodes=a.nodes, redfish=False, ready_timeout_s=900, slurmd_nodes=a.slurmd_nodes
    )
    with running(spec, progress=lambda m: print(f"  [{time.monotonic() - t0:6.1f}s] {m}")) as info:
        print(f"cluster up in {time.monotonic() - t0:.1f} s ({a.nodes} nodes)")
        kube, endpoints = in_production(info)
        settings = SyncSettings(
            poll_interval_s=a.poll,
            hold_taint=False,
            full_pass_s=a.full_pass_s,
            max_poll_share=a.max_poll_share,
        )
        rs = SyncerThread(endpoints, settings)
        rs.start(timeout=300)
        s, rest, scontrol = rs.syncer, rs.rest, rs.scontrol
        assert s is not None and rest is not None and scontrol is not None

        # 1. full pass timing
        async def one_pass() -> float:
            start = time.monotonic()
            await s.poll_slurm(full=True)  # every node and job read, not only what changed
            await asyncio.gather(*(s.reconcile(n) for n in list(s.nodes) if s.managed(n)))
            return time.monotonic() - start

        passes = [rs.call(one_pass()) for _ in range(5)]
        print(
            f"full sync pass at {a.nodes} nodes: median {statistics.median(passes) * 1000:.0f} ms,"
            f" max {max(passes) * 1000:.0f} ms (poll interval {a.poll * 1000:.0f} ms)"
        )
        # 1a. at rest: the nodes without slurmd go down first (SlurmdTimeout), and the
        # syncer's first reports of them are written; then nothing happens.
        time.sleep(a.settle)
        at_rest(rs, info, a.idle_seconds)
        if a.profile_idle:
            out = Path(tempfile.gettempdir()) / f"slurm-sync-idle-{a.nodes}.txt"
            syncer_thread = rs._thread.native_id
            profile(os.getpid(), a.profile_idle, out, what="syncer at rest", thread=syncer_thread)

        # 1b. what one fault's path costs at least: the fresh read and the scontrol
        # call, measured on the syncer's own event loop while its poll runs.
        async def floors() -> tuple[list[float], list[float], list[float]]:
            one, every, sc = [], [], []
            for n in info.node_names[:20]:
                t = time.monotonic()
                await rest.node(n)
                one.append(time.monotonic() - t)
            for _ in range(5):
                t = time.monotonic()
                await rest.nodes()
                every.append(time.monotonic() - t)
            for n in info.node_names[:10]:
                t = time.monotonic()
                await scontrol.run("show", "node", n)
                sc.append(time.monotonic() - t)
            return one, every, sc

        one, every, sc = rs.call(floors())
        for label, xs in (
            ("GET /node/{name}", one),
            ("GET /nodes", every),
            ("scontrol show node", sc),
        ):
            print(
                f"  floor: {label:20s} p50 {statistics.median(xs) * 1000:5.0f} ms, "
                f"max {max(xs) * 1000:5.0f} ms ({len(xs)} one at a time)"
            )

        # 2. fault -> DRAIN latency, one node at a time
        # Only nodes with a slurmd can be drained and resumed (the others are unknown to
        # Slurm's scheduler: the syncer leaves them alone, failing closed).
        names = info.node_names[: a.slurmd_nodes or len(info.node_names)]
        syncer_stat = f"/proc/self/task/{rs._thread.native_id}/stat"
        cpu0 = cpu_seconds(syncer_stat)
        ms = fault_to_drain(s, kube, names, a.faults)
        cpu_ms = (cpu_seconds(syncer_stat) - cpu0) * 1000 / max(a.faults, 1)
        print(
            f"fault -> DRAIN over {len(ms)} faults: p50 {pct(ms, 50):.0f} ms, "
            f"p99 {pct(ms, 99):.0f} ms, max {max(ms):.0f} ms; syncer {cpu_ms:.1f} CPU-ms"
            " per fault (its DRAIN and the RESUME after it, polls meanwhile included)"
        )

        # 3. bursts, one after another (each resumed before the next)
        for size in a.burst:
            burst_drain(s, kube, info, names[: size or max(1, len(names) // 10)], syncer_stat)
        print(
            f"syncer stats: drains {s.stats.drains}, resumes {s.stats.resumes}, "
            f"slurm errors {s.stats.slurm_errors}"
        )
        rs.stop()
        kube.close()


if __name__ == "__main__":
    with processes.terminate_on_signals():  # a killed bench still stops its cluster
        main()
