"""A read-only container registry for the local cluster's nodes.

It serves the images of OCI image layouts (:mod:`gpufleet.local.images`) over the
pull half of the OCI distribution API, which is all a node's containerd uses:

- ``GET /v2/``: the API version check;
- ``GET``/``HEAD /v2/<name>/manifests/<tag or digest>``;
- ``GET``/``HEAD /v2/<name>/blobs/<digest>``.

An image ``gpufleet.local/gpufleet:0.1.0-ab12cd34`` is ``<name>`` ``gpufleet``,
tag ``0.1.0-ab12cd34``: the registry host in a reference is whatever the node's
containerd was told it is (``hosts.toml``), so it is not matched. Nothing can be
pushed; the layouts are read on each manifest request, so images built while it
runs are served. Plain HTTP on 127.0.0.1: machines reach it through qemu's
forward, as they reach the apiserver.

Run: ``python -m gpufleet.local.registry --port 5000 LAYOUT [LAYOUT...]``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpufleet.local import oci
from gpufleet.local.processes import ManagedProcess

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME = re.compile(r"^[a-z0-9]+(?:[._/-][a-z0-9]+)*$")
ROUTE = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


class Layouts:
    """The image layouts served, looked up by ``name:tag`` or by digest."""

    def __init__(self, directories: Sequence[Path]) -> None:
        self.directories = list(directories)

    def manifest(self, name: str, reference: str) -> tuple[Path, str] | None:
        """(blob path, media type) of the manifest ``name`` tags ``reference`` (or is)."""
        for layout in self.directories:
            try:
                index = json.loads((layout / "index.json").read_text())
            except (OSError, ValueError):
                continue
            for entry in index.get("manifests") or []:
                full = (entry.get("annotations") or {}).get("io.containerd.image.name", "")
                repo, _, tag = full.rpartition(":")
                named = repo == name or repo.endswith("/" + name)
                if named and reference in (tag, entry.get("digest")):
                    blob = self.blob(entry["digest"])
                    if blob is not None:
                        return blob, str(entry.get("mediaType", oci.MANIFEST_TYPE))
        return None

    def blob(self, digest: str) -> Path | None:
        if not DIGEST.match(digest):
            return None
        for layout in self.directories:
            path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
            if path.is_file():
                return path
        return None


def _handler(layouts: Layouts) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpufleet-local-registry"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _error(self, status: int, code: str, message: str) -> None:
            data = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _serve(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/v2", "/v2/"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.end_headers()
                if body:
                    self.wfile.write(b"{}")
                return
            route = ROUTE.match(path)
            if route is None or not NAME.match(route["name"]):
                self._error(404, "NAME_UNKNOWN", f"no such path {path}")
                return
            if route["kind"] == "manifests":
                found = layouts.manifest(route["name"], route["ref"])
                if found is None:
                    self._error(404, "MANIFEST_UNKNOWN", f"{route['name']}:{route['ref']}")
                    return
                blob, media_type = found
            else:
                blob_path = layouts.blob(route["ref"])
                if blob_path is None:
                    self._error(404, "BLOB_UNKNOWN", route["ref"])
                    return
                blob, media_type = blob_path, "application/octet-stream"
            self.send_response(200)
            self.send_header("Content-Type", media_type)
            self.send_header("Content-Length", str(blob.stat().st_size))
            self.send_header("Docker-Content-Digest", f"sha256:{blob.name}")
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.end_headers()
            if body:
                with open(blob, "rb") as f:
                    shutil.copyfileobj(f, self.wfile, 1 << 20)

    return Handler


def server(layouts: Sequence[Path], host: str, port: int) -> ThreadingHTTPServer:
    """A registry server bound to ``host:port`` (port 0: any free port), not yet serving."""
    srv = ThreadingHTTPServer((host, port), _handler(Layouts(layouts)))
    srv.daemon_threads = True
    return srv


def process(run_dir: Path, port: int, layout: Path) -> ManagedProcess:
    """The local cluster's ``registry`` component (logs ``logs/registry.log``)."""
    return ManagedProcess(
        "registry",
        [sys.executable, "-m", "gpufleet.local.registry", f"--port={port}", str(layout)],
        run_dir / "logs" / "registry.log",
        cwd=run_dir,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet.local.registry",
        description="Serve OCI image layouts read-only over the registry pull API.",
        epilog="Example: python -m gpufleet.local.registry --port 5000 "
        "~/.cache/gpufleet/images/store/app-0123456789ab",
    )
    parser.add_argument("layouts", nargs="+", type=Path, help="OCI image layout directories")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="port to bind")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.layouts if not (p / "index.json").is_file()]
    if missing:
        parser.error(f"not an OCI image layout (no index.json): {', '.join(missing)}")
    srv = server(args.layouts, args.host, args.port)
    print(f"registry serving {len(args.layouts)} layout(s) on http://{args.host}:{args.port}/v2/")
    sys.stdout.flush()
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
