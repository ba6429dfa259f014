"""How long one parse of a large ``/nodes`` stops an event loop (decision 0221).

Builds a 24.11 ``/nodes`` answer of ``--nodes`` nodes from the recorded one
(tests/fixtures/slurm/24.11), then parses it three ways while a task on the same loop
wakes every millisecond, and prints the parse's time and the loop's longest stall:

* on the loop (``json.loads`` and the views, the syncer's way before 0221);
* ``json.loads`` and the views in a thread;
* the syncer's way now: the bytes decoded in a thread, one node at a time.

No cluster; prints, never asserts:

    .venv/bin/python bench/slurm_parse_stall.py --nodes 12500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gpufleet.slurm import restapi

RECORDED = Path(__file__).resolve().parents[1] / "tests/fixtures/slurm/24.11/v0.0.42_nodes.json"


def answer(nodes: int) -> bytes:
    recorded = json.loads(RECORDED.read_text())
    idle = next(n for n in recorded["nodes"] if n["name"] == "gpu-node-0001")
    body = {**recorded, "nodes": [{**idle, "name": f"gpu-node-{i:05d}"} for i in range(nodes)]}
    return json.dumps(body).encode()


def whole(body: bytes) -> dict[str, Any]:
    return {str(n["name"]): restapi.node_view(n) for n in json.loads(body)["nodes"]}


async def stall(parse: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """The parse's seconds and the longest gap between two wake-ups of a 1 ms ticker."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    await parse()
    took = time.perf_counter() - started
    done.set()
    await task
    return took, max(gaps)


async def run(nodes: int, repeat: int) -> None:
    body = answer(nodes)
    print(f"/nodes of {nodes} nodes: {len(body) / 1e6:.1f} MB")

    async def on_loop() -> None:
        whole(body)

    async def loads_in_thread() -> None:
        await asyncio.to_thread(whole, body)

    async def pieces_in_thread() -> None:
        await asyncio.to_thread(
            restapi._decoded_collection, "/nodes/", body, "nodes", restapi._named_view
        )

    for label, parse in (
        ("on the loop", on_loop),
        ("json.loads in a thread", loads_in_thread),
        ("one node at a time in a thread", pieces_in_thread),
    ):
        runs = [await stall(parse) for _ in range(repeat)]
        print(
            f"  {label:31s} parse {', '.join(f'{t * 1000:.0f}' for t, _ in runs)} ms;"
            f" longest loop stall {', '.join(f'{g * 1000:.0f}' for _, g in runs)} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=12500)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(run(a.nodes, a.repeat))


if __name__ == "__main__":
    main()
