"""CPU of httpcore's idle-connection check, with anyio's stream and with the kept socket.

Before each request httpcore asks every idle connection in its pool whether its socket is
readable (a server that hung up). This measures the CPU one such check takes on an idle
HTTP/1.1 connection over TLS to a local server (127.0.0.1, a throw-away self-signed
certificate), as anyio's stream answers it and as :mod:`gpufleet.kubeapi.pool`'s stream
does (decision 0253). The controller keeps up to 8 connections, so each request pays up
to 8 checks. Run:

    .venv/bin/python bench/pool_check.py
    .venv/bin/python bench/pool_check.py --checks 200000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization

from gpufleet.kubeapi import pool
from gpufleet.local import pki


def server_context(directory: Path) -> ssl.SSLContext:
    """A TLS server context with a fresh self-signed certificate for 127.0.0.1 (as a
    BMC's factory certificate is made: :func:`gpufleet.local.pki.issue_serving`)."""
    cert, key = pki.issue_serving(None, None, "127.0.0.1", ips=["127.0.0.1"], dns=[])
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(pki.pem(cert))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 with keep-alive: 'ok' to every request until the client goes."""
    try:
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass  # the client went, or the bench ends with the connection open
    finally:
        writer.close()


async def check_cpu_us(url: str, kept: bool, checks: int) -> float:
    """CPU microseconds of one ``has_expired`` on an idle pooled connection."""
    async with httpx.AsyncClient(base_url=url, verify=False) as client:
        if kept:
            pool.keep_sockets(client)
        await client.get("/")
        connection = client._transport._pool.connections[0]  # type: ignore[attr-defined]
        start = time.process_time()
        for _ in range(checks):
            connection.has_expired()
        return (time.process_time() - start) / checks * 1e6


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checks", type=int, default=50_000, help="checks timed per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the median is shown")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context(Path(tmp)))
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            for kept, label in ((False, "anyio's stream"), (True, "kept socket")):
                runs = [await check_cpu_us(url, kept, args.checks) for _ in range(args.repeat)]
                print(
                    f"{label:15} {statistics.median(runs):6.2f} us CPU per idle-connection check"
                    f" (min {min(runs):.2f}, max {max(runs):.2f}; {args.repeat} runs of"
                    f" {args.checks})"
                )


if __name__ == "__main__":
    asyncio.run(main())
