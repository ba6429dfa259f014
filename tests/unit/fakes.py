"""The unit tests' fakes of the outside systems other than Kubernetes: one per interface.

Each fake declares the Protocol it stands in for, and mypy checks this module
(``[tool.mypy] files``), so a fake that drifts from its interface is a type error
here rather than a test that passes against a method the real client lacks.

* :class:`FakeSlurm`: slurmrestd and scontrol (:mod:`gpufleet.slurm.ports`) over one
  dict of node views;
* :class:`FakeBmc`: a node's BMC as the ladder's BMC steps use it
  (:class:`gpufleet.remediate.steps.Bmc`).

Node hardware has no fake here: the simulated backend
(:class:`gpufleet.health.backend_sim.SimulatedHardware`) is the one implementation of
:class:`gpufleet.health.hardware.Hardware` the tests use, and it declares the interface too.
The Kubernetes fakes (``tests/unit/lifecycle/fakes.py``: a small apiserver;
``tests/unit/slurm/fakes.py``: a recorder of Node patches) start from
:class:`UnmodelledKube` here, which answers every call of the port with
NotImplementedError, so each fake writes only the calls it models.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from gpufleet.domain import departure, hostlist, slurm_sync
from gpufleet.kubeapi import Json, KubePort, ObjectList, Patch, Resource, WatchEvent
from gpufleet.remediate.evidence import ResetEvidence
from gpufleet.remediate.identity import BmcIdentity
from gpufleet.remediate.redfish import BmcOutcomeUnknown, BmcRejected, BmcUnreachable
from gpufleet.remediate.steps import Bmc
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
        self.unchanged = False
        """Answer reads "changed since" with "nothing changed" (slurmrestd's 304)."""
        self.ended_jobs: Mapping[int, departure.Ended] = {}
        """Ended jobs that asked for a departure notice (their state and exit code)."""
        self.since: list[float] = []
        """The ``since`` of every "changed since" read of the nodes."""
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

    async def nodes_if_changed(self, since: float) -> dict[str, slurm_sync.SlurmView] | None:
        """Like slurmrestd with ``update_time``: None (304) while :attr:`unchanged` is set."""
        self.since.append(since)
        self._up()
        return None if self.unchanged else await self.nodes()

    async def node(self, name: str) -> slurm_sync.SlurmView | None:
        self.reads.append(name)
        self._up()
        return self.views.get(name)

    async def running_jobs(self) -> list[slurm_sync.JobView]:
        self._up()
        return list(self.jobs)

    async def running_jobs_if_changed(self, since: float) -> list[slurm_sync.JobView] | None:
        self._up()
        return None if self.unchanged else await self.running_jobs()

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

    async def signal_steps(self, job_id: int, signal: str) -> None:
        self._up()
        self.calls.append(("signal", str(job_id), signal))
        if job_id in self.refuse_requeue:
            raise SlurmCommandFailed(["scancel"], 1, "Job/step already completing or completed")

    async def reconfigure(self) -> None:
        self._up()
        self.calls.append(("reconfigure",))


class FakeBmc(Bmc):
    """One BMC in memory: a power state and a LastResetTime that each reset advances.

    ``calls`` records what was asked, in order; ``lose_answer`` makes resets raise
    :class:`BmcOutcomeUnknown` (the answer was lost) after or instead of carrying them
    out; ``allowed`` lists the reset types the BMC offers (empty: all).
    """

    def __init__(self, *, serial: str = "SN-1", name: str = "bmc-1") -> None:
        self._name = name
        self.seen = BmcIdentity(serial=serial)
        self.power = "On"
        self.resets = 0
        self.allowed: tuple[str, ...] = ()
        self.lose_answer: bool | None = None
        """None: answer every reset; True: lose the answer of a performed reset;
        False: lose the answer and do not perform it."""
        self.performs = True
        """False: answer a reset as accepted and never carry it out (a hung OS)."""
        self.boot: str | None = None
        """The one-time boot armed (the firmware has not read it: nothing here boots)."""
        self.calls: list[str] = []

    @property
    def name(self) -> str:
        return self._name

    async def identity(self) -> BmcIdentity:
        self.calls.append("identity")
        return self.seen

    async def evidence(self) -> ResetEvidence:
        self.calls.append("evidence")
        return ResetEvidence(last_reset_time=f"t{self.resets}", power_state=self.power)

    async def power_state(self) -> str:
        return self.power

    async def reset(self, reset_type: str) -> None:
        self.calls.append(f"reset {reset_type}")
        if not self.allows(reset_type):
            raise BmcRejected(self._name, f"ResetType {reset_type} is not allowed")
        if self.lose_answer is not False and self.performs:
            if reset_type != "ForceOff":  # a power-off is not a reset: LastResetTime stays
                self.resets += 1
            self.power = "Off" if reset_type == "ForceOff" else "On"
        if self.lose_answer is not None:
            raise BmcOutcomeUnknown(self._name, "read timed out")

    def allows(self, reset_type: str) -> bool:
        return not self.allowed or reset_type in self.allowed

    async def wait_power(self, state: str) -> None:
        self.calls.append(f"wait {state}")
        if self.power != state:
            raise BmcUnreachable(self._name, f"PowerState still {self.power}")

    async def set_one_time_boot(self, target: str = "Pxe") -> None:
        self.calls.append(f"boot {target}")
        self.boot = target

    async def clear_one_time_boot(self) -> None:
        self.calls.append("boot cleared")
        self.boot = None

    async def one_time_boot(self) -> str | None:
        return self.boot


class UnmodelledKube:
    """Every call of :class:`~gpufleet.kubeapi.KubePort` raises NotImplementedError.

    The base of the Kubernetes fakes: a test never passes because a call it did
    not expect silently did nothing.
    """

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        raise NotImplementedError(f"get {resource}")

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        raise NotImplementedError(f"list {resource}")

    async def watch(
        self,
        resource: Resource,
        resource_version: str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        bookmarks: bool = False,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        raise NotImplementedError(f"watch {resource}")
        yield WatchEvent("", {})  # pragma: no cover  (makes this an async generator)

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        raise NotImplementedError(f"create {resource}")

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json:
        raise NotImplementedError(f"patch {resource}")

    async def apply(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str = "gpufleet",
    ) -> Json:
        raise NotImplementedError(f"apply {resource}")

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        raise NotImplementedError(f"delete {resource}")

    async def delete_all(self, resource: Resource, *, namespace: str, label_selector: str) -> None:
        raise NotImplementedError(f"delete {resource} by selector")

    async def evict(self, namespace: str, name: str) -> None:
        raise NotImplementedError("evict")

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        raise NotImplementedError("bind")

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        raise NotImplementedError("create_event")


_kube_port: type[KubePort] = UnmodelledKube  # mypy checks the base against the port
