"""The machines' tests end a wait at once when a machine's kernel panics (machines_harness).

The console lines are those of a real panic of an emulated machine (decision 0136)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from machines_harness import wait_for, watch_consoles

BOOTED = (
    "[  499.299545] cni0: port 1(veth346ed325) entered blocking state\n"
    "[  499.300044] cni0: port 1(veth346ed325) entered forwarding state\n"
)
PANIC = (
    "[  529.548944] traps: PANIC: double fault, error_code: 0x0\n"
    "[  529.551894] Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI\n"
    "[  529.553120] CPU: 0 UID: 0 PID: 826 Comm: kube-proxy Not tainted 6.12.117+deb13-amd64 #1\n"
    "[  529.553839] RIP: 0010:__kmalloc_cache_node_noprof+0x11a/0x320\n"
    "[  529.555689] RSP: 0018:ff68f044c066fae0 EFLAGS: 0eeaff62\n"
    "[  529.563007] Kernel panic - not syncing: Fatal exception in interrupt\n"
    "[    0.000000] Linux version 6.12.117+deb13-amd64 (debian-kernel@lists.debian.org)\n"
)


@pytest.fixture
def consoles(tmp_path: Path) -> Iterator[dict[str, Path]]:
    paths = {name: tmp_path / f"machine-{name}.console.log" for name in ("sys", "gpu")}
    for path in paths.values():
        path.write_text(BOOTED)
    watch_consoles(paths)
    yield paths
    watch_consoles(None)


def test_a_wait_ends_at_once_on_a_kernel_panic_naming_the_machine(
    consoles: dict[str, Path],
) -> None:
    polls: list[float] = []
    assert wait_for("a first poll", lambda: polls.append(time.monotonic()) or True)
    with consoles["sys"].open("a") as f:
        f.write(PANIC)
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_for("2 controller replicas Ready", lambda: False, 600)
    assert time.monotonic() - start < 60  # not the 600 s timeout
    message = str(failed.value)
    assert message.startswith("a machine's kernel crashed: sys: ")
    assert "Oops: double fault" in message and "Fatal exception in interrupt" in message
    assert "gpu" not in message


def test_a_machine_that_boots_again_without_a_panic_is_not_a_crash(
    consoles: dict[str, Path],
) -> None:
    with consoles["gpu"].open("a") as f:
        f.write("[    0.000000] Linux version 6.12.117+deb13-amd64\n[  12.1] Run /init\n")
        f.write("[  13.0] partial line without its end")  # read once it is whole
    assert wait_for("the GPU machine", lambda: "back", 5) == "back"
