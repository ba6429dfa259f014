"""The BMC emulator's boot delay and boot hook (outside Redfish, for the local cluster)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpufleet.local import redfish


def _receiver() -> tuple[ThreadingHTTPServer, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            got.append({"path": self.path, **json.loads(self.rfile.read(n))})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def test_a_reset_boots_and_calls_the_hook() -> None:
    server, got = _receiver()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/recover"
        bmc = redfish.BmcState(node="n1", boot_hook=url)
        with bmc.lock:
            bmc.reset("PowerCycle")
        assert bmc.power_state == "On" and bmc.boot_count == 1
        assert got == [{"path": "/recover", "node": "n1", "event": "boot"}]
    finally:
        server.shutdown()


def test_boot_seconds_keep_the_system_off_until_it_has_booted() -> None:
    bmc = redfish.BmcState(node="n1", boot_seconds=0.3)
    with bmc.lock:
        bmc.reset("ForceRestart")  # (a graceful one waits for the OS first: test_redfish_firmware)
        assert bmc.power_state == "Off"
    deadline = time.monotonic() + 5
    while bmc.power_state != "On" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert bmc.power_state == "On" and bmc.boot_count == 1
    assert [e["MessageId"].rsplit(".", 1)[1] for e in bmc.log] == [
        "ResetRequested",
        "PowerOff",
        "SystemBooted",
    ]


def test_an_unreachable_hook_does_not_stop_the_boot() -> None:
    bmc = redfish.BmcState(node="n1", boot_hook="http://127.0.0.1:1/recover")
    with bmc.lock:
        bmc.reset("ForceRestart")
    assert bmc.power_state == "On"
