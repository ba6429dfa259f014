"""The pool's idle-connection check, answered from each connection's own socket
(decision 0253), still drops a connection the server hung up on."""

from __future__ import annotations

import asyncio
import socket

import httpx

from gpufleet.kubeapi import pool


def test_a_socket_is_readable_once_its_peer_hangs_up_or_it_is_closed() -> None:
    a, b = socket.socketpair()
    try:
        assert not pool.readable(a)
        b.close()
        assert pool.readable(a)  # the end of the stream waits to be read
    finally:
        a.close()
    assert pool.readable(a)  # closed: nothing to reuse
    assert pool.readable(None)


def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    async def go() -> None:
        connections = 0

        async def serve_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()  # hangs up with no "Connection: close": the pool must notice

        server = await asyncio.start_server(serve_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert pool.keep_sockets(client)
            assert pool.keep_sockets(client)  # once is enough: not wrapped twice
            backend = client._transport._pool._network_backend  # type: ignore[attr-defined]
            assert isinstance(backend, pool.KeptSocketBackend)
            assert not isinstance(backend.inner, pool.KeptSocketBackend)
            kept = client._transport._pool._keepalive_expiry  # type: ignore[attr-defined]
            assert kept == pool.KEEPALIVE_S  # not httpx's 5 s: a burst finds them open
            assert (await client.get("/")).text == "ok"
            for _ in range(100):  # until the hang-up reached this end
                await asyncio.sleep(0.01)
                conns = client._transport._pool.connections  # type: ignore[attr-defined]
                if conns and conns[0]._connection._network_stream.get_extra_info("is_readable"):
                    break
            assert (await client.get("/")).text == "ok"
        assert connections == 2

    asyncio.run(go())


def test_a_connection_idle_longer_than_httpx_keeps_one_is_reused() -> None:
    """After 6 s at rest (httpx alone closes idle connections after 5 s) the next request
    goes on the connection already open: no new connection, no new TLS handshake."""

    async def go() -> None:
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert pool.keep_sockets(client)
            assert (await client.get("/")).text == "ok"
            await asyncio.sleep(6.0)
            assert (await client.get("/")).text == "ok"
        assert connections == 1

    asyncio.run(go())
