"""The gate: fence, rails, a trusted record, a fresh proof, a compare-and-swap mark, then the act.

See :mod:`gpufleet.gate` for the contract. Three kinds of act come here:

- :meth:`Gate.bmc_step`: a reboot, power cycle or reimage of a node (or the
  resumption of one after a restart: the mark says whether its POST went out);
- :meth:`Gate.agent_request`: a GPU reset or a maintenance command, asked of the
  node's agent by writing its request on the Node (the agent checks again);
- :meth:`Gate.network_boot`: a machine powered on to join (the boot watchdog's
  retry, an operator's ``gpufleet machines power-on``): only a machine with no
  Node, so nothing can run on it.

Each returns an outcome (:mod:`gpufleet.gate.outcomes`) instead of raising, so
a caller cannot mistake a refusal for an error and retry around the gate.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.api import nodedata
from gpufleet.clock import Clock
from gpufleet.domain import agent_requests, conditions, well_known
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, SlurmSilence
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.gate import proof
from gpufleet.gate.attempts import (
    attempt_in_progress,
    network_boot_may_be_read,
    network_boot_may_be_starting,
)
from gpufleet.gate.drivers import BmcFactory, redfish_bmcs
from gpufleet.gate.fence import Fence, StaticFence
from gpufleet.gate.outcomes import Done, Failed, Held, Outcome, Refused, Stale
from gpufleet.kubeapi import NODES, SECRETS, ApiError, Conflict, KubePort, NotFound
from gpufleet.kubeapi.machines import MACHINES
from gpufleet.kubeapi.secrets import decode_data
from gpufleet.remediate import machine_power, redfish, steps
from gpufleet.remediate.bmc_tls import BmcTls
from gpufleet.remediate.evidence import ActionMark
from gpufleet.remediate.identity import ExpectedIdentity

log = logging.getLogger("gpufleet.gate")

Json = dict[str, Any]
Keys = Callable[[], Sequence[nodedata.SigningKey]]
"""The controller's signing keys as they are now (the first signs; empty: none loaded)."""


@dataclass(frozen=True)
class GateSettings:
    """How the gate asks and waits. Every field has a default suited to production."""

    lease_margin_s: float = 15.0
    """An act is started only if the lease holds this much longer: more than one
    BMC request can take (its timeout), so no act outlives the lease."""
    probe_timeout_s: float = 20.0
    """Longest wait for the Slurm syncer's answer to a probe."""
    probe_poll_s: float = 0.25
    """How often the Node is read while waiting for that answer."""
    conflict_retries: int = 5
    """Re-reads of a Node after a 409 on the mark or request write."""
    settle_s: float = steps.SETTLE_S
    graceful_settle_s: float = steps.GRACEFUL_SETTLE_S


class _NotEmpty(Exception):
    """The node is not proven empty (a pod, a Slurm job, Slurm silent)."""


class _HoldOn(Exception):
    """Not now, for a reason that is not the node's work (lease, rails, a concurrent writer)."""


class _Moved(Exception):
    """The record no longer asks for this act."""


class Gate:
    """Every disruptive act, asked of one object that alone holds the BMC drivers."""

    def __init__(
        self,
        kube: KubePort,
        bmcs: BmcFactory,
        *,
        fence: Fence,
        keys: Keys,
        clock: Clock,
        settings: GateSettings | None = None,
    ) -> None:
        self._kube = kube
        self._bmcs = bmcs
        self._fence = fence
        self._keys = keys
        self._clock = clock
        self.settings = settings or GateSettings()

    @classmethod
    def for_operator(
        cls, kube: KubePort, *, by: str, clock: Clock, ca_file: str | None = None
    ) -> Gate:
        """The gate of a person's own command (``gpufleet machines power-on``): real BMCs,
        no lease (a person is not a replica) and no record key (it powers machines with
        no Node only, so no record is involved)."""
        bmcs = redfish_bmcs(ca_file=ca_file)
        return cls(kube, bmcs, fence=StaticFence(by), keys=lambda: (), clock=clock)

    # ------------------------------------------------------------ BMC steps

    async def bmc_step(
        self,
        name: str,
        attempt: steps.Attempt,
        *,
        policy: Policy,
        prepare: Callable[[Json], Awaitable[None]] | None = None,
    ) -> Outcome:
        """Carry out (or resume) one BMC attempt of a node, if and only if it may go ahead.

        ``prepare`` runs with the Node once the node is proven empty and before the
        BMC is touched, only on a fresh run (a reimage's new join token).
        """
        try:
            body, record = await self._admit(name, policy)
            if attempt_in_progress(record) != attempt:
                return Stale(f"{attempt.step} attempt {attempt.attempt} is not in progress")
            mark = self._mark(body, attempt)
            creds = await self._credentials(body)
            expected = await self._expected_identity(body, creds.endpoint)
            inc = record.incident
            assert inc is not None  # an attempt in progress has an incident

            async def prove() -> None:
                await self._prove(name, record, policy)

            async def ready() -> None:
                if prepare is not None:
                    await prepare(body)

            async def slurm_again() -> None:
                await self._prove_slurm(name, record, policy)

            journal = _MarkJournal(self, name, attempt, resumed=mark, slurm=slurm_again)
            async with self._bmcs(creds, name) as bmc:
                try:
                    detail = await steps.run_bmc_step(
                        attempt.step,
                        bmc,
                        attempt=attempt,
                        journal=journal,
                        expected=expected,
                        mark=mark,
                        prepare=ready,
                        prove=prove,
                        clock=self._clock.now,
                        settle_s=self.settings.settle_s,
                        graceful_settle_s=self.settings.graceful_settle_s,
                    )
                except (_NotEmpty, _HoldOn, _Moved):
                    if attempt.step is Step.REIMAGE and not journal.posted:
                        # A reimage sets its one-time network boot before its mark: given
                        # up before the POST, it must not leave the boot armed (0143).
                        with contextlib.suppress(redfish.RedfishError):
                            await bmc.clear_one_time_boot()
                    raise
        except _NotEmpty as exc:
            return Refused(str(exc))
        except _HoldOn as exc:
            return Held(str(exc))
        except _Moved as exc:
            return Stale(str(exc))
        except steps.BmcIdentityMismatch as exc:
            return Failed(str(exc), identity=True)
        except (redfish.RedfishError, ApiError) as exc:
            return Failed(str(exc))
        return Done(detail)

    async def disarm(self, name: str, attempt: steps.Attempt, *, boot_window_s: float) -> bool:
        """Remove a reimage's one-time network boot that its attempt left armed.

        An attempt that ended without its reset (a timeout, a crash between the
        override and the POST) must not leave the machine set to network-boot at
        the next power action, by anyone (docs/decisions/0143). Returns whether the
        BMC was reached. Not disruptive: no proof; the lease, since a replica that
        lost it could remove the boot the next holder's reimage just set. The mark of the
        attempt is removed afterwards.

        One whose reset went out is kept while the machine may be starting from it
        (:func:`~gpufleet.gate.attempts.network_boot_may_be_read`, at most
        ``boot_window_s`` after the POST): removing it then would boot the old disk
        (decision 0255). Returns False then, so the mark stays and a later sweep asks
        again; once the firmware used the override the BMC shows none, and the mark goes.
        """
        try:
            self._check_fence()  # a replica that lost the lease could cancel the next one's
            body = await self._kube.get(NODES, name)
            try:
                record: NodeRecord | None = self._trusted_record(body)
            except _HoldOn:
                record = None  # nothing in progress can be told: an armed boot is the risk
            if attempt_in_progress(record) == attempt or network_boot_may_be_starting(record):
                # Judged on the Node as it is now, not on a cached copy: the attempt is
                # still under way, or its machine may still be reading the boot (0177).
                log.info("node=%s one-time boot of %s kept: still in use", name, attempt.step)
                return False
            text, trust = nodedata.read_mark_text(body, self._keys())
            mark = ActionMark.from_json(text) if trust is nodedata.Trust.SIGNED else None
            if mark is not None and not mark.binds(
                attempt.step.value, attempt.attempt, attempt.started_at
            ):
                mark = None  # another attempt's: says nothing of this one's reset
            creds = await self._credentials(body)
            async with self._bmcs(creds, name) as bmc:
                if mark is not None and mark.reset_type != steps.NETWORK_BOOT:
                    armed = await bmc.one_time_boot()
                    if armed is not None and network_boot_may_be_read(
                        mark,
                        armed,
                        await bmc.evidence(),
                        now=self._clock.now(),
                        window_s=boot_window_s,
                    ):
                        log.info(
                            "node=%s one-time boot of %s kept: the machine may be starting "
                            "from its %s",
                            name,
                            attempt.step,
                            mark.reset_type,
                        )
                        return False
                await bmc.clear_one_time_boot()
        except (redfish.RedfishError, ApiError, _HoldOn) as exc:
            log.warning("node=%s one-time boot of %s not cleared yet: %s", name, attempt.step, exc)
            return False
        log.info("node=%s one-time network boot of %s cleared", name, attempt.step)
        return True

    async def clear_mark(self, name: str, attempt: steps.Attempt) -> None:
        """Remove the mark of a finished attempt (best effort, compare-and-swap)."""
        try:
            body = await self._kube.get(NODES, name)
        except ApiError:
            return
        text, _ = nodedata.read_mark_text(body, self._keys())
        mark = ActionMark.from_json(text)
        if mark is None or not mark.binds(attempt.step.value, attempt.attempt, attempt.started_at):
            return
        await self._clear_mark(name, body)

    # ------------------------------------------------------- agent requests

    async def agent_request(
        self, name: str, kind: conditions.RequestKind, *, policy: Policy
    ) -> Outcome:
        """Write the agent request (``gpu-reset`` or ``command``) the record asks for now.

        The request is derived from the signed record (its id and binding), written
        by compare-and-swap only after the node is proven empty; the agent checks
        the binding and the node's work again before it acts (decision 0074).
        """
        try:
            body, record = await self._admit(name, policy)
            wanted = _request_for(record, kind)
            if wanted is None:
                return Stale(f"the record asks for no {kind} now ({record.state})")
            current = conditions.decode_request(
                ((body.get("metadata") or {}).get("annotations") or {}).get(
                    well_known.ANNOTATION_AGENT_REQUEST
                )
            )
            if current is not None and current.id == wanted.id:
                return Done(f"request {wanted.id} already on the node")
            await self._prove(name, record, policy)
            await self._write_request(name, record, wanted)
        except _NotEmpty as exc:
            return Refused(str(exc))
        except _HoldOn as exc:
            return Held(str(exc))
        except _Moved as exc:
            return Stale(str(exc))
        except ApiError as exc:
            return Held(f"the request was not written: {exc}")
        return Done(f"{kind} request {wanted.id} written")

    async def _write_request(
        self, name: str, record: NodeRecord, wanted: conditions.AgentRequest
    ) -> None:
        for _ in range(self.settings.conflict_retries):
            body = await self._kube.get(NODES, name)
            fresh = self._trusted_record(body)
            if _request_for(fresh, wanted.kind) != wanted:
                raise _Moved("the record changed before the request was written")
            self._check_fence()
            patch = {
                "metadata": {
                    "resourceVersion": body["metadata"].get("resourceVersion"),
                    "annotations": {well_known.ANNOTATION_AGENT_REQUEST: wanted.encode()},
                }
            }
            try:
                await self._kube.patch(NODES, name, patch)
            except Conflict:
                continue
            log.info("node=%s %s request %s written through the gate", name, wanted.kind, wanted.id)
            return
        raise _HoldOn("the Node kept changing while the request was written")

    # --------------------------------------------------------- machine boots

    async def network_boot(
        self,
        store: machine_power.MachineStore,
        machine: str,
        *,
        by: str,
        now: float,
        attempt: int = 1,
        why: str = "",
        policy: Policy | None = None,
    ) -> machine_power.PowerOn:
        """Power a machine with no Node on (or restart it) to boot once from the network.

        ``policy``: the rails of an automated retry (the boot watchdog): nothing while
        the policy is paused or in dry-run, nothing without the lease. An operator's
        command passes none. Raises :class:`~gpufleet.remediate.machine_power.PowerRefused`
        when the machine has a Node (its power belongs to the Node's lifecycle) or
        a rail holds; otherwise what :func:`machine_power.network_boot` raises.
        """
        if policy is not None:
            if not self._fence.holds(self.settings.lease_margin_s):
                raise machine_power.PowerRefused("this replica does not hold the lease")
            if policy.paused or policy.dry_run:
                held = "paused" if policy.paused else "in dry-run"
                raise machine_power.PowerRefused(f"the policy is {held}")
        node = await self._node_of_machine(store, machine)
        if node is not None:
            raise machine_power.PowerRefused(
                f"Machine {machine} has joined as Node {node}: its power belongs to the "
                "Node's lifecycle (drain, budget, remediation ladder)"
            )
        return await machine_power.network_boot(
            store, machine, open_bmc=self._bmcs, by=by, now=now, attempt=attempt, why=why
        )

    async def _node_of_machine(self, store: machine_power.MachineStore, machine: str) -> str | None:
        """The machine's Node, read now: named in its status, named like it, or labelled."""
        body = await store.machine(machine)
        named = str((body.get("status") or {}).get("node") or "")
        if named:
            return named
        try:
            node = await self._kube.get(NODES, machine)
        except NotFound:
            pass
        else:
            labels = (node.get("metadata") or {}).get("labels") or {}
            if labels.get(well_known.LABEL_MACHINE) in (None, machine):
                return machine
        listing = await self._kube.list(
            NODES, label_selector=f"{well_known.LABEL_MACHINE}={machine}"
        )
        for item in listing.items:
            return str(item["metadata"]["name"])
        return None

    # ------------------------------------------------------------- the checks

    async def _admit(self, name: str, policy: Policy) -> tuple[Json, NodeRecord]:
        """The lease, the rails, then the Node read now with a record the key signed."""
        self._check_fence()
        if policy.paused:
            raise _HoldOn("the policy is paused")
        if policy.dry_run:
            raise _HoldOn("dry-run: nothing is done")
        try:
            body = await self._kube.get(NODES, name)
        except NotFound:
            raise _Moved(f"Node {name} is gone") from None
        return body, self._trusted_record(body)

    def _check_fence(self) -> None:
        if not self._fence.holds(self.settings.lease_margin_s):
            raise _HoldOn(f"{self._fence.holder} does not hold the controller's lease")

    def _trusted_record(self, body: Mapping[str, Any]) -> NodeRecord:
        keys = self._keys()
        if not keys:
            raise _HoldOn("the record signing key is not loaded: no record can be trusted")
        stored = nodedata.read_record(body, keys)
        if stored.trust is not nodedata.Trust.SIGNED or stored.record is None:
            raise _HoldOn(
                f"the record on the Node is not trusted: {stored.problem or stored.trust}"
            )
        return stored.record

    async def _prove(self, name: str, record: NodeRecord, policy: Policy) -> None:
        """Raise :class:`_NotEmpty` unless Kubernetes and Slurm both say the node is empty now."""
        holding = await proof.pods_holding(self._kube, name)
        if holding:
            raise _NotEmpty(f"{len(holding)} pod(s) on the node: {', '.join(holding[:5])}")
        why = await self._prove_slurm(name, record, policy)
        # The pods again: the probe took a moment, and a pod may have been bound meanwhile.
        holding = await proof.pods_holding(self._kube, name)
        if holding:
            raise _NotEmpty(f"{len(holding)} pod(s) on the node: {', '.join(holding[:5])}")
        log.info("node=%s proven empty: no pod; %s", name, why)

    async def _prove_slurm(self, name: str, record: NodeRecord, policy: Policy) -> str:
        """Raise :class:`_NotEmpty` unless Slurm says, now, that the node runs nothing."""
        inc = record.incident
        verdict = await proof.slurm_verdict(
            self._kube,
            name,
            incident=inc.opened_at if inc is not None else None,
            mode=policy.drain.slurm,
            if_silent=inc.if_slurm_silent if inc is not None else SlurmSilence.WAIT,
            clock=self._clock,
            timeout_s=self.settings.probe_timeout_s,
            poll_s=self.settings.probe_poll_s,
        )
        if not verdict.empty:
            raise _NotEmpty(verdict.why)
        return verdict.why

    def _mark(self, body: Mapping[str, Any], attempt: steps.Attempt) -> ActionMark | None:
        """This attempt's mark on the Node, if the key signed it. A mark for this attempt
        that cannot be trusted leaves unknown whether a reset was posted: fail closed."""
        text, trust = nodedata.read_mark_text(body, self._keys())
        if text is None:
            return None
        mark = ActionMark.from_json(text)
        if mark is None or trust is not nodedata.Trust.SIGNED:
            if mark is not None and not mark.binds(
                attempt.step.value, attempt.attempt, attempt.started_at
            ):
                return None  # an older attempt's: nothing to say about this one
            raise redfish.BmcRejected(
                str(body["metadata"]["name"]),
                f"the {well_known.ANNOTATION_BMC_ACTION} annotation cannot be trusted "
                f"({trust.value}), so whether a reset was posted is unknown: nothing posted",
            )
        return mark if mark.binds(attempt.step.value, attempt.attempt, attempt.started_at) else None

    async def _credentials(self, body: Mapping[str, Any]) -> redfish.BmcCredentials:
        """The node's BMC credentials, from the Secret its annotation names."""
        name = str(body["metadata"]["name"])
        ref = str(
            ((body.get("metadata") or {}).get("annotations") or {}).get(
                well_known.ANNOTATION_BMC_SECRET, ""
            )
        )
        ns, sep, secret = ref.partition("/")
        if not sep or not ns or not secret:
            raise redfish.BmcRejected(
                name,
                f"the Node has no {well_known.ANNOTATION_BMC_SECRET} annotation (namespace/name)",
            )
        data = decode_data(await self._kube.get(SECRETS, secret, namespace=ns))
        try:
            return redfish.BmcCredentials(
                data["endpoint"],
                data["username"],
                data["password"],
                tls=BmcTls.from_secret(data, ref),
            )
        except KeyError as exc:
            raise redfish.BmcRejected(name, f"Secret {ref} lacks the key {exc}") from None

    async def _expected_identity(self, body: Mapping[str, Any], endpoint: str) -> ExpectedIdentity:
        """What the node's BMC must say about itself. A Machine that cannot be read
        makes the identity unverifiable (``machine_error``): no power action."""
        node = str(body["metadata"]["name"])
        labels = (body.get("metadata") or {}).get("labels") or {}
        machine = labels.get(well_known.LABEL_MACHINE)
        uuid = str(((body.get("status") or {}).get("nodeInfo") or {}).get("systemUUID") or "")
        base = ExpectedIdentity(node=node, endpoint=endpoint, system_uuid=uuid or None)
        if not machine:
            return base
        try:
            obj = await self._kube.get(MACHINES, str(machine))
        except NotFound:
            error = f"the Node names Machine {machine}, which does not exist"
        except ApiError as exc:
            error = f"Machine {machine} could not be read: {exc}"
        else:
            spec = obj.get("spec") or {}
            return ExpectedIdentity(
                node=node,
                machine=str(machine),
                serial=str(spec.get("serial") or "") or None,
                machine_endpoint=str((spec.get("bmc") or {}).get("endpoint") or "") or None,
                endpoint=endpoint,
                system_uuid=uuid or None,
            )
        return ExpectedIdentity(
            node=node,
            machine=str(machine),
            machine_error=error,
            endpoint=endpoint,
            system_uuid=uuid or None,
        )

    async def _clear_mark(self, name: str, body: Mapping[str, Any]) -> None:
        patch = {
            "metadata": {
                "resourceVersion": body["metadata"].get("resourceVersion"),
                "annotations": {
                    well_known.ANNOTATION_BMC_ACTION: None,
                    well_known.ANNOTATION_BMC_ACTION_SIGNATURE: None,
                },
            }
        }
        try:
            await self._kube.patch(NODES, name, patch)
        except ApiError as exc:
            log.debug("node=%s bmc-action mark kept: %s", name, exc)


class _MarkJournal:
    """The write-ahead mark, by compare-and-swap, with the gate's last checks around it.

    Before each POST: the lease, the record still asking for this attempt, no mark
    for it by another writer, then the mark written with the Node's
    ``resourceVersion`` (a 409 re-reads and checks again), then the pods once more
    and the lease once more. Only then does ``steps`` send the POST.
    """

    def __init__(
        self,
        gate: Gate,
        name: str,
        attempt: steps.Attempt,
        *,
        resumed: ActionMark | None,
        slurm: Callable[[], Awaitable[None]],
    ) -> None:
        self._gate = gate
        self._slurm = slurm
        """Asks Slurm again after the mark (an admin's resume and a job since the proof)."""
        self._name = name
        self._attempt = attempt
        self._own: set[float] = {resumed.posted_at} if resumed is not None else set()
        """``posted_at`` of the marks for this attempt that this run wrote or took up."""
        self.posted = resumed is not None and resumed.reset_type != steps.NETWORK_BOOT
        """Whether a POST of this attempt may have gone out (a reset's mark was let through)."""

    async def write(self, mark: ActionMark) -> None:
        gate, name, attempt = self._gate, self._name, self._attempt
        keys = gate._keys()
        if not keys:
            raise _HoldOn("the record signing key is not loaded")
        for _ in range(gate.settings.conflict_retries):
            gate._check_fence()
            body = await gate._kube.get(NODES, name)
            record = gate._trusted_record(body)
            if attempt_in_progress(record) != attempt:
                raise _Moved(f"{attempt.step} attempt {attempt.attempt} is no longer in progress")
            text, _ = nodedata.read_mark_text(body, keys)
            existing = ActionMark.from_json(text)
            if (
                existing is not None
                and existing.binds(attempt.step.value, attempt.attempt, attempt.started_at)
                and existing.posted_at not in self._own
            ):
                raise _HoldOn(
                    f"another writer marked {attempt.step} attempt {attempt.attempt} "
                    f"({existing.reset_type}): not posted by this one"
                )
            patch = {
                "metadata": {
                    "resourceVersion": body["metadata"].get("resourceVersion"),
                    "annotations": nodedata.mark_annotations(name, mark.to_json(), keys[0]),
                }
            }
            try:
                written = await gate._kube.patch(NODES, name, patch)
            except Conflict:
                continue
            self._own.add(mark.posted_at)
            break
        else:
            raise _HoldOn("the Node kept changing while the mark was written")
        log.info(
            "node=%s bmc-action %s attempt %d: %s posting",
            name,
            mark.step,
            mark.attempt,
            mark.reset_type,
        )
        if mark.reset_type != "On":  # powering a machine that is off on disrupts nothing
            if mark.reset_type != steps.NETWORK_BOOT:
                try:  # the proof came before the mark: Slurm is asked again, last
                    await self._slurm()
                except _NotEmpty as exc:
                    await gate.clear_mark(name, attempt)  # read again: the probe wrote the Node
                    raise _NotEmpty(f"{exc} (asked again before the POST); nothing posted") from exc
            holding = await proof.pods_holding(gate._kube, name)
            if holding:
                await gate._clear_mark(name, written)
                raise _NotEmpty(
                    f"{len(holding)} pod(s) landed on the node before the POST: "
                    f"{', '.join(holding[:5])}; the mark is removed, nothing posted"
                )
        gate._check_fence()
        if mark.reset_type != steps.NETWORK_BOOT:
            self.posted = True


def _request_for(
    record: NodeRecord, kind: conditions.RequestKind
) -> conditions.AgentRequest | None:
    """The request of ``kind`` the record asks for now (derived: same record, same id)."""
    if kind == "gpu-reset":
        inc = record.incident
        if (
            record.state is not NodeState.REMEDIATING
            or inc is None
            or inc.current is not Step.GPU_RESET
            or attempt_in_progress(record) is None
        ):
            return None
        return agent_requests.issue(record, "gpu-reset", gpu_index=_gpu_of(record))
    if kind == "command":
        if agent_requests.request_id(record) is None or record.state is not NodeState.MAINTENANCE:
            return None
        inc = record.incident
        timeout = (
            None if inc is None or inc.command_timeout_s is None else int(inc.command_timeout_s)
        )
        return agent_requests.issue(record, "command", timeout_s=timeout)
    return None


def _gpu_of(record: NodeRecord) -> int | None:
    """The GPU the incident's fault named (``gpuN`` scope), for a GPU reset."""
    inc = record.incident
    if inc is None:
        return None
    for occ in reversed(record.occurrences):
        if occ.key == inc.key and occ.scope.startswith("gpu") and occ.scope[3:].isdigit():
            return int(occ.scope[3:])
    return None
