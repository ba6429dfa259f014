"""The unit tests' fakes of the outside systems other than Kubernetes: one per interface.

Each fake declares the Protocol it stands in for, and mypy checks this module
(``[tool.mypy] files``), so a fake that drifts from its interface is a type error
here rather than a test that passes against a method the real client lacks.

* :class:`FakeSlurm`: slurmrestd and scontrol (:mod:`gpufleet.slurm.ports`) over one
  dict of node views.

Node hardware has no fake here: the simulated backend
(:class:`gpufleet.health.backend_sim.SimulatedHardware`) is the one implementation of
:class:`gpufleet.health.hardware.Hardware` the tests use, and it declares the interface too.
The Kubernetes fake is ``tests/unit/kube/fakes.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.domain import slurm_sync
from gpufleet.slurm import hostlist
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmUnavailable
from gpufleet.slurm.ports import ScontrolPort, SlurmRestPort

IDLE = slurm_sync.SlurmView("idle", frozenset(), None)


class FakeSlurm(SlurmRestPort, ScontrolPort):
    """slurmrestd and scontrol over one dict of views; records the reads and the writes.

    ``down`` makes every call raise :class:`SlurmUnavailable` (slurmctld stopped);
    ``refuse`` names nodes scontrol rejects, ``refuse_requeue`` jobs it will not requeue.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.views: dict[str, slurm_sync.SlurmView] = dict.fromkeys(names, IDLE)
        self.jobs: list[slurm_sync.JobView] = []
        self._version: str | None = "v0.0.38"
        self.down = False
        self.refuse: set[str] = set()
        self.refuse_requeue: set[int] = set()
        self.reads: list[str] = []
        """Node names read one by one; ``*`` for a read of every node."""
        self.calls: list[tuple[str, ...]] = []
        """scontrol writes: ``(verb, hostlist[, reason])``."""
        self.requeued: list[int] = []

    @property
    def version(self) -> str | None:
        return self._version

    @version.setter
    def version(self, value: str | None) -> None:
        self._version = value

    def _up(self) -> None:
        if self.down:
            raise SlurmUnavailable("stopped")

    # -- slurmrestd ----------------------------------------------------------------------

    async def connect(self) -> str:
        self._up()
        self._version = "v0.0.38"
        return self._version

    async def nodes(self) -> dict[str, slurm_sync.SlurmView]:
        self.reads.append("*")
        self._up()
        return dict(self.views)

    async def node(self, name: str) -> slurm_sync.SlurmView | None:
        self.reads.append(name)
        self._up()
        return self.views.get(name)

    async def running_jobs(self) -> list[slurm_sync.JobView]:
        self._up()
        return list(self.jobs)

    # -- scontrol ------------------------------------------------------------------------

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        names = [node] if isinstance(node, str) else list(node)
        self.calls.append(("drain", hostlist.compress(names), reason))
        if self.refuse & set(names):
            raise SlurmCommandFailed(["scontrol"], 1, "Invalid node name specified")
        for n in names:
            state = self.views.get(n, IDLE).state
            self.views[n] = slurm_sync.SlurmView(state, frozenset({"DRAIN"}), reason)

    async def undrain(self, node: str | Sequence[str]) -> None:
        names = [node] if isinstance(node, str) else list(node)
        self.calls.append(("undrain", hostlist.compress(names)))
        for n in names:
            self.views[n] = slurm_sync.SlurmView(self.views.get(n, IDLE).state, frozenset(), None)

    async def requeue(self, job_ids: Sequence[int]) -> None:
        self.calls.append(("requeue", ",".join(str(j) for j in job_ids)))
        if set(job_ids) & self.refuse_requeue:
            raise SlurmCommandFailed(["scontrol", "requeue"], 1, "Job is pending execution")
        self.requeued.extend(job_ids)
        self.jobs = [j for j in self.jobs if j.job_id not in job_ids]

    async def reconfigure(self) -> None:
        self._up()
        self.calls.append(("reconfigure",))
