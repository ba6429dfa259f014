"""Provisioning bench: 100 machines booting at once, and power-on -> Node in burn-in.

Starts a local cluster (no Slurm), the provisioning service and the lifecycle
controller, imports ``--machines`` Machines, then

1. boots all of them at once (iPXE, meta-data, user-data with a fresh token
   each) and prints p50/p99/max per endpoint, measured by the clients;
2. for ``--join`` of them, times a simulated power-on to the Node labelled
   ``burn-in``: boot requests, then the Node registers with the labels from
   the user-data (as the kubelet does), KWOK makes it Ready, the agent's
   hardware condition is written, and the controller checks the inventory.

    .venv/bin/python bench/provision.py --machines 100 --join 20
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpufleet.domain import enrollment, inventory, well_known
from gpufleet.local import kube as local_kube
from gpufleet.local.cluster import ClusterSpec, running
from gpufleet.provision import machines
from gpufleet.provision.issuer import ServiceSettings
from gpufleet.provision.ratelimit import Limit
from gpufleet.provision.server import ServeOptions, in_thread

SECRET = "bench-secret"
GV = f"/apis/{well_known.GROUP}/{well_known.VERSION}"
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]  # nearest rank


def mac(i: int) -> str:
    return f"bb:00:00:00:{i // 256:02x}:{i % 256:02x}"


async def boot_one(http: httpx.AsyncClient, m: str, lat: dict[str, list[float]]) -> str:
    for endpoint, path in (
        ("ipxe", f"/ipxe?mac={m}"),
        ("meta-data", f"/cloud-init/{m}/meta-data"),
        ("user-data", f"/cloud-init/{m}/user-data"),
    ):
        t = time.perf_counter()
        r = await http.get(path, headers={"X-Gpufleet-Enrollment": SECRET})
        lat[endpoint].append(time.perf_counter() - t)
        r.raise_for_status()
    return r.text


def labels_of(user_data: str) -> dict[str, str]:
    doc = yaml.safe_load(user_data.removeprefix("#cloud-config\n"))
    join = yaml.safe_load(doc["write_files"][0]["content"])
    value = join["nodeRegistration"]["kubeletExtraArgs"][0]["value"]
    return dict(pair.split("=", 1) for pair in value.split(","))


async def main_async(args: argparse.Namespace, info: Any, url: str) -> None:
    ssl_ctx = __import__("ssl").create_default_context(cafile=str(info.ca_file))
    kube = httpx.AsyncClient(
        base_url=info.apiserver_url,
        verify=ssl_ctx,
        headers={"Authorization": f"Bearer {info.token}"},
        timeout=30,
    )
    for path in sorted((ROOT / "deploy" / "crds").glob("*.yaml")):
        r = await kube.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            json=yaml.safe_load(path.read_text()),
        )
        assert r.status_code in (201, 409), r.text
    await asyncio.sleep(2)  # CRDs established
    from gpufleet.domain.policy import default_policy

    policy = default_policy().model_dump(by_alias=True, mode="json")
    await kube.post(
        f"{GV}/fleetpolicies",
        json={
            "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
            "kind": "FleetPolicy",
            "metadata": {"name": "bench"},
            "spec": policy,
        },
    )
    n = args.machines
    for i in range(n):
        spec = machines.MachineSpec.model_validate(
            {
                "macs": [mac(i)],
                "serial": f"SN-{i}",
                "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": "x/y"},
                "pool": "bench",
                "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
                "enrollmentDigest": enrollment.digest(SECRET),
            }
        )
        r = await kube.post(f"{GV}/machines", json=machines.manifest(f"bench-{i:04d}", spec))
        assert r.status_code == 201, r.text

    lat: dict[str, list[float]] = {"ipxe": [], "meta-data": [], "user-data": []}
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(boot_one(http, mac(i), lat) for i in range(n)))
        wall = time.perf_counter() - t0
    print(f"{n} machines booting at once: all served in {wall:.2f} s")
    for endpoint, xs in lat.items():
        print(
            f"  {endpoint:10s} p50 {statistics.median(xs) * 1000:6.1f} ms   "
            f"p99 {pct(xs, 99) * 1000:6.1f} ms   max {max(xs) * 1000:6.1f} ms"
        )

    # Power-on -> burn-in, for machines not booted yet (re-arm the first `join`).
    for i in range(args.join):
        await kube.patch(
            f"{GV}/machines/bench-{i:04d}/status",
            json={"status": enrollment.rearm_status(by="bench", at=time.time(), reason="bench")},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    async def power_on(i: int) -> float:
        name = f"bench-{i:04d}"
        t = time.perf_counter()
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            await asyncio.sleep(0)
            r = await http.get(f"/ipxe?mac={mac(i)}")
            r.raise_for_status()
            r = await http.get(
                f"/cloud-init/{mac(i)}/user-data", headers={"X-Gpufleet-Enrollment": SECRET}
            )
            r.raise_for_status()
        body = local_kube.node_manifest(name, 300 + i, local_kube.NodeShape())
        body["metadata"]["labels"].update(labels_of(r.text))
        (await kube.post("/api/v1/nodes", json=body)).raise_for_status()
        while True:  # KWOK plays the kubelet: wait for Ready, then the agent reports
            node = (await kube.get(f"/api/v1/nodes/{name}")).json()
            conds = node.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                break
            await asyncio.sleep(0.05)
        cond = inventory.hardware_condition(inventory.Hardware("NVIDIA-H100-80GB-HBM3", 8, 8))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await kube.patch(
            f"/api/v1/nodes/{name}/status",
            json={
                "status": {
                    "conditions": [
                        {
                            "type": cond.type,
                            "status": cond.status,
                            "reason": cond.reason,
                            "message": cond.message,
                            "lastTransitionTime": now,
                            "lastHeartbeatTime": now,
                        }
                    ]
                }
            },
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        while True:
            node = (await kube.get(f"/api/v1/nodes/{name}")).json()
            if node["metadata"].get("labels", {}).get(well_known.LABEL_STATE) == "burn-in":
                return time.perf_counter() - t
            await asyncio.sleep(0.05)

    times = await asyncio.gather(*(power_on(i) for i in range(args.join)))
    print(
        f"power-on -> Node in burn-in ({args.join} machines at once): "
        f"p50 {statistics.median(times):.2f} s   max {max(times):.2f} s"
    )
    await kube.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--machines", type=int, default=100)
    parser.add_argument("--join", type=int, default=20)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-provision-", dir="/tmp"))
    with running(ClusterSpec(nodes=1, slurm=False, redfish=False, run_dir=run_dir)) as info:
        settings = ServiceSettings(per_client=Limit(rate=10_000, burst=10_000))
        options = ServeOptions(kubeconfig=info.kubeconfig, port=free_port())
        log = (run_dir / "controller.log").open("ab")
        ctl = subprocess.Popen(
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
                "--peering",
                "",
                "--tick",
                "0.5",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            with in_thread(options, settings) as url:
                asyncio.run(main_async(args, info, url))
        finally:
            ctl.terminate()
            ctl.wait(15)


if __name__ == "__main__":
    main()
