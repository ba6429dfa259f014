"""Run the provisioning service with uvicorn (``gpufleet provision serve``, tests, bench)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from gpufleet.kubeapi import KubeApi, KubePort
from gpufleet.provision import cluster, render, service
from gpufleet.provision.index import MachineIndex
from gpufleet.provision.issuer import Provisioner, ServiceSettings
from gpufleet.waits import wait_set

log = logging.getLogger("gpufleet.provision")

MAX_IN_FLIGHT = 16
"""Apiserver requests in flight at once. A boot storm queues here instead of
opening a TLS connection per request (each handshake costs more CPU than the
request it carries); the kept-alive connections are reused. Audit Events use at
most two of these slots, so a boot never waits behind the Events of others."""


@dataclass(frozen=True)
class ServeOptions:
    kubeconfig: Path | None
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = None
    """How machines reach the service; default ``http://<host>:<port>``."""
    apiserver: str | None = None
    """``host:port`` machines join; default: the kubeconfig's server."""
    kernel_url: str | None = None
    initrd_url: str | None = None
    image_url: str | None = None
    images_url: str = ""
    """Named image versions at ``<images_url>/<version>/`` (a MaintenancePlan's reimage)."""
    boot_dir: Path | None = None
    """Served at ``/boot/<name>`` (kernel, initrd, root image), when given."""
    agent_wheel_url: str = ""
    agent_wheel_sha256: str = ""
    agent_args: str = ""
    """The node's agent (:func:`gpufleet.provision.render.agent_env`); no URL: none."""
    registry_mirrors: tuple[tuple[str, str], ...] = ()
    """(registry, URL) the nodes' containerd pulls from (``--registry-mirror``)."""


def boot_config(options: ServeOptions) -> render.BootConfig:
    import os

    kubeconfig = options.kubeconfig or Path(
        os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config"))
    )
    return cluster.boot_config(
        kubeconfig,
        public_url=options.public_url or f"http://{options.host}:{options.port}",
        apiserver=options.apiserver,
        kernel_url=options.kernel_url,
        initrd_url=options.initrd_url,
        image_url=options.image_url,
        images_url=options.images_url,
        agent_wheel_url=options.agent_wheel_url,
        agent_wheel_sha256=options.agent_wheel_sha256,
        agent_args=options.agent_args,
        registry_mirrors=options.registry_mirrors,
    )


async def serve(
    options: ServeOptions,
    settings: ServiceSettings,
    *,
    started: threading.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until ``stop`` is set (or the process is signalled)."""
    api = await KubeApi.connect(
        str(options.kubeconfig) if options.kubeconfig else None, max_in_flight=MAX_IN_FLIGHT
    )
    index = MachineIndex(api)
    index_task = asyncio.create_task(index.run(), name="machine-index")
    try:
        await _serve(options, settings, api, index, started=started, stop=stop)
    finally:
        index_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await index_task


async def _serve(
    options: ServeOptions,
    settings: ServiceSettings,
    api: KubePort,
    index: MachineIndex,
    *,
    started: threading.Event | None,
    stop: asyncio.Event | None,
) -> None:
    # Requests before the index is synced read the apiserver; waiting a little
    # for it only spares the first boots that detour.
    await wait_set(index.ready, 10)
    provisioner = Provisioner(api, boot_config(options), settings, index=index)
    config = uvicorn.Config(
        service.create_app(provisioner, boot_dir=options.boot_dir),
        host=options.host,
        port=options.port,
        log_level="warning",
        access_log=False,
        # uvicorn's loggers go to the process's handler (text or --log-format json).
        log_config=None,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            raise RuntimeError(f"the service did not start on {options.host}:{options.port}")
        await asyncio.sleep(0.02)
    log.info("provisioning service on http://%s:%d", options.host, options.port)
    if started is not None:
        started.set()
    if stop is None:
        await task
        return
    await stop.wait()
    server.should_exit = True
    await task


@contextmanager
def in_thread(options: ServeOptions, settings: ServiceSettings) -> Iterator[str]:
    """The service in a background thread (tests, bench); yields its base URL."""
    started = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    errors: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve(options, settings, started=started, stop=stop))
        except BaseException as exc:
            errors.append(exc)
            started.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="gpufleet-provision", daemon=True)
    thread.start()
    started.wait(30)
    if errors:
        raise errors[0]
    try:
        yield f"http://{options.host}:{options.port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
