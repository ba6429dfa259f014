"""The stop of a long-running command (gpufleet tenant-controller, pod-scheduler): a task that
loses a cancellation gets another, and one that outlives every round is named."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from gpufleet.cli import service


async def _deaf(times: int, cancels: list[int]) -> None:
    """A loop that carries on after its first ``times`` cancellations, as one that waited
    with ``asyncio.wait_for`` on Python 3.11 could (decision 0294)."""
    while True:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancels.append(1)
            if len(cancels) > times:
                raise


@pytest.fixture(autouse=True)
def _short_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "STOP_WAIT_S", 0.05)


def test_a_task_that_lost_a_cancellation_ends_at_the_next_round() -> None:
    """SIGTERM, as the kubelet sends it: the loop ignores the first cancellation and ends
    with the second, and the command returns."""
    cancels: list[int] = []

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        await service.run_until_signalled(
            _deaf(1, cancels), None, asyncio.Event(), logging.getLogger("t")
        )

    asyncio.run(main())
    assert cancels == [1, 1]


def test_a_task_that_outlives_every_round_is_named(caplog: pytest.LogCaptureFixture) -> None:
    cancels: list[int] = []

    async def main() -> None:
        task = asyncio.create_task(_deaf(service.STOP_ROUNDS, cancels), name="deaf")
        await asyncio.sleep(0)
        await service._end([task], logging.getLogger("t"))
        assert not task.done()
        task.cancel()  # one more: it ends now
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert len(cancels) == service.STOP_ROUNDS + 1
    assert "still running" in caplog.text and "deaf" in caplog.text
