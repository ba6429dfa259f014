"""httpcore's idle-connection check, answered from the socket each connection keeps.

Before each request httpcore looks at every connection in its pool and closes one the
server has hung up on: an idle HTTP/1.1 connection whose socket is readable can only be
about to read the end of the stream (``has_expired``). It asks its stream for
``is_readable``; anyio's stream answers by building the dictionary of every attribute it
can give (two, under TLS, with ``getpeername`` called for one) to look up its raw socket,
for every idle connection on every request: 7-12 % of the lifecycle controller's CPU in a
burst (docs/controller.md, "Where the remaining time goes"; decision 0253).

:func:`keep_sockets` wraps the pool's network backend so that each stream keeps the raw
socket it was opened on and answers ``is_readable`` by polling it, the same question asked
of the same socket; everything else is handed to anyio's stream unchanged.

It also keeps idle connections for :data:`KEEPALIVE_S` instead of httpx's 5 s (decision
0293): a service at rest sends a request every few seconds (its Lease), so the pool closed
every connection but one, and the next burst of faults opened up to 12 TLS connections while
its cordons waited.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

log = logging.getLogger(__name__)

SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)
"""httpcore's socket option, as its backends take it."""
KEEPALIVE_S = 60.0
"""How long an idle connection is kept: under the 90 s after which kube-apiserver closes an
idle one (client-go keeps them 90 s); one the server closed sooner (a proxy in between) reads
as readable and is dropped before it is used (above)."""


def readable(sock: socket.socket | None) -> bool:
    """Whether reading ``sock`` would not block: data, or the end of the stream. A
    socket that is gone (closed, none) counts as readable, so httpcore drops it."""
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class KeptSocketStream(httpcore.AsyncNetworkStream):
    """One of httpcore's network streams, with its raw socket kept for ``is_readable``."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return KeptSocketStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and self._socket is not None:
            return readable(self._socket)
        return self._inner.get_extra_info(info)


class KeptSocketBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, whose streams keep their raw socket."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self.inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self.inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return KeptSocketStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self.inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return KeptSocketStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def keep_sockets(client: httpx.AsyncClient) -> bool:
    """Give ``client``'s connection pool streams that keep their socket (connections it
    opens from now on) and idle connections kept :data:`KEEPALIVE_S`; False where the
    client is not built as expected (another httpx: then it stays as it is, correct and
    slower)."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(pool, httpcore.AsyncConnectionPool) or backend is None:
        log.info("httpx client not as expected: its pool's idle checks stay anyio's")
        return False
    if not isinstance(backend, KeptSocketBackend):
        pool._network_backend = KeptSocketBackend(backend)
    expiry = getattr(pool, "_keepalive_expiry", None)
    if isinstance(expiry, int | float) and expiry < KEEPALIVE_S:
        pool._keepalive_expiry = KEEPALIVE_S
    return True
