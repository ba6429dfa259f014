"""Pod group created -> every pod bound, on an idle local cluster (decision 0257).

Starts a local cluster (real apiserver, KWOK nodes, real slurmctld and slurmds) with
``gpufleet pod-scheduler`` as ``gpufleet local up`` runs it (``ClusterSpec(pod_scheduler=
True)``: one process, ``--interval 2``), then, for each group size
(``--sizes``, default 1, 4 and 8) it creates ``--repeat`` groups one after another: an
explicit pod group (``gpufleet.io/pod-group``) of N pods of 8 GPUs each, so one Slurm job
of N nodes. Each is timed from just before the first pod's POST to the moment a watch on
the namespace shows the group's last pod bound; then its pods are deleted and the next
group waits until the scheduler has ended the job in Slurm (the cluster is idle again).

Prints p50, p99 and max per size, and the CPU seconds the scheduler and slurmctld used
per group (from ``/proc``: their whole run over the groups, passes at rest and the
bench's own ``squeue`` polls included). Before the first group: the slurmds' memory (RSS
and PSS summed) and the CPU at rest of the scheduler, slurmctld, the slurmds and the
apiserver. Asserts nothing (the behaviour is tested by tests/integration/test_pod_scheduler*.py).

With ``--burst G`` (one size in ``--sizes``) it creates G groups of that size at once
instead, their pods POSTed from ``--writers`` threads as fast as the apiserver takes them,
and nothing is deleted until the last group is bound: per group, created (its first pod's
POST) -> all bound (p50, p99, max); the time from the first POST to the last group bound;
the scheduler's and slurmctld's CPU seconds over that time; the scheduler's passes in it
(``gpufleet_pod_scheduler_passes_total``); and the Slurm jobs submitted (its ``submit``
actions, and the distinct jobs ``squeue`` lists with the scheduler's comment): exactly G,
one per group, or the bench says so and exits 1. G x size must fit the nodes with a slurmd.
Then it deletes the pods and times until Slurm lists none of the jobs pending or running.

With ``--slurmd-nodes K`` only the first K nodes run a slurmd (the others are in
slurm.conf only, never allocated): Kubernetes and Slurm still list every node, which is
what one pass reads; K must be at least the largest group.

    .venv/bin/python bench/pod_scheduling.py --nodes 100 --slurmd-nodes 16 --repeat 20
    .venv/bin/python bench/pod_scheduling.py --nodes 1000 --slurmd-nodes 1000 --burst 100 --sizes 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.domain import well_known
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, running
from procstat import process_cpu_seconds  # bench/, the script's directory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import pod_scheduler_support

NS = "bench-pod-scheduling"
SCHEDULER = well_known.POD_SCHEDULER_NAME


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def wait_until(what: str, check: Callable[[], Any], timeout: float, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def pod(name: str, group: str, size: int) -> dict[str, Any]:
    """A member of an explicit group of ``size``, asking for a whole node's GPUs."""
    return pod_scheduler_support.pod(
        name, NS, SCHEDULER, group=group, size=size, gpus="8", memory="1Gi"
    )


class BoundWatch:
    """A watch on the namespace's pods in a thread: when each pod was first seen bound."""

    def __init__(self, info: ClusterInfo, resource_version: str) -> None:
        self.bound: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stopping = False
        self.http = httpx.Client(
            base_url=info.apiserver_url,
            headers={"Authorization": f"Bearer {info.token}"},
            verify=str(info.ca_file),
            timeout=httpx.Timeout(10, read=None),
        )
        self.rv = resource_version
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            params = {"watch": "true", "resourceVersion": self.rv, "timeoutSeconds": "60"}
            try:
                with self.http.stream("GET", f"/api/v1/namespaces/{NS}/pods", params=params) as r:
                    for line in r.iter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        meta = obj.get("metadata") or {}
                        self.rv = meta.get("resourceVersion") or self.rv
                        if (obj.get("spec") or {}).get("nodeName"):
                            with self.lock:
                                self.bound.setdefault(meta["name"], time.monotonic())
            except httpx.HTTPError:
                if not self.stopping:
                    time.sleep(0.1)

    def when(self, names: list[str]) -> float | None:
        """When the last of ``names`` was first seen bound (None: not all yet)."""
        with self.lock:
            seen = [self.bound.get(n) for n in names]
        return None if None in seen else max(t for t in seen if t is not None)

    def stop(self) -> None:
        self.stopping = True
        self.http.close()


def slurm_jobs(info: ClusterInfo, states: str = "PENDING,RUNNING,CONFIGURING") -> dict[str, str]:
    """Job id -> comment of the scheduler's jobs Slurm lists in ``states`` (``all``: ended
    ones too, for MinJobAge)."""
    out = subprocess.run(
        ["squeue", "-h", f"--states={states}", "-o", "%i %k"],
        env=info.slurm_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    jobs = (ln.split(" ", 1) for ln in out.splitlines() if " " in ln)
    return {i: k for i, k in jobs if k.startswith(well_known.POD_JOB_COMMENT_PREFIX)}


def pid_of(info: ClusterInfo, name: str) -> int:
    pid = next((p.pid for p in info.processes if p.name == name), None)
    if pid is None:
        raise SystemExit(f"the local cluster runs no {name}")
    return pid


def scheduler_counters(info: ClusterInfo) -> dict[str, float]:
    """The scheduler's passes (``passes:done``, ``passes:skipped``) and actions
    (``actions:submit``...) so far, from its /metrics."""
    url = info.pod_scheduler_metrics_url
    if url is None:
        raise SystemExit("the local cluster runs no pod scheduler")
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            for metric, label in (("passes", "result"), ("actions", "action")):
                if sample.name == f"gpufleet_pod_scheduler_{metric}_total":
                    counters[f"{metric}:{sample.labels[label]}"] = sample.value
    return counters


class CpuMeter:
    """CPU seconds of the cluster's processes that do the work, from one moment on."""

    def __init__(self, info: ClusterInfo) -> None:
        self.pids = {
            "scheduler": [pid_of(info, "pod-scheduler")],
            "slurmctld": [pid_of(info, "slurmctld")],
            "slurmds": [p.pid for p in info.processes if p.name.startswith("slurmd ")],
            "kube-apiserver": [pid_of(info, "kube-apiserver")],
        }
        self.start = self.now()

    def now(self) -> dict[str, float]:
        return {k: sum(process_cpu_seconds(p) for p in ps) for k, ps in self.pids.items()}

    def used(self) -> dict[str, float]:
        end = self.now()
        return {k: end[k] - self.start[k] for k in end}


def memory_mib(pids: list[int]) -> tuple[float, float]:
    """RSS and PSS (shared pages divided among their sharers) of ``pids``, summed, in MiB."""
    rss = pss = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "Rss":
                rss += int(value.split()[0])
            elif key == "Pss":
                pss += int(value.split()[0])
    return rss / 1024, pss / 1024


def one_by_one(
    api: SyncKube, info: ClusterInfo, watch: BoundWatch, sizes: list[int], repeat: int
) -> None:
    """Groups one after another, each deleted (its job ended) before the next."""
    sched, ctld = pid_of(info, "pod-scheduler"), pid_of(info, "slurmctld")
    cpu0 = process_cpu_seconds(sched)
    ctld0 = process_cpu_seconds(ctld)
    wall0 = time.monotonic()
    groups = 0
    results: dict[int, list[float]] = {}
    for size in sizes:
        for i in range(repeat):
            group = f"g{size}-{i:03d}"
            names = [f"{group}-{k}" for k in range(size)]
            start = time.monotonic()
            for name in names:
                api.create(f"/api/v1/namespaces/{NS}/pods", pod(name, group, size))
            wait_until(f"group {group} bound", lambda n=names: watch.when(n), 120)  # type: ignore[misc]
            results.setdefault(size, []).append((watch.when(names) or 0.0) - start)
            groups += 1
            for name in names:
                api.delete(f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")
            wait_until("its Slurm job ended", lambda: not slurm_jobs(info), 60, 0.25)
        xs = results[size]
        print(
            f"group of {size}: created -> all bound p50 {statistics.median(xs):.2f} s, "
            f"p99 {pct(xs, 99):.2f} s, max {max(xs):.2f} s ({len(xs)} groups)",
            flush=True,
        )
    wall = time.monotonic() - wall0
    cpu = process_cpu_seconds(sched) - cpu0
    ctld_cpu = process_cpu_seconds(ctld) - ctld0
    print(
        f"{groups} groups in {wall:.1f} s: scheduler {1000 * cpu / groups:.0f} CPU-ms "
        f"per group ({cpu:.1f} s in all), slurmctld {1000 * ctld_cpu / groups:.0f} "
        f"CPU-ms per group",
        flush=True,
    )


def burst(
    api: SyncKube,
    info: ClusterInfo,
    watch: BoundWatch,
    groups: int,
    size: int,
    writers: int,
    timeout: float,
) -> bool:
    """``groups`` groups of ``size`` created at once; True when Slurm got one job each."""
    names = {
        f"b{size}-{g:03d}": [f"b{size}-{g:03d}-{k}" for k in range(size)] for g in range(groups)
    }

    def create(name: str, group: str) -> float:
        at = time.monotonic()
        api.create(f"/api/v1/namespaces/{NS}/pods", pod(name, group, size))
        return at

    counters0 = scheduler_counters(info)
    cpu = CpuMeter(info)
    with ThreadPoolExecutor(writers) as pool:
        posted = {
            group: [pool.submit(create, n, group) for n in members]
            for group, members in names.items()
        }
        created = {group: min(f.result() for f in fs) for group, fs in posted.items()}
    first = min(created.values())
    last_post = time.monotonic()
    print(f"{groups * size} pods POSTed in {last_post - first:.1f} s ({writers} writers)")
    every = [n for members in names.values() for n in members]
    wait_until(f"all {groups} groups bound", lambda: watch.when(every), timeout, 0.1)
    used = cpu.used()
    counters = scheduler_counters(info)
    bound = {group: watch.when(members) or 0.0 for group, members in names.items()}
    xs = [bound[g] - created[g] for g in names]
    last = max(bound.values()) - first
    print(
        f"{groups} groups of {size}: created -> all bound p50 {statistics.median(xs):.2f} s, "
        f"p99 {pct(xs, 99):.2f} s, max {max(xs):.2f} s; last group bound "
        f"{last:.2f} s after the first POST",
        flush=True,
    )
    print(
        "CPU seconds until then: "
        + ", ".join(f"{k} {v:.1f}" for k, v in used.items())
        + f" ({len(cpu.pids['slurmds'])} slurmds)"
    )

    def delta(key: str) -> int:
        return round(counters.get(key, 0.0) - counters0.get(key, 0.0))

    jobs = slurm_jobs(info, "all")
    submitted = delta("actions:submit")
    print(
        f"scheduler passes: {delta('passes:done')} done, {delta('passes:skipped')} skipped; "
        f"Slurm jobs: {submitted} submitted, {len(jobs)} in squeue "
        f"({len(set(jobs.values()))} distinct comments); binds {delta('actions:bind')}",
        flush=True,
    )
    deleted = time.monotonic()
    # One DELETE for them all: a thousand pods took the apiserver longer than 10 s.
    slow = SyncKube(info.apiserver_url, info.token, info.ca_file, timeout=300)
    try:
        slow.delete(f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    finally:
        slow.close()
    wait_until("every Slurm job ended", lambda: not slurm_jobs(info), 300, 0.5)
    print(f"pods deleted -> every Slurm job ended: {time.monotonic() - deleted:.1f} s")
    return submitted == groups and len(jobs) == groups


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100, help="KWOK nodes (and Slurm nodes)")
    ap.add_argument("--slurmd-nodes", type=int, default=16, help="nodes that run a slurmd")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8], help="group sizes")
    ap.add_argument("--repeat", type=int, default=20, help="groups of each size")
    ap.add_argument("--burst", type=int, metavar="G", help="G groups at once (one size)")
    ap.add_argument("--writers", type=int, default=8, help="threads POSTing a burst's pods")
    ap.add_argument("--burst-timeout", type=float, default=900, help="seconds for a burst")
    ap.add_argument("--idle-seconds", type=float, default=20.0, help="CPU at rest, measured")
    a = ap.parse_args(argv)
    if max(a.sizes) > a.slurmd_nodes:
        raise SystemExit("--slurmd-nodes must be at least the largest group")
    if a.burst is not None and len(a.sizes) != 1:
        raise SystemExit("--burst takes one group size (--sizes S)")
    if a.burst is not None and a.burst * a.sizes[0] > a.slurmd_nodes:
        raise SystemExit("a burst must fit the nodes with a slurmd (--burst x --sizes)")
    t0 = time.monotonic()
    spec = ClusterSpec(
        nodes=a.nodes,
        redfish=False,
        ready_timeout_s=900,
        slurmd_nodes=a.slurmd_nodes,
        pod_scheduler=True,
    )
    with running(spec, progress=lambda m: print(f"  [{time.monotonic() - t0:6.1f}s] {m}")) as info:
        print(
            f"cluster up in {time.monotonic() - t0:.1f} s ({a.nodes} nodes, "
            f"{a.slurmd_nodes} with a slurmd; Slurm {info.slurm_version})",
            flush=True,
        )
        api = SyncKube(info.apiserver_url, info.token, info.ca_file)
        api.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        slurmds = [p.pid for p in info.processes if p.name.startswith("slurmd ")]
        rss, pss = memory_mib(slurmds)
        print(
            f"{len(slurmds)} slurmds: RSS {rss:.0f} MiB in all, PSS {pss:.0f} MiB "
            f"({1024 * pss / max(1, len(slurmds)):.0f} KiB each); slurmctld RSS "
            f"{memory_mib([pid_of(info, 'slurmctld')])[0]:.0f} MiB",
            flush=True,
        )
        ok = True
        try:
            rest = CpuMeter(info)
            time.sleep(a.idle_seconds)
            idle = rest.used()
            print(
                "at rest, CPU-ms/s: "
                + ", ".join(f"{k} {1000 * v / a.idle_seconds:.1f}" for k, v in idle.items())
                + f" ({a.nodes} nodes)",
                flush=True,
            )
            rv = api.get(f"/api/v1/namespaces/{NS}/pods")["metadata"]["resourceVersion"]
            watch = BoundWatch(info, rv)
            if a.burst is None:
                one_by_one(api, info, watch, a.sizes, a.repeat)
            else:
                ok = burst(api, info, watch, a.burst, a.sizes[0], a.writers, a.burst_timeout)
            watch.stop()
            print(f"load average: {os.getloadavg()[0]:.1f}")
        finally:
            api.close()
    if not ok:
        raise SystemExit("the burst did not get exactly one Slurm job per group")


if __name__ == "__main__":
    main()
