"""Slurm schedules Kubernetes pods: the loop of ``gpufleet pod-scheduler`` (decision 0257).

Each pass reads everything a decision needs and changes nothing until it has all of it:

1. the pods whose ``spec.schedulerName`` is this scheduler's (a field selector: the
   apiserver filters), the Nodes, the annotations of the pods' namespaces, the
   ``spec.parallelism`` of the Jobs that own them (batch/v1), and this scheduler's
   Slurm jobs (one ``squeue``, :mod:`gpufleet.slurm.pod_jobs`);
2. :func:`gpufleet.domain.pod_groups.plan` decides (pure): submit, write the plan,
   bind, requeue, cancel, evict, reject;
3. the actions are carried out in the order given, each through the one API meant for
   it: ``pods/binding``, the Eviction API (grace periods and PodDisruptionBudgets
   hold), the pod's status (``PodScheduled=False``) and an Event.

A read that fails (the apiserver, or slurmctld down or restarting) skips the pass:
nothing is decided on half a picture, bound pods keep running, pending ones wait, and
the next try comes after a backoff (doubling up to ``max_backoff_s``). A pass is run
when a pod of this scheduler changes (a watch) and every ``interval_s``; for a few seconds
after a submission the passes follow each other every ``follow_up_s``, so a job Slurm
starts at submission or at its next scheduling cycle is bound without waiting out the
interval. Only the holder of the Lease acts
(:class:`gpufleet.kubeapi.leadership.Leadership`); ``dry_run`` logs every action
instead of doing it.

What the scheduler keeps in memory is only what makes it cheaper or quieter, never
what a restart would need: when it first missed a known job in Slurm's listing (the
domain's two-listings rule; a restarted scheduler starts counting again) and the groups
Slurm refused (tried again when their pods or namespace change, or after
``retry_refused_s``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.domain import pod_groups as pg
from gpufleet.domain import well_known
from gpufleet.kubeapi import NODES, PODS, ApiError, Gone, KubePort, NotFound, Patch, Resource
from gpufleet.kubeapi.events import EventRecorder, event_body
from gpufleet.kubeapi.resources import NAMESPACES
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmError
from gpufleet.slurm.metrics import Endpoint
from gpufleet.slurm.pod_jobs import PodJobPort, SubmitRefused, never_starts
from gpufleet.waits import wait_set

log = logging.getLogger("gpufleet.slurm.pod_scheduler")

JOBS = Resource("jobs", "batch/v1")
COMPONENT = "gpufleet-pod-scheduler"
"""The Events' reporting component."""
DEFAULT_METRICS_PORT = 29443
"""The port the chart gives the pod scheduler's /metrics (the syncer's is 29442)."""

_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 300)


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    scheduler_name: str = well_known.POD_SCHEDULER_NAME
    interval_s: float = 2.0
    dry_run: bool = False
    max_backoff_s: float = 30.0
    follow_up_s: float = 0.25
    """Pause between passes while a job submitted lately may start (Slurm starts a job at
    submission or at its next scheduling cycle, a second or so later)."""
    follow_up_window_s: float = 5.0
    """How long after a submission the passes follow each other at ``follow_up_s``."""
    min_gap_s: float = 0.1
    """Least pause between two passes (the scheduler's own writes wake the watch too)."""
    retry_refused_s: float = 600.0
    watch_timeout_s: int = 300

    @property
    def selector(self) -> str:
        return f"spec.schedulerName={self.scheduler_name}"


class SchedulerMetrics:
    """Prometheus metrics of the pod scheduler (one registry per scheduler)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.endpoint = Endpoint(self.registry)
        """Its /metrics (``serve``, ``stop``)."""
        r = self.registry
        self.groups = Gauge(
            "gpufleet_pod_scheduler_groups",
            "Pod groups with a live member, by state: waiting (a live member is not bound) "
            "or bound (every live member is on its node).",
            ["state"],
            registry=r,
        )
        self.passes = Counter(
            "gpufleet_pod_scheduler_passes_total",
            "Passes by result: done, or skipped (a read failed: nothing changed).",
            ["result"],
            registry=r,
        )
        self.actions = Counter(
            "gpufleet_pod_scheduler_actions_total",
            "Actions carried out (dry run: decided), by kind: submit, plan, bind, requeue, "
            "cancel, evict, reject.",
            ["action"],
            registry=r,
        )
        self.submit_seconds = Histogram(
            "gpufleet_pod_scheduler_submit_seconds",
            "From the group's oldest pod's creation to its Slurm job's submission.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bind_seconds = Histogram(
            "gpufleet_pod_scheduler_bind_seconds",
            "From a pod's creation to its binding to the node Slurm allocated.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.leader = Gauge(
            "gpufleet_pod_scheduler_leader", "1 while this replica acts.", registry=r
        )


@dataclass
class View:
    """One pass's reading of both sides."""

    pods: dict[str, Mapping[str, Any]]
    """``namespace/name`` -> the pod."""
    members: dict[str, pg.Member]
    groups: dict[pg.GroupKey, list[pg.Member]]
    invalid: dict[str, str]
    """``namespace/name`` of a live, unbound pod whose group labels are invalid -> why."""
    namespaces: dict[str, Mapping[str, str]]
    parallelism: dict[tuple[str, str], int]
    nodes: dict[str, pg.NodeFit]
    jobs: list[pg.SlurmJob]
    resource_version: str


@dataclass
class PassResult:
    """What one pass decided (and, unless dry run, did)."""

    actions: list[pg.Action] = field(default_factory=list)
    submitted: int = 0
    bound: int = 0
    failed: list[str] = field(default_factory=list)
    planned: dict[str, int] = field(default_factory=dict)
    """Pod -> the job whose plan this pass wrote on it."""


def _created(pod: Mapping[str, Any]) -> float | None:
    text = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text else None
    except ValueError:
        return None


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _split(pod_key: str) -> tuple[str, str]:
    namespace, _, name = pod_key.partition("/")
    return namespace, name


def fingerprint(members: Sequence[pg.Member], namespace_annotations: Mapping[str, str]) -> str:
    """What a refused group is judged on: its pods (uid, labels, annotations) and its
    namespace's annotations. Another value means someone changed something: try again."""
    data = [
        sorted((m.uid, sorted(m.labels.items()), sorted(m.annotations.items())) for m in members),
        sorted(namespace_annotations.items()),
    ]
    return hashlib.sha256(json.dumps(data, default=str).encode()).hexdigest()


def scheduled_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return c  # type: ignore[no-any-return]
    return None


class PodScheduler:
    """One pass with :meth:`run_pass`; :meth:`run` keeps passing until cancelled."""

    def __init__(
        self,
        kube: KubePort,
        slurm: PodJobPort,
        settings: SchedulerSettings,
        *,
        metrics: SchedulerMetrics | None = None,
        events: EventRecorder | None = None,
        may_act: Callable[[], bool] = lambda: True,
        identity: str = COMPONENT,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        self.settings = settings
        self.metrics = metrics or SchedulerMetrics()
        self.events = events or EventRecorder(kube, clock=clock)
        self.may_act = may_act
        """Whether this replica may act now (it holds the Lease)."""
        self.identity = identity
        self.clock = clock
        self.wake = asyncio.Event()
        self.resource_version = ""
        """Of the last pod listing: where the watch continues."""
        self.absent_since: dict[int, float] = {}
        """When each job a pod's plan names was first missing from Slurm's listing."""
        self._submitted_at = float("-inf")
        """When this scheduler last submitted a job (monotonic)."""
        self._refused: dict[pg.GroupKey, tuple[str, float, str]] = {}
        """Group -> (fingerprint, when, Slurm's message) of its last refused submission."""

    # ------------------------------------------------------------------- reading

    async def read(self) -> View:
        """Both sides, or an exception (ApiError, SlurmError): then nothing is decided."""
        listing = await self.kube.list(PODS, field_selector=self.settings.selector)
        node_list = await self.kube.list(NODES)
        pods: dict[str, Mapping[str, Any]] = {}
        members: dict[str, pg.Member] = {}
        groups: dict[pg.GroupKey, list[pg.Member]] = {}
        invalid: dict[str, str] = {}
        owners: set[tuple[str, str]] = set()
        for pod in listing.items:
            meta = pod.get("metadata") or {}
            namespace = str(meta.get("namespace") or "")
            name = f"{namespace}/{meta.get('name')}"
            m = pg.member(pod)
            pods[name], members[name] = pod, m
            key = pg.group_key(m, namespace)
            if isinstance(key, str):
                if m.live and m.node is None:
                    invalid[name] = key
                continue
            groups.setdefault(key, []).append(m)
            if m.owner is not None and m.owner[0] == "Job" and m.live and m.node is None:
                # only a group that waits needs its size (to be submitted)
                owners.add((namespace, m.owner[1]))
        namespaces = await self._namespaces(
            {k.namespace for k in groups} | {_split(p)[0] for p in invalid}
        )
        parallelism = await self._job_parallelism(owners)
        jobs = await self.slurm.jobs()
        # a node Slurm allocated that Kubernetes lacks is missing here: unfit to the plan
        nodes = {str(n["metadata"]["name"]): pg.node_fit(n) for n in node_list.items}
        return View(
            pods=pods,
            members=members,
            groups=groups,
            invalid=invalid,
            namespaces=namespaces,
            parallelism=parallelism,
            nodes=nodes,
            jobs=jobs,
            resource_version=listing.resource_version,
        )

    async def _namespaces(self, names: set[str]) -> dict[str, Mapping[str, str]]:
        async def one(name: str) -> tuple[str, Mapping[str, str]]:
            try:
                ns = await self.kube.get(NAMESPACES, name)
            except NotFound:
                return name, {}
            return name, dict((ns.get("metadata") or {}).get("annotations") or {})

        return dict(await asyncio.gather(*(one(n) for n in sorted(names))))

    async def _job_parallelism(self, owners: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The effective parallelism of each owning Job (a missing Job is left out)."""

        async def one(owner: tuple[str, str]) -> tuple[tuple[str, str], int] | None:
            try:
                job = await self.kube.get(JOBS, owner[1], namespace=owner[0])
            except NotFound:
                return None
            return owner, pg.effective_parallelism(job)

        found = await asyncio.gather(*(one(o) for o in sorted(owners)))
        return dict(f for f in found if f is not None)

    # ------------------------------------------------------------------- a pass

    async def run_pass(self) -> PassResult:
        """Read, decide, act. Raises when a read fails (nothing was changed) or when Slurm
        stops answering in the middle (what was done is done; the rest waits)."""
        view = await self.read()
        now = self.clock.monotonic()
        self.resource_version = view.resource_version
        self.absent_since = pg.absent_jobs(view.groups, view.jobs, self.absent_since, now)
        sizes: dict[pg.GroupKey, int | str] = {
            k: pg.expected_size(k, ms, view.parallelism) for k, ms in view.groups.items()
        }
        requests: dict[pg.GroupKey, pg.JobRequest | str] = {}
        for k, ms in view.groups.items():
            size = sizes[k]
            requests[k] = (
                pg.request(k, ms, size, view.namespaces.get(k.namespace, {}))
                if isinstance(size, int)
                else size
            )
        actions: list[pg.Action] = [
            pg.Reject((name,), "InvalidPodGroup", why) for name, why in sorted(view.invalid.items())
        ]
        actions += pg.plan(
            view.groups, sizes, requests, view.jobs, view.nodes, dict(self.absent_since), now
        )
        stuck = self._stuck(view, actions)
        self._count_groups(view)
        result = PassResult(actions=actions)
        blocked: set[str] = set()
        """Pods whose plan could not be written this pass: none of their job is bound."""
        for action in actions:
            if not self.may_act():
                log.info("no longer acting: the rest of this pass waits for the next holder")
                return result
            await self._carry_out(action, view, result, blocked)
        for job in stuck:
            if not self.may_act():
                break
            await self._refuse_stuck(job, view, result)
        return result

    def _stuck(self, view: View, actions: Sequence[pg.Action]) -> list[pg.SlurmJob]:
        """This pass's pending jobs that will never start as asked (:func:`never_starts`),
        of a group that waits and that the plan left alone."""
        touched = {a.job_id for a in actions if isinstance(a, pg.Cancel | pg.Requeue)}
        return [
            j
            for j in view.jobs
            if never_starts(j)
            and j.job_id not in touched
            and any(m.live and not m.bound for m in view.groups.get(j.key, ()))
        ]

    async def _refuse_stuck(self, job: pg.SlurmJob, view: View, result: PassResult) -> None:
        """A job Slurm accepted but will never start is a refusal like sbatch's: it is
        cancelled (the group may be fixed and submitted again), its pods say why, and it is
        not submitted again until they or their namespace change."""
        message = f"Slurm cannot start job {job.job_id} as asked: {job.reason}"
        if self.settings.dry_run:
            log.info("dry run, would cancel job %d and reject its pods: %s", job.job_id, message)
            return
        key = job.key
        members = view.groups.get(key, [])
        try:
            await self.slurm.cancel(job.job_id)
        except SlurmCommandFailed as e:
            log.warning("job=%d cancel refused: %s", job.job_id, e)
            return
        log.warning("group=%s: %s (cancelled)", key.job_name, message)
        self._refused[key] = (
            fingerprint(members, view.namespaces.get(key.namespace, {})),
            self.clock.monotonic(),
            message,
        )
        self.metrics.actions.labels("cancel").inc()
        pods = tuple(m.qualified for m in members if m.live and not m.bound)
        try:
            await self._reject(pods, pg.SLURM_REJECTED, message, view)
        except ApiError as e:
            result.failed.append(f"reject {', '.join(pods)}: {e}")

    def _count_groups(self, view: View) -> None:
        waiting = bound = 0
        for ms in view.groups.values():
            live = [m for m in ms if m.live]
            if not live:
                continue
            if all(m.node for m in live):
                bound += 1
            else:
                waiting += 1
        self.metrics.groups.labels("waiting").set(waiting)
        self.metrics.groups.labels("bound").set(bound)

    async def _carry_out(
        self, action: pg.Action, view: View, result: PassResult, blocked: set[str]
    ) -> None:
        kind = type(action).__name__.lower()
        if isinstance(action, pg.Submit) and self._still_refused(action.request.key, view):
            return
        if self.settings.dry_run:
            log.info("dry run, would %s", self.describe(action))
            self.metrics.actions.labels(kind).inc()
            return
        try:
            if isinstance(action, pg.Submit):
                await self._submit(action.request, view, result)
            elif isinstance(action, pg.Plan):
                await self._plan(action, result, blocked)
            elif isinstance(action, pg.Bind):
                if action.pod in blocked:
                    return
                await self._bind(action, view, result)
            elif isinstance(action, pg.Requeue):
                log.info("job=%d requeue: %s", action.job_id, action.why)
                await self.slurm.requeue(action.job_id, action.unfit)
            elif isinstance(action, pg.Cancel):
                log.info("job=%d cancel: %s", action.job_id, action.why)
                await self.slurm.cancel(action.job_id)
            elif isinstance(action, pg.Evict):
                await self._evict(action, view)
            elif isinstance(action, pg.Reject):
                await self._reject(action.pods, action.reason, action.message, view)
            else:
                log.warning("unknown action %r: not carried out", action)
                return
        except ApiError as e:
            result.failed.append(f"{self.describe(action)}: {e}")
            log.warning("%s failed: %s", self.describe(action), e)
            return
        except SlurmCommandFailed as e:
            if isinstance(action, pg.Requeue | pg.Cancel):
                # the job ended or changed meanwhile: the next listing says what it is now
                result.failed.append(f"{self.describe(action)}: {e}")
                log.warning("%s refused: %s", self.describe(action), e)
                return
            raise
        self.metrics.actions.labels(kind).inc()

    @staticmethod
    def describe(action: pg.Action) -> str:
        if isinstance(action, pg.Submit):
            r = action.request
            return f"submit {r.job_name} ({r.nodes} node(s), {r.gpus_per_node} GPU(s) each)"
        if isinstance(action, pg.Plan):
            pairs = ", ".join(f"{p}->{n}" for p, n in action.assignments)
            return f"write the plan of job {action.job_id}: {pairs}"
        if isinstance(action, pg.Bind):
            return f"bind {action.pod} to {action.node}"
        if isinstance(action, pg.Requeue | pg.Cancel):
            return f"{type(action).__name__.lower()} job {action.job_id} ({action.why})"
        if isinstance(action, pg.Evict):
            return f"evict {action.pod} ({action.why})"
        if isinstance(action, pg.Reject):
            return f"reject {', '.join(action.pods)}: {action.reason}: {action.message}"
        return repr(action)

    # ------------------------------------------------------------------ actions

    def _still_refused(self, key: pg.GroupKey, view: View) -> bool:
        """Whether Slurm refused this group before and nothing changed since (then it is
        not submitted again until ``retry_refused_s`` has passed)."""
        seen = self._refused.get(key)
        if seen is None:
            return False
        members = view.groups.get(key, [])
        print_, at, _ = seen
        same = print_ == fingerprint(members, view.namespaces.get(key.namespace, {}))
        if same and self.clock.monotonic() - at < self.settings.retry_refused_s:
            return True
        del self._refused[key]
        return False

    async def _submit(self, request: pg.JobRequest, view: View, result: PassResult) -> None:
        key = request.key
        members = view.groups.get(key, [])
        try:
            job_id = await self.slurm.submit(request)
        except SubmitRefused as e:
            log.warning("group=%s refused by Slurm: %s", request.job_name, e.message)
            self._refused[key] = (
                fingerprint(members, view.namespaces.get(key.namespace, {})),
                self.clock.monotonic(),
                e.message,
            )
            pods = tuple(m.qualified for m in members if m.live)
            await self._reject(pods, "SlurmRejected", f"Slurm refused the job: {e.message}", view)
            return
        result.submitted += 1
        self._submitted_at = self.clock.monotonic()
        self._refused.pop(key, None)
        created = [
            c for m in members if (c := _created(view.pods.get(m.qualified, {}))) is not None
        ]
        if created:
            self.metrics.submit_seconds.observe(max(0.0, self.clock.now() - min(created)))
        log.info(
            "group=%s submitted as Slurm job %d (%d node(s))",
            request.job_name,
            job_id,
            request.nodes,
        )

    async def _plan(self, action: pg.Plan, result: PassResult, blocked: set[str]) -> None:
        try:
            for pod_key, node in action.assignments:
                namespace, name = _split(pod_key)
                patch = {
                    "metadata": {
                        "annotations": {
                            well_known.ANNOTATION_SLURM_JOB: str(action.job_id),
                            well_known.ANNOTATION_SLURM_NODE: node,
                        }
                    }
                }
                await self.kube.patch(PODS, name, patch, namespace=namespace)
                result.planned[pod_key] = action.job_id
        except ApiError:
            blocked.update(p for p, _ in action.assignments)
            raise

    async def _bind(self, action: pg.Bind, view: View, result: PassResult) -> None:
        namespace, name = _split(action.pod)
        pod = view.pods.get(action.pod) or {}
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        member = view.members.get(action.pod)
        await self.kube.bind(namespace, name, uid, action.node)
        result.bound += 1
        created = _created(pod)
        if created is not None:
            self.metrics.bind_seconds.observe(max(0.0, self.clock.now() - created))
        job = result.planned.get(action.pod) or (member.planned_job if member else None)
        message = f"Successfully assigned {action.pod} to {action.node}" + (
            f" (Slurm job {job})" if job is not None else ""
        )
        log.info("pod=%s bound to %s", action.pod, action.node)
        await self._event(pod, "Normal", "Scheduled", message)

    async def _evict(self, action: pg.Evict, view: View) -> None:
        namespace, name = _split(action.pod)
        pod = view.pods.get(action.pod) or {}
        log.info("pod=%s evict: %s", action.pod, action.why)
        await self._event(pod, "Warning", "SlurmJobEnded", action.why)
        await self.kube.evict(namespace, name)

    async def _reject(self, pods: Sequence[str], reason: str, message: str, view: View) -> None:
        """PodScheduled=False and an Event on each pod, unless it already says so."""
        for pod_key in pods:
            pod = view.pods.get(pod_key)
            if pod is None:
                continue
            current = scheduled_condition(pod) or {}
            if (
                current.get("status") == "False"
                and current.get("reason") == reason
                and current.get("message") == message
            ):
                continue
            namespace, name = _split(pod_key)
            log.warning("pod=%s not scheduled: %s: %s", pod_key, reason, message)
            condition = {
                "type": "PodScheduled",
                "status": "False",
                "reason": reason,
                "message": message,
                "lastTransitionTime": _rfc3339(self.clock.now()),
                "lastProbeTime": None,
            }
            await self.kube.patch(
                PODS,
                name,
                {"status": {"conditions": [condition]}},
                namespace=namespace,
                status=True,
                kind=Patch.STRATEGIC,
            )
            await self._event(pod, "Warning", reason, message)

    async def _event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event on the pod; a failure is logged, never stops an action."""
        meta = pod.get("metadata") or {}
        if not meta.get("name"):
            return
        namespace = str(meta.get("namespace") or "default")
        body = event_body(
            involved={
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            type_=type_,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self.identity,
            namespace=namespace,
            first=_rfc3339(self.clock.now()),
        )
        try:
            await self.events.record(namespace, body)
        except ApiError as e:
            log.warning("pod=%s/%s Event %s not posted: %s", namespace, meta["name"], reason, e)

    # ------------------------------------------------------------------- loops

    async def run(self) -> None:
        """Pass on every pod change and every ``interval_s`` while acting; back off after
        a failed pass. Runs until cancelled."""
        watch = asyncio.create_task(self.watch())
        try:
            await self.loop()
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def loop(self, passes: int | None = None) -> None:
        """The pass loop (``passes``: stop after that many, for tests)."""
        s = self.settings
        failures = 0
        said = ""
        done = 0
        while passes is None or done < passes:
            if not self.may_act():
                self.metrics.leader.set(0)
                await self._wait(s.interval_s)
                continue
            self.metrics.leader.set(1)
            self.wake.clear()
            try:
                result = await self.run_pass()
            except asyncio.CancelledError:
                raise
            except (ApiError, SlurmError) as e:
                failures += 1
                self.metrics.passes.labels("skipped").inc()
                text = str(e)
                # the same failure again (slurmctld down) is said once
                log.log(
                    logging.DEBUG if text == said else logging.WARNING,
                    "pass skipped, nothing changed: %s",
                    text,
                )
                said = text
                await asyncio.sleep(min(s.max_backoff_s, s.interval_s * 2 ** (failures - 1)))
                done += 1
                continue
            except Exception:
                failures += 1
                self.metrics.passes.labels("skipped").inc()
                log.exception("pass failed")
                await asyncio.sleep(min(s.max_backoff_s, s.interval_s * 2 ** (failures - 1)))
                done += 1
                continue
            if failures:
                log.info("passes resumed after %d skipped", failures)
            failures, said = 0, ""
            self.metrics.passes.labels("done").inc()
            done += 1
            await asyncio.sleep(s.min_gap_s)
            recent = self.clock.monotonic() - self._submitted_at < s.follow_up_window_s
            await self._wait(s.follow_up_s if recent or result.submitted else s.interval_s)

    async def _wait(self, seconds: float) -> None:
        """Until the watch says a pod changed, or ``seconds``."""
        await wait_set(self.wake, seconds)

    async def watch(self) -> None:
        """Wake the loop on every change of this scheduler's pods. Starts from the last
        listing's resourceVersion; a too-old one waits for the next listing."""
        s = self.settings
        failures = 0
        while True:
            rv = self.resource_version
            if not rv or not self.may_act():
                await asyncio.sleep(s.interval_s)
                continue
            try:
                async for event in self.kube.watch(
                    PODS, rv, field_selector=s.selector, timeout_s=s.watch_timeout_s
                ):
                    if event.type != "BOOKMARK":
                        self.wake.set()
                    seen = (event.object.get("metadata") or {}).get("resourceVersion")
                    if seen:
                        self.resource_version = str(seen)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Gone:
                self.resource_version = ""
            except ApiError as e:
                failures += 1
                log.warning("pod watch: %s", e)
                await asyncio.sleep(min(s.max_backoff_s, s.interval_s * 2 ** (failures - 1)))
