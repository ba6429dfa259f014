"""Provisioning bench: 100 machines booting at once, and power-on -> Node in burn-in.

Starts a local cluster (no Slurm), the provisioning service (its own process,
``gpufleet provision serve``, as deployed; ``--service thread`` runs it in a
thread of the bench's process instead) and the lifecycle controller, imports
``--machines`` Machines, then

0. measures the load generator itself: ``--machines`` concurrent requests to
   ``/healthz`` (no apiserver work) from the bench's minimal client and from one
   ``httpx.AsyncClient`` -- the floor of what each client can see;
1. boots all of them at once (iPXE, meta-data, user-data with a fresh token
   each) and prints p50/p99/max per endpoint, measured by the clients
   (``--client raw``: one connection per request, as machines make them;
   ``--client httpx``: one shared ``httpx.AsyncClient``, as this bench did first);
2. for ``--join`` of them, times a simulated power-on to the Node labelled
   ``burn-in``: boot requests, then the Node registers with the labels from
   the user-data (as the kubelet does), KWOK makes it Ready, the agent's
   hardware condition is written, and the controller checks the inventory.

    .venv/bin/python bench/provision.py --machines 100 --join 20
    .venv/bin/python bench/provision.py --machines 100 --join 20 --client httpx --service thread
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from gpufleet.domain import enrollment, inventory, node_reports, well_known
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


class Answer:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code = status_code
        self.text = text

    def raise_for_status(self) -> None:
        if self.status_code != 200:
            raise RuntimeError(f"HTTP {self.status_code}: {self.text[:200]}")


async def raw_get(url: str, path: str, headers: dict[str, str] | None = None) -> Answer:
    """One HTTP/1.1 GET on its own connection, as a booting machine's firmware or
    cloud-init makes it. A few lines of asyncio: httpx's pool, shared by a hundred
    concurrent requests, costs more CPU than the service's answers (see the
    ``/healthz`` figures the bench prints)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}Connection: close\r\n\r\n"
    writer.write(request.encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return Answer(int(head_bytes.split(b" ", 2)[1]), body.decode())


async def boot_one(
    http: httpx.AsyncClient | None, url: str, m: str, lat: dict[str, list[float]]
) -> str:
    for endpoint, path in (
        ("ipxe", f"/ipxe?mac={m}"),
        ("meta-data", f"/cloud-init/{m}/meta-data"),
        ("user-data", f"/cloud-init/{m}/user-data"),
    ):
        t = time.perf_counter()
        headers = {"X-Gpufleet-Enrollment": SECRET}
        if http is None:
            r: Answer | httpx.Response = await raw_get(url, path, headers)
        else:
            r = await http.get(path, headers=headers)
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
    await asyncio.sleep(2)  # the service's Machine index catches up with the import

    async def noop(http: httpx.AsyncClient | None) -> float:
        t = time.perf_counter()
        r = await raw_get(url, "/healthz") if http is None else await http.get("/healthz")
        r.raise_for_status()
        return time.perf_counter() - t

    async def noop_round(label: str, http: httpx.AsyncClient | None) -> None:
        t0 = time.perf_counter()
        xs = await asyncio.gather(*(noop(http) for _ in range(n)))
        wall = time.perf_counter() - t0
        print(
            f"{n} concurrent GET /healthz, {label}: all in {wall * 1000:.0f} ms;"
            f" p50 {statistics.median(xs) * 1000:.1f} ms   p99 {pct(xs, 99) * 1000:.1f} ms"
        )

    # The floor: what a request that costs the service no apiserver work looks like
    # from each client (the difference between the two is the client's own cost).
    await noop_round("raw asyncio client, a connection each", None)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        await noop_round("one httpx.AsyncClient (new connections)", http)
        await noop_round("one httpx.AsyncClient (kept-alive connections)", http)

    async with contextlib.AsyncExitStack() as stack:
        client = None
        if args.client == "httpx":
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=60, limits=limits)
            )
        t0 = time.perf_counter()
        await asyncio.gather(*(boot_one(client, url, mac(i), lat) for i in range(n)))
        wall = time.perf_counter() - t0
    print(f"{n} machines booting at once ({args.client} client): all served in {wall:.2f} s")
    for endpoint, xs in lat.items():
        print(
            f"  {endpoint:10s} p50 {statistics.median(xs) * 1000:6.1f} ms   "
            f"p99 {pct(xs, 99) * 1000:6.1f} ms   max {max(xs) * 1000:6.1f} ms"
        )

    # The apiserver's share: the writes a boot storm makes, without the service.
    # 2n status merge-patches (what the claims cost), 16 in flight as the service
    # sends them, from one kept-alive client.
    slots = asyncio.Semaphore(16)

    async def write(i: int) -> float:
        async with slots:
            t = time.perf_counter()
            r = await kube.patch(
                f"{GV}/machines/bench-{i % n:04d}/status",
                json={"status": {"message": f"bench write {i}"}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            r.raise_for_status()
            return time.perf_counter() - t

    one = [await write(i) for i in range(20)]
    print(
        f"apiserver alone: 20 Machine status writes one at a time: "
        f"p50 {statistics.median(one) * 1000:.1f} ms   max {max(one) * 1000:.1f} ms"
    )
    t0 = time.perf_counter()
    ws = await asyncio.gather(*(write(i) for i in range(2 * n)))
    wall = time.perf_counter() - t0
    print(
        f"apiserver alone: {2 * n} Machine status writes, 16 in flight: {wall:.2f} s "
        f"({2 * n / wall:.0f}/s); per write p50 {statistics.median(ws) * 1000:.1f} ms   "
        f"p99 {pct(ws, 99) * 1000:.1f} ms"
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
        hw = node_reports.hardware(inventory.Hardware("NVIDIA-H100-80GB-HBM3", 8, 8))
        await kube.patch(  # as the agent reports it: an annotation, through status
            f"/api/v1/nodes/{name}/status",
            json={"metadata": {"annotations": {hw.key: hw.value}}},
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


@contextmanager
def service_process(options: ServeOptions, run_dir: Path) -> Iterator[str]:
    """``gpufleet provision serve`` as a process (default rate limits: one source
    address may send 400 requests at once, more than the bench's 3 per machine)."""
    url = f"http://{options.host}:{options.port}"
    log = (run_dir / "provision.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufleet.cli.main",
            "provision",
            "serve",
            "--kubeconfig",
            str(options.kubeconfig),
            "--host",
            options.host,
            "--port",
            str(options.port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"provisioning service did not start; see {log.name}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--machines", type=int, default=100)
    parser.add_argument("--join", type=int, default=20)
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="boot requests from a minimal asyncio client (a connection each, like machines)"
        " or from one shared httpx.AsyncClient",
    )
    parser.add_argument(
        "--service",
        choices=("process", "thread"),
        default="process",
        help="run the service as its own process (as deployed) or in a thread of the bench",
    )
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
                "--lease-duration",
                "8",
                "--tick",
                "0.5",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            if args.service == "thread":
                with in_thread(options, settings) as url:
                    asyncio.run(main_async(args, info, url))
            else:
                with service_process(options, run_dir) as url:
                    asyncio.run(main_async(args, info, url))
        finally:
            ctl.terminate()
            ctl.wait(15)


if __name__ == "__main__":
    main()
