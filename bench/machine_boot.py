"""A real machine of the local cluster, timed: power-on -> Node Ready -> production, and a
BMC reimage (XID 79) -> production again; memory of the VM; where the time goes.

Usage: .venv/bin/python bench/machine_boot.py [--memory 1536] [--no-reimage]

Starts a local cluster with one machine (``gpufleet.local.machines``, the node image
from the cache or ``$GPUFLEET_NODE_IMAGE``), a FleetPolicy whose XID 79 rule reimages,
and the lifecycle controller; presses the machine's power button through its BMC and
follows its serial console, timestamping each milestone as it appears (host clock,
seconds since the power button). Prints the load average at start and end: the
figures depend on it (software emulation on shared cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gpufleet.domain import well_known
from gpufleet.domain.policy import default_policy
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster

MACHINE = "vm-node-0000"
GV = f"/apis/{well_known.GROUP}/{well_known.VERSION}"
MILESTONES = (
    ("kernel started", "Linux version"),
    ("initrd /init", "Run /init as init process"),
    ("root image fetched", "rootfs.squashfs' saved"),
    ("systemd started", "Welcome to"),
    ("network online", "Reached target network-online.target"),
    ("cloud-init user-data", "running 'modules:config'"),
    ("kubeadm join started", "[preflight] Running pre-flight checks"),
    ("kubelet started", "[kubelet-start] Starting the kubelet"),
    ("TLS bootstrap done", "This node has joined the cluster"),
)


class Timeline:
    """Milestones from the console (first line containing each marker after ``start``)
    and from the apiserver, in seconds since the power button."""

    def __init__(self, console: Path, since_bytes: int, t0: float) -> None:
        self.console = console
        self.offset = since_bytes
        self.t0 = t0
        self.seen: dict[str, float] = {}

    def poll_console(self) -> None:
        if not self.console.exists():  # the BMC starts the machine in the background
            return
        text = self.console.read_bytes()[self.offset :].decode(errors="replace")
        now = time.monotonic() - self.t0
        for name, marker in MILESTONES:
            if name not in self.seen and marker in text:
                self.seen[name] = now

    def mark(self, name: str) -> None:
        self.seen.setdefault(name, time.monotonic() - self.t0)


def state(api: SyncKube) -> str | None:
    if not api.exists(f"/api/v1/nodes/{MACHINE}"):
        return None
    labels = api.get(f"/api/v1/nodes/{MACHINE}")["metadata"].get("labels") or {}
    value = labels.get(well_known.LABEL_STATE)
    return str(value) if value else None


def ready(api: SyncKube) -> bool:
    if not api.exists(f"/api/v1/nodes/{MACHINE}"):
        return False
    conditions = api.get(f"/api/v1/nodes/{MACHINE}")["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def follow(
    tl: Timeline, api: SyncKube, until: str, timeout: float, *, rejoin: bool = False
) -> None:
    """Poll the console and the Node until the Node is in state ``until``. With
    ``rejoin``, Ready and ``until`` count only after the machine has joined again (the
    console shows the new TLS bootstrap), and the state leaving ``until`` is marked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tl.poll_console()
        joined = not rejoin or "TLS bootstrap done" in tl.seen
        current = state(api)
        if rejoin and current != until and not any(k.startswith("taken out") for k in tl.seen):
            tl.mark(f"taken out (state {current})")
        if joined and "Node Ready" not in tl.seen and ready(api):
            tl.mark("Node Ready")
        if current and current != until and joined:
            tl.mark(f"state {current}")
        if joined and current == until and "Node Ready" in tl.seen:
            tl.mark(until)
            return
        time.sleep(0.5)
    raise SystemExit(f"{until} not reached in {timeout:.0f} s; console: {tl.console}")


def vm_rss_mib(info: ClusterInfo) -> float | None:
    """Resident memory of the machine's qemu process (MiB)."""
    for pid in processes.processes_using(info.run_dir):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("qemu-system"):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            continue
    return None


def put_policy(api: SyncKube) -> None:
    spec: dict[str, Any] = default_policy().model_dump(by_alias=True, mode="json")
    # A reimaged machine boots again before it can be verified (minutes under emulation).
    spec["checks"]["verificationTimeoutSeconds"] = 1800
    for entry in spec["ladder"]:
        entry["timeoutSeconds"] = 1800
    for rule in spec["rules"]:
        if rule["match"].get("xid") == 79:
            rule["action"] = "reimage"
    api.create(
        f"{GV}/fleetpolicies",
        {
            "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
            "kind": "FleetPolicy",
            "metadata": {"name": "bench"},
            "spec": spec,
        },
    )


def power_on(info: ClusterInfo) -> None:
    bmc = info.bmcs[MACHINE]
    r = httpx.post(
        f"{bmc.system_url}/Actions/ComputerSystem.Reset",
        json={"ResetType": "On"},
        auth=(bmc.user, bmc.password),
        timeout=10,
    )
    r.raise_for_status()


def report(title: str, tl: Timeline) -> None:
    print(title)
    previous = 0.0
    for name, at in sorted(tl.seen.items(), key=lambda kv: kv[1]):
        print(f"  {at:7.1f} s  (+{at - previous:5.1f})  {name}")
        previous = at


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--memory", type=int, default=1536, help="MiB per machine")
    parser.add_argument("--no-reimage", action="store_true")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    spec = ClusterSpec(
        nodes=1, slurm=False, machines=1, machine_memory_mib=args.memory, machine_power_on=False
    )
    with LocalCluster(spec) as info, tempfile.TemporaryDirectory() as tmp:
        api = SyncKube(info.apiserver_url, info.token, info.ca_file)
        put_policy(api)
        log = Path(tmp) / "controller.log"
        with log.open("wb") as out:
            controller = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpufleet.cli.main",
                    "controller",
                    "--kubeconfig",
                    str(info.kubeconfig),
                    "--policy-name",
                    "bench",
                    "--metrics-port",
                    "0",
                    "--tick",
                    "0.5",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            console = info.machines[MACHINE].console
            t0 = time.monotonic()
            power_on(info)
            tl = Timeline(console, 0, t0)
            follow(tl, api, "production", args.timeout)
            rss = vm_rss_mib(info)
            report("power-on (BMC On) ->", tl)
            print(f"  VM resident memory: {rss:.0f} MiB of {args.memory} MiB" if rss else "")
            if not args.no_reimage:
                size = console.stat().st_size
                t1 = time.monotonic()
                httpx.post(
                    f"{info.machines[MACHINE].inject_url}/inject",
                    json={"fault": "xid=79,gpu=3"},
                    timeout=10,
                ).raise_for_status()
                again = Timeline(console, size, t1)
                follow(again, api, "production", args.timeout, rejoin=True)
                report("XID 79 injected -> reimage through the BMC ->", again)
                rss = vm_rss_mib(info)
                print(f"  VM resident memory: {rss:.0f} MiB" if rss else "")
        finally:
            controller.terminate()
            controller.wait(10)
        print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
