"""The Day-0 boot watchdog's decisions: stages, stalls, retries, the last attempt."""

from __future__ import annotations

from gpufleet.domain import boot_watch as bw
from gpufleet.domain.enrollment import rfc3339

T0 = 1_800_000_000.0


def test_the_stage_is_the_furthest_reached_since_this_power_on() -> None:
    assert bw.BootProgress(T0, 1).stage is bw.Stage.REQUESTED
    assert bw.BootProgress(T0, 1, network_boot_at=T0 + 5).stage is bw.Stage.NETWORK_BOOT
    both = bw.BootProgress(T0, 1, network_boot_at=T0 + 5, token_at=T0 + 60)
    assert both.stage is bw.Stage.TOKEN_ISSUED and both.stage_since == T0 + 60
    # A token or a network boot from before this power-on is the previous boot's.
    old = bw.BootProgress(T0, 2, network_boot_at=T0 - 100, token_at=T0 - 50)
    assert old.stage is bw.Stage.REQUESTED and old.stage_since == T0


def test_each_stage_has_its_own_stall_clock() -> None:
    p = bw.BootProgress(T0, 1, network_boot_at=T0 + 500)
    assert isinstance(bw.judge(p, T0 + 700, stall_seconds=300, attempts=3), bw.Waiting)
    v = bw.judge(p, T0 + 801, stall_seconds=300, attempts=3)
    assert isinstance(v, bw.Stalled)
    assert v.reason == "ImageDidNotBoot" and v.retry and v.next_attempt == 2
    assert "power cycle 2 of 3" in v.message


def test_every_stage_names_where_to_look() -> None:
    reasons = {
        bw.judge(p, T0 + 10_000, stall_seconds=60, attempts=2).reason  # type: ignore[union-attr]
        for p in (
            bw.BootProgress(T0, 1),
            bw.BootProgress(T0, 1, network_boot_at=T0 + 1),
            bw.BootProgress(T0, 1, network_boot_at=T0 + 1, token_at=T0 + 2),
        )
    }
    assert reasons == {"NoNetworkBoot", "ImageDidNotBoot", "JoinDidNotComplete"}


def test_a_stall_on_the_last_attempt_fails_the_boot() -> None:
    v = bw.judge(bw.BootProgress(T0, 3), T0 + 61, stall_seconds=60, attempts=3)
    assert isinstance(v, bw.Stalled) and not v.retry
    assert "no attempts left (3 of 3)" in v.message
    status = bw.stalled_status(v)
    assert status["phase"] == "Failed" and status["boot"]["outcome"] == "Failed"
    assert status["boot"]["reason"] == "NoNetworkBoot"


def test_progress_is_read_back_from_what_the_patches_write() -> None:
    status = bw.requested_status(by="admin", at=T0, attempt=2)
    assert bw.progress_of(status) == bw.BootProgress(T0, 2)
    status["boot"].update(bw.network_boot_status(T0 + 9)["boot"])
    status["tokenIssuedAt"] = rfc3339(T0 + 30)
    got = bw.progress_of(status)
    assert got is not None and got.stage is bw.Stage.TOKEN_ISSUED and got.attempt == 2
    # Finished boots and machines never powered on through gpufleet have none.
    assert bw.progress_of({**status, "boot": bw.joined_status()["boot"]}) is None
    assert bw.progress_of({}) is None
    assert bw.progress_of({"boot": {"outcome": "InProgress", "requestedAt": "garbage"}}) is None


def test_a_network_boot_nobody_asked_for_is_never_a_boot_in_progress() -> None:
    # What the service writes for an iPXE request carries no boot of its own ...
    patch = bw.network_boot_status(T0)
    assert bw.progress_of(patch) is None
    assert set(patch["boot"]) == {"networkBootAt", "stage"}
    # ... and a boot an older service started at an iPXE request is not watched either.
    old = {
        "boot": {
            "requestedAt": rfc3339(T0),
            "requestedBy": bw.UNREQUESTED,
            "attempt": 1,
            "outcome": "InProgress",
            "networkBootAt": rfc3339(T0),
        }
    }
    assert bw.progress_of(old) is None
    # A boot gpufleet requested is, once its iPXE script is served.
    requested = bw.requested_status(by="admin", at=T0, attempt=1)
    requested["boot"].update(bw.network_boot_status(T0 + 2)["boot"])
    got = bw.progress_of(requested)
    assert got is not None and got.stage is bw.Stage.NETWORK_BOOT
