"""slurmrestd v0.0.40-v0.0.42 (Slurm 24.11) and v0.0.38 (22.05): one decoder, real answers.

The 24.11 samples were recorded from the real daemons with
``tests/fixtures/slurm/24.11/capture.sh`` (job 2 running on gpu-node-0000, which
is drained ``gpufleet: capture``; job 1 completed); the v0.0.38 ones from 22.05.8.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.slurm import restapi
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmUnavailable
from gpufleet.slurm.writes import SlurmWrites

from ..fakes import FakeSlurm

FIXTURES = Path(__file__).parents[2] / "fixtures" / "slurm"
V24 = FIXTURES / "24.11"
NEW = ("v0.0.40", "v0.0.41", "v0.0.42")


def sample(name: str) -> dict[str, Any]:
    return json.loads((V24 / name).read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", NEW)
def test_24_11_nodes_decode_base_state_flags_and_reason(version: str) -> None:
    nodes = {n["name"]: restapi.node_view(n) for n in sample(f"{version}_nodes.json")["nodes"]}
    drained, idle = nodes["gpu-node-0000"], nodes["gpu-node-0001"]
    assert drained.state == "mixed" and drained.flags == {"DRAIN"}
    assert drained.drained and drained.ours and drained.reason == "gpufleet: capture"
    assert idle.state == "idle" and not idle.flags and idle.reason is None and idle.known
    one = sample(f"{version}_node.json")["nodes"][0]
    assert restapi.node_view(one).drained


@pytest.mark.parametrize("version", NEW)
def test_24_11_jobs_decode_state_priority_and_nodes(version: str) -> None:
    jobs = {j["job_id"]: j for j in sample(f"{version}_jobs.json")["jobs"]}
    assert restapi.is_running(jobs[2]) and not restapi.is_running(jobs[1])
    view = restapi.job_view(jobs[2])
    assert view.nodes == {"gpu-node-0000"} and view.requeueable and view.priority == 1


def test_v0_0_41_allocation_layout_is_read_without_the_hostlist() -> None:
    job = next(j for j in sample("v0.0.42_jobs.json")["jobs"] if j["job_id"] == 2)
    job = {**job, "nodes": ""}
    assert restapi.job_nodes(job) == {"gpu-node-0000"}


def test_v0_0_38_still_decodes() -> None:
    node = json.loads((FIXTURES / "rest_v0.0.38_node.json").read_text())["nodes"][0]
    assert restapi.node_view(node).state == "allocated"
    job = json.loads((FIXTURES / "rest_v0.0.38_job.json").read_text())["jobs"][0]
    assert restapi.is_running(job) and restapi.job_view(job).requeueable


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (7, 7),
        ({"set": True, "infinite": False, "number": 7}, 7),
        ({"set": False, "infinite": False, "number": 0}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        (None, None),
        ("x", None),
    ],
)
def test_number_reads_plain_and_wrapped(value: Any, expected: int | None) -> None:
    assert restapi.number(value) == expected


def test_a_state_list_without_a_base_state_is_unknown() -> None:
    view = restapi.node_view({"state": ["DRAIN"], "reason": "x"})
    assert view.state == "unknown" and not view.known and view.drained


# -- negotiation and writes, against the recorded answers ----------------------------


class Recorded:
    """Answers requests the way the recorded 24.11 slurmrestd does; records writes."""

    def __init__(self, paths: dict[str, Any]) -> None:
        self.paths = paths
        self.writes: list[tuple[str, str, Any]] = []
        self.refuse: str | None = None
        self.pings: list[str] = []
        self.documents = 0
        """How many times /openapi was read."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/openapi":
            self.documents += 1
            return httpx.Response(200, json={"openapi": "3.0.3", "paths": self.paths})
        if request.method == "POST" or path.endswith("/reconfigure/"):
            body = json.loads(request.content) if request.content else None
            self.writes.append((request.method, path, body))
            if self.refuse:
                error = {"error": self.refuse, "description": "Failure to update node"}
                return httpx.Response(200, json={"errors": [error], "warnings": []})
            return httpx.Response(200, json={"errors": [], "warnings": []})
        if path.endswith(("/ping/", "/ping")):
            self.pings.append(path)
            if path in self.paths or path.rstrip("/") in self.paths:
                return httpx.Response(200, json={"errors": [], "pings": []})
        if path.endswith("/nodes/"):
            return httpx.Response(200, json=sample("v0.0.42_nodes.json"))
        return httpx.Response(404, json={"errors": [{"error": "not found"}]})


def client(server: Recorded) -> restapi.SlurmRest:
    rest = restapi.SlurmRest(restapi.RestConfig("http://slurm", "root", "t"))
    rest._client = httpx.AsyncClient(base_url="http://slurm", transport=httpx.MockTransport(server))
    return rest


def test_negotiates_the_newest_24_11_version_and_reads_nodes() -> None:
    server = Recorded(sample("openapi_paths.json")["paths"])

    async def main() -> tuple[str, dict[str, Any]]:
        rest = client(server)
        version = await rest.connect()
        return version, await rest.nodes()

    version, nodes = asyncio.run(main())
    assert version == "v0.0.42" and nodes["gpu-node-0000"].drained
    # One ping, not the 660 KB /openapi: a loaded slurmrestd answers it in time.
    assert server.pings == ["/slurm/v0.0.42/ping/"] and server.documents == 0


def test_a_22_05_server_gets_v0_0_38_and_no_rest_writes() -> None:
    paths = {f"/slurm/{v}/ping": {"get": {}} for v in ("v0.0.36", "v0.0.37", "v0.0.38")}
    server = Recorded(paths)
    scontrol = FakeSlurm(["gpu-node-0000", "gpu-node-0001"])

    async def main() -> str:
        rest = client(server)
        version = await rest.connect()
        writes = SlurmWrites(rest, scontrol)
        await writes.drain("gpu-node-0000", "gpufleet: x")
        await writes.undrain(["gpu-node-0000", "gpu-node-0001"])
        with pytest.raises(SlurmUnavailable):
            await rest.drain("gpu-node-0000", "gpufleet: x")
        return version

    assert asyncio.run(main()) == "v0.0.38"
    assert server.pings[-1] == "/slurm/v0.0.38/ping" and server.documents == 0
    assert server.writes == []
    assert scontrol.calls == [
        ("drain", "gpu-node-0000", "gpufleet: x"),
        ("undrain", "gpu-node-[0000-0001]"),
    ]


def test_unknown_versions_only_are_refused() -> None:
    server = Recorded({"/slurm/v0.0.39/ping": {"get": {}}, "/slurm/v0.0.43/ping/": {"get": {}}})

    async def main() -> None:
        with pytest.raises(SlurmUnavailable, match="serves"):
            await client(server).connect()

    asyncio.run(main())


def test_24_11_writes_go_through_the_api() -> None:
    server = Recorded(sample("openapi_paths.json")["paths"])
    scontrol = FakeSlurm(["gpu-node-0000", "gpu-node-0001"])

    async def main() -> None:
        rest = client(server)
        await rest.connect()
        writes = SlurmWrites(rest, scontrol)
        await writes.drain("gpu-node-0000", "gpufleet: xid79")
        await writes.drain(["gpu-node-0000", "gpu-node-0001"], "gpufleet: xid79")
        await writes.undrain("gpu-node-0001")
        await writes.reconfigure()
        await writes.requeue([5])

    asyncio.run(main())
    drain = {"state": ["DRAIN"], "reason": "gpufleet: xid79"}
    both = ["gpu-node-0000", "gpu-node-0001"]
    assert server.writes == [
        ("POST", "/slurm/v0.0.42/node/gpu-node-0000", drain),
        ("POST", "/slurm/v0.0.42/nodes/", {**drain, "name": both}),
        ("POST", "/slurm/v0.0.42/node/gpu-node-0001", {"state": ["UNDRAIN"]}),
        ("GET", "/slurm/v0.0.42/reconfigure/", None),
    ]
    assert scontrol.calls == [("requeue", "5")]


def test_a_refused_rest_write_is_a_command_failure() -> None:
    server = Recorded(sample("openapi_paths.json")["paths"])
    server.refuse = "Invalid node name specified"

    async def main() -> None:
        rest = client(server)
        await rest.connect()
        with pytest.raises(SlurmCommandFailed, match="Invalid node name"):
            await rest.drain("nosuch", "gpufleet: x")

    asyncio.run(main())


def test_a_refused_read_names_slurms_errors_not_its_meta_block() -> None:
    """slurmrestd puts a long ``meta`` block first: the error a person needs is after it."""
    meta = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}} | {
        f"padding{i}": "x" * 40 for i in range(10)
    }
    error = {"error": "Unable to query nodes", "error_number": 1007, "description": "busy"}

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"meta": meta, "errors": [error]})

    async def main() -> None:
        rest = restapi.SlurmRest(restapi.RestConfig("http://slurm", "root", "t"), version="v0.0.38")
        rest._client = httpx.AsyncClient(
            base_url="http://slurm", transport=httpx.MockTransport(refuse)
        )
        refused = r"HTTP 500 Unable to query nodes \(1007: busy\)"
        with pytest.raises(SlurmUnavailable, match=refused):
            await rest.nodes()

    asyncio.run(main())
