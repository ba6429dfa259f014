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
bench's own ``squeue`` polls included), and the scheduler's CPU at rest before the first
group. Asserts nothing (the behaviour
is tested by tests/integration/test_pod_scheduler*.py).

With ``--slurmd-nodes K`` only the first K nodes run a slurmd (the others are in
slurm.conf only, never allocated): Kubernetes and Slurm still list every node, which is
what one pass reads; K must be at least the largest group.

    .venv/bin/python bench/pod_scheduling.py --nodes 100 --slurmd-nodes 16 --repeat 20
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
from pathlib import Path
from typing import Any

import httpx

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


def slurm_jobs(info: ClusterInfo) -> list[str]:
    """The scheduler's jobs Slurm has pending or running."""
    out = subprocess.run(
        ["squeue", "-h", "--states=PENDING,RUNNING,CONFIGURING", "-o", "%k"],
        env=info.slurm_env(),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return [ln for ln in out.splitlines() if ln.startswith(well_known.POD_JOB_COMMENT_PREFIX)]


def pid_of(info: ClusterInfo, name: str) -> int:
    pid = next((p.pid for p in info.processes if p.name == name), None)
    if pid is None:
        raise SystemExit(f"the local cluster runs no {name}")
    return pid


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100, help="KWOK nodes (and Slurm nodes)")
    ap.add_argument("--slurmd-nodes", type=int, default=16, help="nodes that run a slurmd")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8], help="group sizes")
    ap.add_argument("--repeat", type=int, default=20, help="groups of each size")
    ap.add_argument("--idle-seconds", type=float, default=20.0, help="CPU at rest, measured")
    a = ap.parse_args(argv)
    if max(a.sizes) > a.slurmd_nodes:
        raise SystemExit("--slurmd-nodes must be at least the largest group")
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
            f"{a.slurmd_nodes} with a slurmd)",
            flush=True,
        )
        api = SyncKube(info.apiserver_url, info.token, info.ca_file)
        api.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        sched, ctld = pid_of(info, "pod-scheduler"), pid_of(info, "slurmctld")
        try:
            rest = process_cpu_seconds(sched)
            time.sleep(a.idle_seconds)
            idle = process_cpu_seconds(sched) - rest
            print(
                f"scheduler at rest: {1000 * idle / a.idle_seconds:.1f} CPU-ms/s ({a.nodes} nodes)",
                flush=True,
            )
            rv = api.get(f"/api/v1/namespaces/{NS}/pods")["metadata"]["resourceVersion"]
            watch = BoundWatch(info, rv)
            cpu0 = process_cpu_seconds(sched)
            ctld0 = process_cpu_seconds(ctld)
            wall0 = time.monotonic()
            groups = 0
            results: dict[int, list[float]] = {}
            for size in a.sizes:
                for i in range(a.repeat):
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
            watch.stop()
            print(
                f"{groups} groups in {wall:.1f} s: scheduler {1000 * cpu / groups:.0f} CPU-ms "
                f"per group ({cpu:.1f} s in all), slurmctld {1000 * ctld_cpu / groups:.0f} "
                f"CPU-ms per group",
                flush=True,
            )
            print(f"load average: {os.getloadavg()[0]:.1f}")
        finally:
            api.close()


if __name__ == "__main__":
    main()
