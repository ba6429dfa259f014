"""A full read of Slurm is parsed off the syncer's event loop (decision 0221).

The syncer reads every node and job once a minute; at 12,500 nodes that answer is 21 MB
of JSON. Parsed on the loop, a fault arriving meanwhile waited for the whole parse. Here
the parse is held in the middle of the node list (a hook in the codec waits for the
drain) while a fault arrives: the fault's DRAIN must go out before the parse ends. Parsed
on the loop, the held parse would hold the loop too and nothing could be drained.

The answer is decoded element by element (:func:`restapi._loads_in_pieces`); that it
reads exactly what ``json.loads`` reads is checked on the recorded answers and by a
property over generated documents.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.domain import slurm_sync, well_known
from gpufleet.slurm import restapi
from gpufleet.slurm.errors import SlurmUnavailable
from gpufleet.slurm.syncer import Syncer, SyncSettings

from ..fakes import FakeSlurm
from .fakes import RecordingKube

FIXTURES = Path(__file__).parents[2] / "fixtures" / "slurm"
RECORDED = sorted((FIXTURES / "24.11").glob("v0.0.4*_*.json")) + sorted(
    FIXTURES.glob("rest_v0.0.38_*.json")
)
FLEET = 400
VICTIM = "gpu-node-0007"


def names() -> list[str]:
    return [f"gpu-node-{i:04d}" for i in range(FLEET)]


def nodes_answer() -> dict[str, Any]:
    """A 24.11 ``/nodes`` answer for the whole fleet, built from the recorded idle node."""
    recorded = json.loads((FIXTURES / "24.11" / "v0.0.42_nodes.json").read_text())
    idle = next(n for n in recorded["nodes"] if n["name"] == "gpu-node-0001")
    return {**recorded, "nodes": [{**idle, "name": name} for name in names()]}


def kube_node(name: str, problem: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "GpuProblem", "status": "True", "reason": problem}] if problem else []
    return {
        "metadata": {
            "name": name,
            "labels": {well_known.LABEL_STATE: "production"},
            "annotations": {},
        },
        "spec": {},
        "status": {"conditions": conditions},
    }


def test_a_fault_is_drained_while_a_full_read_is_still_being_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = nodes_answer()
    idle = body["nodes"][0]
    order: list[str] = []
    drained = threading.Event()
    parsed = 0
    loop: asyncio.AbstractEventLoop | None = None
    syncer: Syncer | None = None
    node_view = restapi.node_view

    def fault() -> None:
        """On the loop: the agent's condition arrives, as the Node watch delivers it."""
        assert syncer is not None
        syncer.nodes[VICTIM] = kube_node(VICTIM, "Xid79")
        syncer.spawn(syncer.reconcile(VICTIM))

    def held_in_the_middle(raw: Any) -> slurm_sync.SlurmView:
        """The codec, held halfway through the full read until the fault was drained."""
        nonlocal parsed
        parsed += 1
        if parsed == FLEET // 2:
            order.append("parse halfway")
            assert loop is not None
            loop.call_soon_threadsafe(fault)
            drained.wait(timeout=10)  # on the loop, this wait would stop the drain itself
            order.append("parse resumed")
        return node_view(raw)

    def slurmrestd(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/nodes/"):
            return httpx.Response(200, json=body)
        if path.endswith("/jobs/"):
            return httpx.Response(200, json={"jobs": [], "errors": []})
        if path.endswith(f"/node/{VICTIM}"):  # the fresh read before the drain
            return httpx.Response(200, json={"nodes": [{**idle, "name": VICTIM}], "errors": []})
        return httpx.Response(404, json={"errors": [{"error": "not served here"}]})

    class Scontrol(FakeSlurm):
        async def drain(self, node: str | list[str], reason: str) -> None:
            await super().drain(node, reason)
            order.append("drain")
            drained.set()

    async def main() -> None:
        nonlocal loop, syncer
        loop = asyncio.get_running_loop()
        rest = restapi.SlurmRest(restapi.RestConfig("http://slurm", "root", "t"), version="v0.0.42")
        rest._client = httpx.AsyncClient(
            base_url="http://slurm", transport=httpx.MockTransport(slurmrestd)
        )
        syncer = Syncer(
            kube=RecordingKube(),
            rest=rest,
            scontrol=Scontrol(names()),
            settings=SyncSettings(hold_taint=False),
        )
        syncer.nodes = {name: kube_node(name) for name in names()}
        syncer.slurm = dict.fromkeys(names(), node_view(idle))
        syncer.jobs = []
        monkeypatch.setattr(restapi, "node_view", held_in_the_middle)
        assert await syncer.poll_slurm(full=True)
        order.append("read swapped in")
        await asyncio.gather(*syncer._tasks)
        await rest.aclose()

    asyncio.run(main())
    assert order == ["parse halfway", "drain", "parse resumed", "read swapped in"]
    assert syncer is not None and syncer.stats.drains == 1
    assert syncer.slurm is not None and len(syncer.slurm) == FLEET


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_the_pieces_read_what_json_loads_reads(path: Path) -> None:
    text = path.read_text()
    for key in ("nodes", "jobs"):
        assert restapi._loads_in_pieces(text, key, lambda x: x) == json.loads(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 2 loaded cores
@given(
    st.dictionaries(st.text(), json_values, max_size=4),
    st.one_of(st.lists(json_values, max_size=6), json_values),
    st.sampled_from([None, 0, 2]),
)
def test_the_pieces_read_any_object_as_json_loads_does(
    doc: dict[str, Any], nodes: Any, indent: int | None
) -> None:
    text = json.dumps({**doc, "nodes": nodes}, indent=indent)
    assert restapi._loads_in_pieces(text, "nodes", lambda x: x) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    ['{"nodes": [1, 2', '{"nodes": [1 2]}', '{"nodes": []} x', '{"nodes": [],}', "{", ""],
)
def test_malformed_text_is_refused_as_json_loads_refuses_it(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        restapi._loads_in_pieces(text, "nodes", lambda x: x)


@pytest.mark.parametrize(
    "body",
    [b'{"nodes": [{"state": ["IDLE"]}]}', b'{"nodes": {"a": 1}}', b"\xff", b'{"nodes": [1,]}'],
)
def test_an_answer_not_shaped_like_the_collection_is_no_answer(body: bytes) -> None:
    with pytest.raises(SlurmUnavailable):
        restapi._decoded_collection("/nodes/", body, "nodes", restapi._named_view)
