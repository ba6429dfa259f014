"""The provisioning HTTP service (FastAPI; OpenAPI schema at ``/openapi.json``).

Endpoints, all keyed by the booting NIC's MAC:

- ``GET /ipxe?mac=…`` -- the iPXE script (chain-loaded from DHCP with
  ``chain http://…/ipxe?mac=${net0/mac}``); no secrets in it;
- ``GET /cloud-init/{mac}/meta-data`` -- nocloud meta-data (instance id, hostname);
- ``GET /cloud-init/{mac}/serial/{serial}/{meta-data,user-data}`` -- the same, with
  the serial in the path instead of a header (the seed URL of the iPXE script: iPXE
  fills in the SMBIOS serial, cloud-init's NoCloud datasource sends no headers);
- ``GET /cloud-init/{mac}/{vendor-data,network-config}`` (and under ``serial/{serial}/``)
  -- empty and "disabled": cloud-init asks for both and retries a 404 for 10 s each;
- ``GET /cloud-init/{mac}/user-data`` -- the kubeadm join with a fresh
  single-use token; the node authenticates with the header
  ``X-Gpufleet-Enrollment: <secret>`` or ``X-Gpufleet-Serial: <serial>``;
- ``GET /healthz``, ``GET /metrics``;
- ``GET /boot/<name>`` -- the files of the boot directory (kernel, initrd, root
  image), when the service is started with one (the local cluster's machines).

An unknown MAC gets a bare 404 (it learns nothing), an Event and a metric.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet.kubeapi import ApiError
from gpufleet.provision.issuer import SEED_EXTRAS, Provisioner, Refused

TEXT = "text/plain; charset=utf-8"


def create_app(provisioner: Provisioner, *, boot_dir: Path | None = None) -> FastAPI:
    """The ASGI app serving ``provisioner`` (and ``boot_dir`` at ``/boot``)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await provisioner.drain_events()

    app = FastAPI(
        title="gpufleet provisioning",
        version="v1alpha1",
        description="Day 0: network boot, cloud-init and single-use join tokens for known "
        "machines (docs/provisioning.md).",
        lifespan=lifespan,
    )
    metrics = provisioner.metrics

    async def answer(
        endpoint: str, work: Callable[[], Awaitable[str]], headers: dict[str, str] | None = None
    ) -> Response:
        start = time.perf_counter()
        try:
            text = await work()
            result, response = "ok", PlainTextResponse(text, headers=headers)
        except Refused as exc:
            result = str(exc.status)
            response = PlainTextResponse(exc.public + "\n", status_code=exc.status)
        except ApiError:
            result, response = "error", PlainTextResponse("try again\n", status_code=503)
        metrics.requests.labels(endpoint=endpoint, result=result).inc()
        metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - start)
        return response

    def client_of(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    @app.get("/ipxe", response_class=PlainTextResponse, summary="iPXE boot script for a MAC")
    async def ipxe(
        request: Request, mac: str = Query(description="the booting NIC, e.g. aa:bb:cc:dd:ee:ff")
    ) -> Response:
        return await answer("ipxe", lambda: provisioner.ipxe(mac, client=client_of(request)))

    @app.get(
        "/cloud-init/{mac}/meta-data",
        response_class=PlainTextResponse,
        summary="nocloud meta-data",
    )
    async def meta_data(request: Request, mac: str) -> Response:
        return await answer(
            "meta-data", lambda: provisioner.meta_data(mac, client=client_of(request))
        )

    @app.get(
        "/cloud-init/{mac}/user-data",
        response_class=PlainTextResponse,
        summary="cloud-init user-data with a single-use join token",
    )
    async def user_data(
        request: Request,
        mac: str,
        x_gpufleet_enrollment: str | None = Header(default=None),
        x_gpufleet_serial: str | None = Header(default=None),
    ) -> Response:
        async def work() -> str:
            boot = await provisioner.user_data(
                mac,
                client=client_of(request),
                enrollment_secret=x_gpufleet_enrollment,
                serial=x_gpufleet_serial,
            )
            return boot.user_data

        return await answer("user-data", work, {"Cache-Control": "no-store"})

    # The same two documents under a seed URL that carries the serial: cloud-init's
    # NoCloud datasource sends no headers, so the iPXE script puts the serial iPXE
    # reads from SMBIOS into the seed URL; it is checked exactly as the header is.
    @app.get(
        "/cloud-init/{mac}/serial/{serial}/meta-data",
        response_class=PlainTextResponse,
        summary="nocloud meta-data (seed URL with the serial)",
    )
    async def meta_data_with_serial(request: Request, mac: str, serial: str) -> Response:
        return await meta_data(request, mac)

    @app.get(
        "/cloud-init/{mac}/serial/{serial}/user-data",
        response_class=PlainTextResponse,
        summary="cloud-init user-data, the node's serial in the path (cloud-init sends no headers)",
    )
    async def user_data_with_serial(request: Request, mac: str, serial: str) -> Response:
        return await user_data(request, mac, None, serial)

    # cloud-init's NoCloud datasource also fetches vendor-data and network-config and
    # retries a 404 ten times, a second apart; both carry nothing a node needs.
    def seed_extra_routes(document: str) -> None:
        async def seed_extra(request: Request, mac: str) -> Response:
            return await answer(
                document,
                lambda: provisioner.seed_extra(mac, document, client=client_of(request)),
            )

        async def seed_extra_with_serial(request: Request, mac: str, serial: str) -> Response:
            return await seed_extra(request, mac)

        summary = f"nocloud {document} (nothing for the node; answered so cloud-init goes on)"
        for path, endpoint in (
            (f"/cloud-init/{{mac}}/{document}", seed_extra),
            (f"/cloud-init/{{mac}}/serial/{{serial}}/{document}", seed_extra_with_serial),
        ):
            app.add_api_route(
                path, endpoint, methods=["GET"], response_class=PlainTextResponse, summary=summary
            )

    for document in SEED_EXTRAS:
        seed_extra_routes(document)

    if boot_dir is not None:
        from fastapi.staticfiles import StaticFiles

        # Links to the image cache are followed (the local cluster links its files).
        app.mount("/boot", StaticFiles(directory=boot_dir, follow_symlink=True), name="boot")

    @app.get("/healthz", response_class=PlainTextResponse, include_in_schema=False)
    async def healthz() -> str:
        return "ok\n"

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
