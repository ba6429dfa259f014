"""The agent loop: poll, classify with the policy, debounce, report.

Every ``interval`` seconds the agent polls its passive monitors once. Each
new fault occurrence is judged with :func:`gpufleet.domain.decide.respond`
(the same rule and repeat counting the lifecycle controller uses): an
occurrence that takes the node out feeds the subsystem's problem condition
(debounced with :mod:`gpufleet.domain.debounce`); every other occurrence
that the policy does not ignore becomes a Node Event only. Conditions are
written when they change (and re-asserted every ``resync`` seconds), in the
format of :mod:`gpufleet.domain.conditions`.

Active checks run on a schedule only while the node is idle, and stop
(between checks) when a workload appears. One exception: when the job telemetry
suspects silent data corruption on this node (replica groups whose weights
disagree with no majority, or a group's loss standing out), the ``sdc`` check runs
at once, beside the job (decision 0275); its result reports or clears.

The policy is the FleetPolicy the lifecycle controller obeys, followed through
the API (:mod:`gpufleet.health.fleet_policy`); until one was read the agent
fails closed: every occurrence raises its condition (decision 0162). A raised
condition is kept, with its evidence, until the controller has recorded it
(its ``gpufleet.io/faults-seen`` watermark, :func:`gpufleet.domain.debounce.recorded`),
and a new agent takes over the unrecorded conditions a previous one left on the
Node before it writes any condition (decision 0163).

The lifecycle controller asks the agent for work through the Node annotation
``gpufleet.io/agent-request`` (run a check profile for verification or
burn-in, reset a GPU); the agent answers with the ``gpufleet.io/agent-result``
annotation (:mod:`gpufleet.domain.node_reports`). A request is answered once:
the answer names the request id, so a restarted agent does not run it again.

The annotation is not obeyed blindly (decision 0074): before it acts, the
agent reads its Node again and carries out the request only if it is bound to
the decision in the node's lifecycle record (node, state, incident, attempt;
:func:`gpufleet.domain.agent_requests.refusal`) and nothing runs on the node:
no Kubernetes pod, no Slurm job, no GPU process, each of them known
(:func:`gpufleet.domain.agent_requests.work_refusal`). Otherwise it answers
"refused: <why>" (condition reason ``Refused``), writes a Warning Event
``RequestRefused`` and counts it; a legitimate request refused only because of
work is judged again every ``request_retry_s`` while it stays on the Node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpufleet.api import nodedata
from gpufleet.domain import (
    agent_requests,
    conditions,
    debounce,
    inventory,
    node_reports,
    policy_groups,
    well_known,
)
from gpufleet.domain.decide import policy_window, respond
from gpufleet.domain.faults import FaultEvent, Subsystem
from gpufleet.domain.maintenance import DEFAULT_COMMAND_TIMEOUT_S
from gpufleet.domain.policy import Detection, Policy, Response
from gpufleet.domain.profiles import SkuProfile
from gpufleet.domain.records import NodeRecord, Occurrence
from gpufleet.health import checks, maintenance_commands, sysfs
from gpufleet.health.fleet_policy import FleetPolicyFollower, fail_closed_detection
from gpufleet.health.hardware import Hardware, HardwareError, NoGpuFound
from gpufleet.health.metrics import AgentMetrics
from gpufleet.health.monitors import PassiveMonitors
from gpufleet.health.results import CheckStatus
from gpufleet.health.telemetry import JobTelemetry
from gpufleet.waits import wait_set

log = logging.getLogger(__name__)


REQUEST_PROFILES: dict[str, tuple[tuple[str, ...], int]] = {
    "verify": ((*checks.PASSIVE, "gemm", "sdc", "hbm", "allreduce"), 3),
    "burn-in": ((*checks.PASSIVE, "gemm", "sdc", "hbm", "allreduce"), 10),
}
"""Check profiles the controller may ask for: (checks, iterations per measurement)."""


class Reporter(Protocol):
    """Where conditions, annotations and Events go (Kubernetes, or a list in tests)."""

    async def set_conditions(
        self, reports: list[conditions.ConditionReport], now: float
    ) -> None: ...

    async def set_annotations(
        self, reports: list[node_reports.AnnotationReport], now: float
    ) -> None: ...

    async def event(
        self, fault: FaultEvent, *, reason: str, message: str, now: float, warning: bool = True
    ) -> None: ...


@runtime_checkable
class NodeSource(Protocol):
    """What the agent reads before it carries out a request (Kubernetes; a fake in
    unit tests). A reporter without it gets every request refused."""

    async def node_object(self) -> dict[str, Any]: ...

    async def pods_on_node(self) -> list[dict[str, Any]]: ...

    async def node_event(
        self,
        *,
        reason: str,
        message: str,
        now: float,
        first: float | None = None,
        warning: bool = True,
    ) -> None: ...


@dataclass
class AgentSettings:
    """How often the agent does what."""

    interval_s: float = 1.0
    """Passive poll period. 1 s keeps fault-to-condition latency under 2 s."""
    resync_s: float = 60.0
    """Conditions are re-written this often even without a change (heartbeat)."""
    active_every_s: float = 0.0
    """Period of idle-time active checks; 0 disables them."""
    active_checks: tuple[str, ...] = ("gemm", "sdc", "hbm", "allreduce")
    telemetry_every_s: float = 10.0
    """Period of reading job telemetry (straggler detection), when a directory is given."""
    request_retry_s: float = 15.0
    """A legitimate request refused because work ran on the node is judged again this
    often while it stays on the Node (the controller's step timeout bounds the wait)."""
    maintenance_commands: Path = maintenance_commands.DEFAULT_DIR
    """Where the maintenance commands a MaintenancePlan may name are installed."""
    node_read_s: float = 5.0
    """While a raised condition waits for the controller to record it (or the Node was
    never read), the Node is read at least this often (the watch of the Node brings
    the controller's watermark sooner; this bounds the wait if the watch is broken)."""
    ib_rediscover_s: float = 600.0
    """The InfiniBand leaf switches are asked again this often even when no port, HCA or
    subnet manager changed (a change asks at once; decision 0249)."""


@dataclass
class _Sub:
    state: debounce.ConditionState = field(default_factory=debounce.ConditionState)
    reported: conditions.ConditionReport | None = None


class Agent:
    """One node's agent."""

    def __init__(
        self,
        hw: Hardware,
        profile: SkuProfile,
        policy: Policy,
        *,
        node: str,
        reporter: Reporter | None,
        metrics: AgentMetrics | None = None,
        settings: AgentSettings | None = None,
        clock: Callable[[], float] = time.time,
        telemetry: JobTelemetry | None = None,
        policy_source: FleetPolicyFollower | None = None,
    ) -> None:
        self.hw = hw
        self.profile = profile
        self.policy = policy
        self._followed = policy
        """The fleet's policy as given or followed; :attr:`policy` is its resolution for
        this Node's labels (the override its labels match, domain.policy_groups)."""
        self._node_labels: dict[str, str] | None = None
        self.policy_source = policy_source
        self.policy_read = policy_source is None
        """Whether the policy is known: given (a file, tests) or a FleetPolicy was read.
        False: fail closed (every occurrence raises its condition)."""
        self.node = node
        self.reporter = reporter
        self.metrics = metrics
        self.settings = settings or AgentSettings()
        self.clock = clock
        self.monitors = PassiveMonitors(
            hw, profile, node=node, ib_rediscover_s=self.settings.ib_rediscover_s
        )
        self.telemetry = telemetry
        self._last_telemetry = float("-inf")
        self.subs: dict[Subsystem, _Sub] = {s: _Sub() for s in Subsystem}
        self.record = NodeRecord.new(node, at=clock())
        self._present: set[tuple[str, str]] = set()
        self._worthy: set[tuple[str, str]] = set()
        self._last_write = 0.0
        self._last_active = clock()
        self.last_results: list[Any] = []
        self._hardware: node_reports.AnnotationReport | None = None
        self._hardware_due: node_reports.AnnotationReport | None = None
        """The hardware annotation still to write (written with the next publish)."""
        self._recent: list[FaultEvent] = []
        self._found: list[FaultEvent] = []
        """Faults found by scheduled active checks (another thread), for the next poll."""
        self._found_lock = threading.Lock()
        """Recent occurrences with their evidence, to replay a repeat to the controller."""
        self._suspected: list[str] = []
        """Why job telemetry asks for the ``sdc`` check now (run by :meth:`check_suspected`)."""
        self._requests: asyncio.Queue[conditions.AgentRequest] | None = None
        self._handled: set[str] = set()
        self._retry_at: dict[str, float] = {}
        """Requests refused only because of work: when to judge them again."""
        self._refused: dict[str, str] = {}
        """The last refusal reported per request (an unchanged one is not reported again)."""
        self._offered: tuple[str | None, str | None] = (None, None)
        self._labels: dict[str, str | None] | None = None
        """The NVLink topology labels last written to the Node."""
        self._labels_due: dict[str, str | None] | None = None
        self._labels_retry_at = float("-inf")
        self._recorded: dict[str, float] | None = {} if isinstance(reporter, NodeSource) else None
        """The controller's watermark per condition type (``gpufleet.io/faults-seen``);
        None: no Kubernetes Node to read, no controller to wait for."""
        self._node_seen = False
        self._node_read_at = float("-inf")
        self._held_said: set[Subsystem] = set()

    # ------------------------------------------------------------------ policy

    def use_policy(self, policy: Policy) -> None:
        """Judge with ``policy`` from now on (the FleetPolicy follower calls this)."""
        first = not self.policy_read
        self._followed = policy
        self.policy = self._resolved()
        self.policy_read = True
        if self.telemetry is not None:
            self.telemetry.config = policy.detection.stragglers
        if self.metrics is not None:
            self.metrics.policy_read.labels(self.node).set(1)
        if first:
            log.info("node=%s FleetPolicy read: judging with it from now on", self.node)

    def _resolved(self) -> Policy:
        """The followed policy as it applies to this Node (its labels not read yet: the
        fleet's, the controller's judgement on the condition decides)."""
        if self._node_labels is None or not self._followed.overrides:
            return self._followed
        return policy_groups.policy_for(self._followed, self._node_labels).policy

    def detection(self) -> Detection:
        """The debounce in force: the policy's, or the fail-closed one before it is known."""
        return self.policy.detection if self.policy_read else fail_closed_detection()

    # ----------------------------------------------------------------- one poll

    def _judge(self, fault: FaultEvent, now: float) -> tuple[Response, bool]:
        """The policy's response to one occurrence, and whether it raises the condition:
        when it takes the node out, or always while the policy is not known (fail closed:
        the controller decides with its own policy what the condition does)."""
        window = _window(self.policy)
        occ = Occurrence(fault.key, fault.evidence.scope(), fault.at)
        keep = [o for o in self.record.occurrences if now - o.at < window]
        self.record = replace(self.record, occurrences=(*keep, occ))
        self._recent = [f for f in self._recent if now - f.at < window] + [fault]
        response, _why = respond(self.policy.rule_for(fault), fault, self.record, now)
        return response, response.takes_node_out or not self.policy_read

    def step(
        self, now: float
    ) -> tuple[list[conditions.ConditionReport], list[tuple[FaultEvent, Response]]]:
        """Poll once; returns changed conditions and new occurrences with their response."""
        snap = self.monitors.poll(now)
        if snap.labels is not None:  # a key left out of this poll's labels keeps its value
            merged = {**(self._labels or {}), **(self._labels_due or {}), **snap.labels}
            if merged != self._labels:
                self._labels_due = merged
        self._read_telemetry(now)
        self._add_found(snap, now)
        if self.metrics is not None:
            self.metrics.observe(snap)
        changed: list[conditions.ConditionReport] = []
        events: list[tuple[FaultEvent, Response]] = []
        present: set[tuple[str, str]] = set()
        resync = now - self._last_write >= self.settings.resync_s
        for sub, obs in snap.observations.items():
            worthy_state: list[FaultEvent] = []
            worthy_instant: list[FaultEvent] = []
            for fault, instant in [(f, False) for f in obs.faults] + [
                (f, True) for f in obs.instant
            ]:
                ident = (fault.key, fault.evidence.scope())
                if not instant:
                    present.add(ident)
                    if ident in self._present:  # still there: not a new occurrence
                        if ident in self._worthy:
                            worthy_state.append(fault)
                        continue
                response, raises = self._judge(fault, now)
                if response is not Response.IGNORE or raises:
                    events.append((fault, response))
                if raises:
                    (worthy_instant if instant else worthy_state).append(fault)
                    if instant:  # the earlier occurrences that made a repeat rule fire
                        worthy_instant.extend(
                            f for f in self._recent if f.key == fault.key and f is not fault
                        )
                    if not instant:
                        self._worthy.add(ident)
            o = debounce.Observation(
                now, tuple(worthy_state), tuple(worthy_instant), obs.readable, obs.unreadable_reason
            )
            entry = self.subs[sub]
            ctype = well_known.CONDITIONS[sub]
            recorded = None if self._recorded is None else self._recorded.get(ctype, float("-inf"))
            entry.state = debounce.observe(entry.state, o, self.detection(), recorded)
            self._say_held(sub, entry.state, recorded, now)
            report = _report(sub, entry.state)
            # No "not a problem" before the Node was read: it may carry a condition a
            # previous agent raised that the controller has not recorded (offer_node).
            unsure = self._recorded is not None and not self._node_seen
            if (report != entry.reported or resync) and not (unsure and report.status != "True"):
                entry.reported = report
                changed.append(report)
            if self.metrics is not None:
                self.metrics.condition.labels(self.node, report.type).set(
                    int(report.status == "True")
                )
        self._present = present
        self._worthy &= present
        hardware = self.hardware_report()
        if hardware is not None and (hardware != self._hardware or resync):
            self._hardware = hardware
            self._hardware_due = hardware
        if changed:
            self._last_write = now
        return changed, events

    # ---------------------------------------------------------------- the loop

    async def publish(
        self,
        changed: list[conditions.ConditionReport],
        events: list[tuple[FaultEvent, Response]],
        now: float,
    ) -> None:
        if self.reporter is None:
            return
        for fault, response in events:
            judged = (
                f"policy: {response.value}"
                if self.policy_read
                else "policy not read yet: raised (fail closed)"
            )
            msg = f"{fault.describe()}: {fault.evidence.summary()} ({judged})"
            try:
                await self.reporter.event(
                    fault, reason=conditions.reason_of(fault), message=msg, now=now, warning=True
                )
            except Exception as exc:  # reporting must never stop monitoring
                log.warning("node=%s event not written: %s", self.node, exc)
        if changed:
            try:
                await self.reporter.set_conditions(changed, now)
            except Exception as exc:
                log.warning("node=%s conditions not written: %s", self.node, exc)
                for sub in self.subs.values():  # write again on the next poll
                    if sub.reported in changed:
                        sub.reported = None
        if self._hardware_due is not None:
            try:
                await self.reporter.set_annotations([self._hardware_due], now)
                self._hardware_due = None
            except Exception as exc:  # written again on the next poll
                log.warning("node=%s hardware annotation not written: %s", self.node, exc)
        await self._publish_labels()

    async def _publish_labels(self) -> None:
        """Write the topology labels (NVLink clique, InfiniBand leaf) when they changed
        (a reporter without ``set_labels``, as in unit tests, keeps them in memory only)."""
        due, set_labels = self._labels_due, getattr(self.reporter, "set_labels", None)
        if due is None or set_labels is None or self.clock() < self._labels_retry_at:
            return
        try:
            await set_labels(due)
        except Exception as exc:  # tried again after resync_s, not on every poll
            log.warning("node=%s topology labels not written: %s", self.node, exc)
            self._labels_retry_at = self.clock() + self.settings.resync_s
            return
        self._labels, self._labels_due = due, None

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set."""
        log.info(
            "node=%s agent started backend=%s sku=%s", self.node, self.hw.name, self.profile.name
        )
        self._requests = asyncio.Queue()
        if self.metrics is not None:
            self.metrics.policy_read.labels(self.node).set(int(self.policy_read))
        if not self.policy_read:
            log.warning(
                "node=%s no FleetPolicy read yet: every fault raises its condition (fail closed)",
                self.node,
            )
        await self._read_node(self.clock())
        tasks: list[asyncio.Task[None]] = []
        watch = getattr(self.reporter, "watch_requests", None)
        if watch is not None:
            tasks.append(asyncio.create_task(watch(self.offer_node)))
        if self.policy_source is not None:
            tasks.append(asyncio.create_task(self.policy_source.run(self._use_followed)))
        try:
            await self._loop(stop)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        log.info("node=%s agent stopped", self.node)

    def _use_followed(self, policy: Policy) -> None:
        self.use_policy(policy)
        self._policy_metrics()

    def _policy_metrics(self) -> None:
        if self.metrics is None or self.policy_source is None:
            return
        self.metrics.policy_valid.labels(self.node).set(int(self.policy_source.valid is True))

    # ------------------------------------------- what the controller recorded

    def offer_node(self, body: dict[str, Any]) -> None:
        """Called with this Node on every change (the watch) and on each read: the
        controller's watermark, a previous agent's unrecorded conditions (first time
        only), and the request annotation."""
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        recorded = conditions.faults_recorded(annotations.get(well_known.ANNOTATION_FAULTS_SEEN))
        if self._recorded is not None:
            self._recorded = recorded
        labels = dict((body.get("metadata") or {}).get("labels") or {})
        if labels != self._node_labels:
            self._node_labels = labels
            if self._followed.overrides:
                self.policy = self._resolved()
        if not self._node_seen:
            self._node_seen = True
            self._take_over(body, recorded)
        self.offer_request(*request_view(body))

    def _take_over(self, body: dict[str, Any], recorded: dict[str, float]) -> None:
        """Carry the raised conditions a previous agent left on the Node, as far as the
        controller has not recorded them, into this agent's state (kept until it has)."""
        now = self.clock()
        name = str((body.get("metadata") or {}).get("name") or self.node)
        for cond in (body.get("status") or {}).get("conditions") or []:
            ctype = str(cond.get("type", ""))
            sub = conditions.subsystem_of(ctype)
            if sub is None:
                continue
            faults = conditions.faults_of(
                name, ctype, str(cond.get("status", "")), str(cond.get("message", ""))
            )
            mark = recorded.get(ctype, float("-inf"))
            if not any(f.at > mark for f in faults):
                continue
            entry = self.subs[sub]
            entry.state = debounce.adopt(entry.state, faults, now)
            entry.reported = None  # written again, as it stands, by the next poll
            log.warning(
                "node=%s %s=True taken over from the Node: %d occurrence(s) the controller "
                "has not recorded yet",
                self.node,
                ctype,
                len(faults),
            )

    async def _read_node(self, now: float) -> None:
        """Read the Node (best effort) when it was never read, or while a raised condition
        waits for the controller's record, at most every ``node_read_s``."""
        source = self.reporter
        if (
            not isinstance(source, NodeSource)
            or now - self._node_read_at < self.settings.node_read_s
        ):
            return
        waiting = not self._node_seen or any(
            e.state.problem
            and not debounce.recorded(
                e.state, (self._recorded or {}).get(well_known.CONDITIONS[s], float("-inf"))
            )
            for s, e in self.subs.items()
        )
        if not waiting:
            return
        self._node_read_at = now
        try:
            body = await source.node_object()
        except Exception as exc:
            log.warning("node=%s own Node not read: %s", self.node, exc)
            return
        self.offer_node(body)

    def _say_held(
        self, sub: Subsystem, state: debounce.ConditionState, recorded: float | None, now: float
    ) -> None:
        """Log once when a raised condition is kept only because the controller has not
        recorded it (its quiet time is over)."""
        cleared_at = debounce.clears_at(state, self.detection())
        held = (
            cleared_at is not None and now >= cleared_at and not debounce.recorded(state, recorded)
        )
        if held and sub not in self._held_said:
            self._held_said.add(sub)
            log.warning(
                "node=%s %s kept raised: the controller has not recorded its faults yet",
                self.node,
                well_known.CONDITIONS[sub],
            )
        elif not held:
            self._held_said.discard(sub)

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = self.clock()
            changed, events = self.step(now)
            for fault, response in events:
                log.info(
                    "node=%s fault=%s response=%s evidence=%s",
                    self.node,
                    fault.describe(),
                    response.value,
                    fault.evidence.summary(),
                )
            await self.publish(changed, events, now)
            await self._read_node(self.clock())
            self._policy_metrics()
            self._retry_due(now)
            await self._serve_requests()
            if self._suspected:
                await asyncio.to_thread(self.check_suspected, self.clock())
            if self._active_due(now):
                await asyncio.to_thread(self.run_active, now)
            await wait_set(stop, self.settings.interval_s)

    def hardware_report(self) -> node_reports.AnnotationReport | None:
        """The ``gpufleet.io/hardware`` annotation: GPU model and count, HCA count.

        The lifecycle controller compares it with the Machine inventory when the
        node joins. No GPU driver or no InfiniBand class counts as zero (a node
        that should have them then goes to triage, which is right); any other
        read error gives no report: none is better than a wrong one (the node
        waits in provisioning).
        """
        try:
            gpus = self.hw.gpus()
        except NoGpuFound:
            gpus = []
        except HardwareError:
            return None
        ports = sysfs.read_ib_ports(self.hw.sysfs_root) or []
        observed = inventory.Hardware(
            gpu_model=str(gpus[0].get("name", "")) if gpus else "",
            gpu_count=len(gpus),
            hca_count=len({p.hca for p in ports}),
        )
        return node_reports.hardware(observed)

    # ------------------------------------------------------ controller requests

    def offer_request(self, annotation: str | None, answered: str | None) -> None:
        """Called on every change of this Node: queue a request not yet answered."""
        self._offered = (annotation, answered)
        req = conditions.decode_request(annotation)
        if req is None or req.id == answered or req.id in self._handled:
            return
        self._handled.add(req.id)
        self._retry_at.pop(req.id, None)
        if self._requests is None:
            self._requests = asyncio.Queue()
        self._requests.put_nowait(req)

    def _retry_due(self, now: float) -> None:
        """Offer again a request refused only because of work, once its retry is due."""
        due = [rid for rid, at in self._retry_at.items() if now >= at]
        for rid in due:
            del self._retry_at[rid]
            self._handled.discard(rid)
        if due:
            self.offer_request(*self._offered)

    def gpu_busy(self) -> bool | None:
        """Whether processes use the GPUs; None when that cannot be read (callers
        count it as busy: an unreadable NVML never makes a node look idle)."""
        try:
            return bool(self.hw.busy())
        except HardwareError as exc:
            log.warning("node=%s GPU processes unreadable: %s", self.node, exc)
            return None

    async def refusal(self, req: conditions.AgentRequest) -> tuple[str, bool] | None:
        """Why ``req`` must not be carried out now, and whether to judge it again
        later (only when it is legitimate and work is in the way); None: go ahead.

        Reads the Node and its pods fresh: the watch event that offered the
        request may be older than the record it must match.
        """
        source = self.reporter
        if not isinstance(source, NodeSource):
            return "this agent cannot read its Node (no Kubernetes connection)", False
        try:
            body = await source.node_object()
        except Exception as exc:
            return f"the Node could not be read ({exc}); failing closed", True
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        # The codec cannot verify the record's signature here (only the controller holds the
        # key): the admission policy lets only the controller's account write it (0144).
        record = nodedata.trusted_record(body)
        why = agent_requests.refusal(req, self.node, record)
        if why is not None:
            return why, False
        pods: list[dict[str, Any]] | None
        try:
            pods = await source.pods_on_node()
        except Exception as exc:
            log.warning("node=%s pods on the node could not be listed: %s", self.node, exc)
            pods = None
        busy = await asyncio.to_thread(self.gpu_busy)
        why = agent_requests.work_refusal(
            req,
            pods=pods,
            slurm_work=annotations.get(well_known.ANNOTATION_SLURM_WORK),
            gpu_busy=busy,
        )
        return None if why is None else (why, True)

    async def _refuse(self, req: conditions.AgentRequest, why: str, retry: bool) -> None:
        """Answer a refusal: condition, Warning Event, metric (each once per reason)."""
        now = self.clock()
        if retry:
            self._retry_at[req.id] = now + self.settings.request_retry_s
        if self.metrics is not None:
            self.metrics.requests.labels(self.node, req.kind, "refused").inc()
        if self._refused.get(req.id) == why:
            return
        log.warning("node=%s request=%s kind=%s refused: %s", self.node, req.id, req.kind, why)
        self._refused[req.id] = why
        if self.reporter is None:
            return
        try:
            await self.reporter.set_annotations([node_reports.refusal(req.id, why)], now)
        except Exception as exc:
            log.warning("node=%s refusal of %s not written: %s", self.node, req.id, exc)
            self._refused.pop(req.id, None)
        if isinstance(self.reporter, NodeSource):
            try:
                await self.reporter.node_event(
                    reason=conditions.EVENT_REQUEST_REFUSED,
                    message=f"{req.kind} request {req.id} refused: {why}",
                    now=now,
                )
            except Exception as exc:
                log.warning("node=%s refusal Event not written: %s", self.node, exc)

    def handle_request(self, req: conditions.AgentRequest) -> conditions.AgentResult:
        """Carry out one request (blocking: checks take seconds to minutes).

        Only after :meth:`refusal` said yes: this method does not check.
        """
        log.info("node=%s request=%s kind=%s profile=%s", self.node, req.id, req.kind, req.profile)
        if req.kind == "gpu-reset":
            try:
                detail = self.hw.reset_gpu(req.gpu_index)
            except HardwareError as exc:
                return conditions.AgentResult(req.id, passed=False, detail=str(exc))
            return conditions.AgentResult(req.id, passed=True, detail=detail)
        if req.kind == "command":
            return self.run_command(req)
        profile = REQUEST_PROFILES.get(req.profile or "")
        if profile is None:
            known = ", ".join(REQUEST_PROFILES)
            return conditions.AgentResult(
                req.id,
                passed=False,
                detail=f"unknown check profile {req.profile!r}; known: {known}",
            )
        names, iters = profile
        results = checks.run_checks(
            self.hw,
            self.profile,
            names,
            node=self.node,
            clock=self.clock,
            iters=iters,
            guard=checks.idle_guard(self.hw),
        )
        if self.metrics is not None:
            for r in results:
                self.metrics.check(r, self.clock())
        self.last_results = results
        passed, detail = verdict(results)
        return conditions.AgentResult(req.id, passed=passed, detail=detail)

    def run_command(self, req: conditions.AgentRequest) -> conditions.AgentResult:
        """A MaintenancePlan's command, found by name in the commands directory."""
        found = maintenance_commands.find(self.settings.maintenance_commands, req.command or "")
        if isinstance(found, str):
            return conditions.AgentResult(req.id, passed=False, detail=found)
        timeout = float(req.timeout_s or DEFAULT_COMMAND_TIMEOUT_S)
        env = {"NODE_NAME": self.node, "GPUFLEET_REQUEST_ID": req.id}
        log.info(
            "node=%s request=%s running %s (timeout %.0f s)", self.node, req.id, found.path, timeout
        )
        with found:  # the checked file, held open until it has run
            outcome = maintenance_commands.run(found, timeout_s=timeout, env=env)
        return conditions.AgentResult(req.id, passed=outcome.passed, detail=outcome.detail)

    async def _serve_requests(self) -> None:
        while self._requests is not None and not self._requests.empty():
            req = self._requests.get_nowait()
            refused = await self.refusal(req)
            if refused is not None:
                await self._refuse(req, *refused)
                continue
            self._refused.pop(req.id, None)
            if self.metrics is not None:
                self.metrics.requests.labels(self.node, req.kind, "carried-out").inc()
            result = await asyncio.to_thread(self.handle_request, req)
            log.info(
                "node=%s request=%s passed=%s %s", self.node, req.id, result.passed, result.detail
            )
            if self.reporter is not None:
                try:
                    await self.reporter.set_annotations([node_reports.result(result)], self.clock())
                except Exception as exc:
                    log.warning("node=%s result of %s not written: %s", self.node, req.id, exc)
                    self._handled.discard(req.id)  # answer again on the next change

    def _active_due(self, now: float) -> bool:
        every = self.settings.active_every_s
        return every > 0 and now - self._last_active >= every and self.gpu_busy() is False

    def _read_telemetry(self, now: float) -> None:
        """Straggler reports from job telemetry join the faults found by active checks."""
        if self.telemetry is None or now - self._last_telemetry < self.settings.telemetry_every_s:
            return
        self._last_telemetry = now
        found = self.telemetry.poll(now)
        self._suspected.extend(self.telemetry.take_suspicions())
        if self.metrics is not None:
            self.metrics.job_slowdown.labels(self.node).set(self.telemetry.slowdown())
        with self._found_lock:
            self._found.extend(found)

    def _add_found(self, snap: Any, now: float) -> None:
        """Fold faults found by active checks into this poll, as instants of their
        subsystem, so they are judged, debounced and reported like any other; and
        keep observing a subsystem whose condition is raised so that it can clear."""
        with self._found_lock:
            found, self._found = self._found, []
        for fault in found:
            sub = fault.subsystem
            obs = snap.observations.get(sub) or debounce.Observation(at=now)
            snap.observations[sub] = replace(obs, instant=(*obs.instant, fault))
        for sub, entry in self.subs.items():
            if sub not in snap.observations and entry.state.problem:
                snap.observations[sub] = debounce.Observation(at=now)

    def check_suspected(self, now: float) -> list[Any]:
        """Run the ``sdc`` check now because job telemetry suspects this node (decision
        0275): not held back by the job's GPU processes (the suspicion comes from that
        job; the check computes, it disrupts nothing). Its faults are reported on the
        next poll with the suspicion in their message; a pass reports nothing."""
        why, self._suspected = "; ".join(self._suspected), []
        log.info("node=%s running the sdc check: %s", self.node, why)
        results = checks.run_checks(
            self.hw, self.profile, ("sdc",), node=self.node, clock=self.clock
        )
        if self.metrics is not None:
            for r in results:
                self.metrics.check(r, self.clock())
        faults = [
            replace(f, evidence=replace(f.evidence, message=f"{f.evidence.message} ({why})"))
            for r in results
            for f in r.faults
        ]
        for r in results:
            log.info("node=%s sdc check %s: %s", self.node, r.status.label, r.reason)
        with self._found_lock:
            self._found.extend(faults)
        self.last_results = results
        return results

    def run_active(self, now: float) -> list[Any]:
        """Run the scheduled active checks; each asks the idle guard first, so a
        workload that starts meanwhile leaves the rest unrun (unknown, "not run").
        One call, so ``sdc`` judges the GEMM ``gemm`` ran instead of running it again.

        A failed check is a fault like any other: it is reported on the next poll.
        """
        self._last_active = now
        idle = checks.idle_guard(self.hw)
        held: list[str] = []

        def guard() -> str | None:
            why = idle()
            if why is not None:
                held.append(why)
            return why

        results = checks.run_checks(
            self.hw,
            self.profile,
            self.settings.active_checks,
            node=self.node,
            clock=self.clock,
            guard=guard,
        )
        if held:
            log.info("node=%s %d active check(s) not run: %s", self.node, len(held), held[0])
        if self.metrics is not None:
            for r in results:
                self.metrics.check(r, self.clock())
        with self._found_lock:
            self._found.extend(f for r in results for f in r.faults)
        self.last_results = results
        return results


def verdict(results: list[Any]) -> tuple[bool, str]:
    """Whether a verification passed: every check OK. Fail closed: a check that
    could not tell (UNKNOWN) does not let a node back into production."""
    bad = [r for r in results if r.status is not CheckStatus.OK]
    if not results:
        return False, "no check ran"
    if not bad:
        return True, f"{len(results)} checks passed"
    return False, "; ".join(f"{r.name} {r.status.label}: {r.reason}" for r in bad)[:900]


def request_view(node: dict[str, Any]) -> tuple[str | None, str | None]:
    """(request annotation, id of the request already answered) of a Node object."""
    annotation = (node.get("metadata", {}).get("annotations") or {}).get(
        well_known.ANNOTATION_AGENT_REQUEST
    )
    found = node_reports.answer_of(node)
    # A refusal answers nothing: the request is judged again when the node changes.
    answered = found.id if found is not None and found.outcome != "refused" else None
    return annotation, answered


def _window(policy: Policy) -> float:
    """How long occurrences are kept: the policy's longest repeat window (as the
    controller keeps them), an hour when the policy has no repeat rule."""
    return policy_window(policy) or 3600.0


def _report(sub: Subsystem, state: debounce.ConditionState) -> conditions.ConditionReport:
    if state.problem:
        return conditions.problem(sub, sorted(state.faults, key=lambda f: f.at))
    if state.status is debounce.Status.UNKNOWN:
        return conditions.ConditionReport(
            type=conditions.healthy(sub).type,
            status="Unknown",
            reason="MonitorUnavailable",
            message=state.note or "not observed yet",
        )
    return conditions.healthy(sub)


# ------------------------------------------------------------- injection API


class InjectionServer:
    """Loopback HTTP API of the simulated backend: POST /inject {"fault": ...}, POST /recover."""

    def __init__(self, hw: Any, port: int, address: str = "127.0.0.1") -> None:
        hardware = hw

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug("inject-api " + format, *args)

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/faults":
                    resets = getattr(hardware, "resets", 0)
                    self._reply(200, {"injected": list(hardware.injected), "resets": resets})
                else:
                    self._reply(404, {"error": "GET /faults, POST /inject, POST /recover"})

            def do_POST(self) -> None:
                from gpufleet.health.backend_sim import InjectionError

                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._reply(400, {"error": "body must be JSON"})
                    return
                if self.path == "/recover":
                    hardware.recover()
                    self._reply(200, {"recovered": True})
                elif self.path == "/inject":
                    try:
                        spec = hardware.inject(str(body.get("fault", "")))
                    except InjectionError as exc:
                        self._reply(400, {"error": str(exc)})
                        return
                    self._reply(200, {"injected": spec.kind, "params": spec.params})
                else:
                    self._reply(404, {"error": "POST /inject or /recover"})

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.port: int = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> InjectionServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
