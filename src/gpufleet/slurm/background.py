"""The real syncer on its own event loop in a thread, for synchronous callers.

The Slurm integration tests and ``bench/slurm_sync.py`` drive a cluster with blocking
calls (HTTP patches, ``sinfo``) while the syncer runs beside them in the same process,
where its timings and stats can be read directly. Both use this one class: the tests
must not be a library the benchmarks import, and this is the syncer's own wiring
(slurmrestd + scontrol + Kubernetes), which belongs with the syncer.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

from gpufleet.kubeapi import SERVICE_IN_FLIGHT, KubeApi
from gpufleet.slurm.gpu_holds import CliConfig, SlurmCli
from gpufleet.slurm.metrics import SyncerMetrics
from gpufleet.slurm.restapi import RestConfig, SlurmRest
from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig
from gpufleet.slurm.syncer import Syncer, SyncSettings
from gpufleet.slurm.writes import SlurmWrites

T = TypeVar("T")


@dataclass(frozen=True)
class SlurmEndpoints:
    """Where the syncer finds both sides (the local cluster's ``ClusterInfo`` has each)."""

    kubeconfig: Path
    slurmrestd_url: str
    jwt: str
    slurm_conf: Path
    user: str = "root"
    scontrol: str = "scontrol"
    """The scontrol of the server's Slurm release (for requeues; drains go by REST
    when the API has node update)."""


class SyncerThread:
    """Start with :meth:`start` (returns after the first complete pass), end with :meth:`stop`.

    ``syncer`` is the running :class:`Syncer`, ``rest`` and ``scontrol`` its clients
    (``writes`` chooses between them for each write);
    coroutines that touch them run on the syncer's loop through :meth:`call`.
    """

    def __init__(
        self,
        endpoints: SlurmEndpoints,
        settings: SyncSettings,
        metrics: SyncerMetrics | None = None,
    ) -> None:
        self.endpoints, self.settings, self.metrics = endpoints, settings, metrics
        self.loop = asyncio.new_event_loop()
        self.syncer: Syncer | None = None
        self.rest: SlurmRest | None = None
        self.scontrol: Scontrol | None = None
        self.writes: SlurmWrites | None = None
        self.error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="syncer")
        self._ready = threading.Event()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._run())
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # surfaced by start() or stop()
            self.error = e
            self._ready.set()

    async def _run(self) -> None:
        ep = self.endpoints
        kube = await KubeApi.connect(str(ep.kubeconfig), max_in_flight=SERVICE_IN_FLIGHT)
        self.rest = rest = SlurmRest(RestConfig(ep.slurmrestd_url, ep.user, ep.jwt))
        self.scontrol = scontrol = Scontrol(
            ScontrolConfig(scontrol=ep.scontrol, env={"SLURM_CONF": str(ep.slurm_conf)})
        )
        self.writes = writes = SlurmWrites(rest, scontrol)
        self.syncer = Syncer(
            kube=kube,
            rest=rest,
            scontrol=writes,
            settings=self.settings,
            metrics=self.metrics,
            reservations=scontrol,
            gpu_holds=SlurmCli(
                CliConfig(bin_dir=os.path.dirname(ep.scontrol), env=scontrol.config.env)
            ),
        )
        self._task = asyncio.ensure_future(self.syncer.run())

        async def mark_ready() -> None:
            assert self.syncer is not None
            await self.syncer.synced.wait()
            self._ready.set()

        ready = asyncio.ensure_future(mark_ready())
        try:
            await self._task
        finally:
            ready.cancel()
            await rest.aclose()

    def start(self, timeout: float = 30) -> Self:
        self._thread.start()
        assert self._ready.wait(timeout), "syncer did not complete a first pass"
        if self.error:
            raise self.error
        return self

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the syncer's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self._task is not None:
            self.loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
        if self.error:
            raise self.error
