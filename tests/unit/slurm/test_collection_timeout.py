"""Reading a whole collection: its time is learned (slow big fleets are read, frozen servers
noticed), and "nothing changed since" (304) is an answer, not a failure.

At 12,500 nodes slurmrestd answers ``/nodes`` in more than the 2 s a request may take, so
a fixed timeout left the syncer without a Slurm view; a fixed long one hid a frozen
slurmrestd for as long. The server here is a real HTTP server on 127.0.0.1 whose
answer to ``/nodes`` takes as long as the test says.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator

import pytest

from gpufleet.slurm import restapi
from gpufleet.slurm.errors import SlurmUnavailable

CONFIG = restapi.RestConfig(
    "http://127.0.0.1:1",
    "root",
    "t",
    timeout_s=0.2,
    first_collection_timeout_s=5.0,
    collection_timeout_factor=4.0,
    max_collection_timeout_s=6.0,
)


def test_the_allowance_is_generous_first_then_a_multiple_of_the_last_success() -> None:
    learned = restapi.CollectionTimeout(CONFIG)
    assert learned.seconds == 5.0
    learned.succeeded(0.75)
    assert learned.seconds == 3.0
    learned.succeeded(0.01)
    assert learned.seconds == 0.2, "never below the per-request timeout"
    learned.timed_out()
    assert learned.seconds == 0.4, "a fleet that grew is read again with more time"
    for _ in range(10):
        learned.timed_out()
    assert learned.seconds == 6.0, "doubling stops at the maximum"
    learned.succeeded(30.0)
    assert learned.seconds == 6.0


class SlowSlurm:
    """slurmrestd's v0.0.42 ping and nodes, the nodes answer after ``delay`` seconds."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.nodes_served = 0
        self.unchanged = False
        """Answer a read with ``update_time`` with 304 Not Modified, as slurmctld does
        when nothing changed since that time."""
        self.asked_since: list[str] = []
        self.frozen = False
        """Answer nothing at all (a SIGSTOPped slurmrestd)."""
        self.reconfigure_delay = 0.0
        """How long a reconfigure takes to be answered (a loaded slurmctld)."""
        self.refuse_since = False
        """Refuse a read with ``update_time`` as 22.05 does when the nodes changed but
        the partitions did not (500, "Unspecified error")."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if self.frozen:
                    await asyncio.sleep(3600)
                target = head.split(b" ", 2)[1].decode()
                path, _, query = target.partition("?")
                if query.startswith("update_time="):
                    self.asked_since.append(query.split("=", 1)[1])
                    if self.refuse_since:
                        refused = json.dumps(
                            {"meta": {}, "errors": [{"error": "Unspecified error", "errno": -1}]}
                        ).encode()
                        writer.write(
                            b"HTTP/1.1 500 Internal Server Error\r\n"
                            + f"Content-Length: {len(refused)}\r\n\r\n".encode()
                            + refused
                        )
                        await writer.drain()
                        continue
                    if self.unchanged:
                        writer.write(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 0\r\n\r\n")
                        await writer.drain()
                        continue
                if path == "/openapi":
                    body = {"paths": {"/slurm/v0.0.42/ping/": {}, "/slurm/v0.0.42/nodes/": {}}}
                elif path.endswith("/reconfigure/"):
                    await asyncio.sleep(self.reconfigure_delay)
                    body = {"errors": [], "warnings": []}
                elif path.endswith("/nodes/"):
                    await asyncio.sleep(self.delay)
                    self.nodes_served += 1
                    body = {"errors": [], "nodes": [{"name": "n0", "state": ["IDLE"]}]}
                else:
                    body = {"errors": [], "pings": []}
                data = json.dumps(body).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def connected(
    server: SlowSlurm, config: restapi.RestConfig = restapi.RestConfig("http://-", "root", "t")
) -> AsyncIterator[restapi.SlurmRest]:
    """``server`` listening on 127.0.0.1 and a client with ``config`` (its URL replaced)
    that has negotiated its API version."""
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    rest = restapi.SlurmRest(dataclasses.replace(config, url=f"http://127.0.0.1:{port}"))
    try:
        await rest.connect()
        yield rest
    finally:
        await rest.aclose()
        listener.close()


def test_a_slow_first_read_succeeds_and_a_frozen_server_is_noticed_within_the_learned_time() -> (
    None
):
    server = SlowSlurm()

    async def main() -> tuple[str, float]:
        async with connected(server, CONFIG) as rest:
            server.delay = 0.5  # slower than the 0.2 s per request: a big fleet
            assert (await rest.nodes())["n0"].state == "idle"
            allowed = rest.collection_timeout("nodes").seconds
            assert 2.0 <= allowed < 5.0, "four times the read just timed"
            server.delay = 60.0  # slower than ever, but alive: it answers a ping
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(SlurmUnavailable, match="no answer within") as failed:
                await rest.nodes()
            waited = loop.time() - started
            assert rest.collection_timeout("nodes").seconds == min(
                2 * allowed, CONFIG.max_collection_timeout_s
            ), "alive: given more time next read"
            server.frozen = True  # now nothing answers: the allowance does not grow
            grown = rest.collection_timeout("nodes").seconds
            with pytest.raises(SlurmUnavailable, match="no answer to a ping either"):
                await rest.nodes()
            assert rest.collection_timeout("nodes").seconds == grown
            return str(failed.value), waited

    message, waited = asyncio.run(main())
    assert waited < 10, f"noticed only after {waited:.1f} s: the learned allowance was not used"
    assert "it answers a ping: the next read may take" in message
    assert server.nodes_served == 1


def test_unchanged_since_is_none_and_does_not_teach_the_allowance() -> None:
    """A 304 answers in milliseconds: learned from, it would shrink the allowance below
    what the next full read of a big fleet needs."""
    server = SlowSlurm()

    async def main() -> None:
        async with connected(server) as rest:
            server.delay = 0.6
            assert set(await rest.nodes()) == {"n0"}
            allowed = rest.collection_timeout("nodes").seconds
            server.delay = 0.0
            server.unchanged = True
            assert await rest.nodes_if_changed(1_800_000_000.9) is None
            assert rest.collection_timeout("nodes").seconds == allowed
            server.unchanged = False
            changed = await rest.nodes_if_changed(1_800_000_000.9)
            assert changed is not None and changed["n0"].state == "idle"

    asyncio.run(main())
    assert server.asked_since == ["1800000000", "1800000000"]


def test_a_refused_changed_since_read_is_made_again_in_full() -> None:
    server = SlowSlurm()

    async def main() -> None:
        async with connected(server) as rest:
            server.refuse_since = True
            views = await rest.nodes_if_changed(1_800_000_000.0)
            assert views is not None and set(views) == {"n0"}

    asyncio.run(main())
    assert server.asked_since == ["1800000000"] and server.nodes_served == 1


def test_a_reconfigure_waits_longer_than_a_request_but_not_forever() -> None:
    """A reconfigure answered after 0.6 s succeeds although requests get 0.2 s (timing it
    out would leave the operator unsure it was delivered); one answered later than
    reconfigure_timeout_s is SlurmUnavailable."""
    server = SlowSlurm()
    config = dataclasses.replace(CONFIG, reconfigure_timeout_s=1.5)

    async def main() -> None:
        async with connected(server, config) as rest:
            server.reconfigure_delay = 0.6
            await rest.reconfigure()
            server.reconfigure_delay = 3.0
            with pytest.raises(SlurmUnavailable):
                await rest.reconfigure()

    asyncio.run(main())
