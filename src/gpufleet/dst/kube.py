"""An in-memory apiserver and the per-identity clients that reach it through ``KubePort``.

What it models, because gpufleet's safety rests on it:

* **resourceVersion and compare-and-swap**: one counter for every write; a patch
  that carries ``metadata.resourceVersion`` fails with 409 when the object moved on;
* **merge and strategic-merge patches as gpufleet sends them**: RFC 7386 maps; Node
  ``status.conditions`` merged by ``type`` (``$patch: delete`` removes one), every
  other list replaced (Node taints have no merge key);
* **the status subresource**: a main-resource write ignores ``status``; a status
  write to a Node may change metadata and status but not spec, to a custom object
  only status; ``metadata.generation`` moves with a custom object's spec;
* **selectors**: equality and existence label selectors, dotted field selectors;
* **watches** per subscriber, in order, each event late by a seeded delay, an
  object that stops matching delivered as DELETED, a too-old resourceVersion
  answered with 410, streams that end;
* Pods bound by ``nodeName``, eviction (a minimal PodDisruptionBudget: a pod
  labelled :data:`PDB_LABEL` is refused while its block lasts), graceful deletion,
  bind; Events (generateName), Secrets, ConfigMaps, custom objects and Leases, all
  as plain objects of their resource.

Every write is reported to the ``on_write`` hooks with the writer's identity and the
object before and after (the invariants read them). :class:`KubeClient` is one
process's view: every call goes through the seeded scheduler (late, lost, failed,
the caller killed at that await) and lands in the trace.

It is meant to become the project's one Kubernetes fake: :class:`KubeClient` is
checked by mypy against :class:`~gpufleet.kubeapi.KubePort`, and :class:`ApiServer`
can be driven synchronously by a test (``api.put(...)``, ``api.objects``).
"""

from __future__ import annotations

import asyncio
import itertools
import marshal
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet.domain.enrollment import rfc3339
from gpufleet.kubeapi import (
    EVENTS,
    NODES,
    PODS,
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Json,
    KubePort,
    NotFound,
    ObjectList,
    Patch,
    Resource,
    TooManyRequests,
    Unreachable,
    WatchEvent,
)
from gpufleet.lifecycle.nodes import apply_merge_patch

if TYPE_CHECKING:
    from gpufleet.dst.world import Proc, World

T = TypeVar("T")

PDB_LABEL = "dst.gpufleet.io/pdb"
"""A pod with this label set to ``block`` is protected by a PodDisruptionBudget
that refuses evictions until :attr:`ApiServer.pdb_open_at` (virtual seconds)."""
HISTORY = 5_000
"""Watch events kept for watches that resume from a resourceVersion; older is 410."""


def copy(obj: Any) -> Any:
    """A deep copy of JSON data (``marshal`` round trip: several times faster than
    ``copy.deepcopy``; the apiserver hands out copies on every read, as a real one does)."""
    try:
        return marshal.loads(marshal.dumps(obj))
    except ValueError:  # not plain data (a tuple inside, say): copy by hand
        if isinstance(obj, dict):
            return {k: copy(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [copy(v) for v in obj]
        return obj


def _obj(obj: Json) -> Json:
    """A copy of one object (typed)."""
    out: Json = copy(obj)
    return out


def merge_patch(target: Json, patch: Mapping[str, Any]) -> Json:
    """RFC 7386 (the controller's own :func:`~gpufleet.lifecycle.nodes.apply_merge_patch`),
    on a copy of the patch: what is stored never shares data with the caller's patch."""
    return apply_merge_patch(target, copy(dict(patch)))


MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("spec", "containers"): "name",
}
"""Lists a strategic-merge patch merges by key (core/v1's patchMergeKey); others are replaced."""


def strategic_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """A strategic-merge patch as the apiserver applies one to a built-in kind."""
    if not isinstance(patch, Mapping):
        return copy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        here = (*path, k)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and here in MERGE_KEYS:
            key = MERGE_KEYS[here]
            items = [dict(x) for x in out.get(k) or []]
            for item in v:
                if not isinstance(item, Mapping):
                    continue
                found = next((i for i, x in enumerate(items) if x.get(key) == item.get(key)), None)
                if item.get("$patch") == "delete":
                    if found is not None:
                        items.pop(found)
                elif found is None:
                    items.append(copy(dict(item)))
                else:
                    items[found] = strategic_patch(items[found], item, here)
            out[k] = items
        else:
            out[k] = strategic_patch(out.get(k), v, here)
    return out


def labels_match(obj: Mapping[str, Any], selector: str) -> bool:
    """Equality (``k=v``, ``k==v``, ``k!=v``) and existence (``k``, ``!k``) terms."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, _, v = term.partition("!=")
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, _, v = term.replace("==", "=").partition("=")
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def fields_match(obj: Mapping[str, Any], selector: str) -> bool:
    """Dotted-path terms (``spec.nodeName=n1``, ``involvedObject.name=n1``, ``a!=b``)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        path, _, want = term.replace("!=", "=").replace("==", "=").partition("=")
        value: Any = obj
        for part in path.strip().split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        got = "" if value is None else str(value)
        if (got == want.strip()) == negate:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Write:
    """One write the apiserver accepted: who, what, and the object before and after."""

    identity: str
    resource: str
    namespace: str
    name: str
    verb: str
    before: Json | None
    after: Json | None
    at: float


@dataclass
class _Sub:
    """One watch stream: its filter, what it has shown, and its queue of events."""

    resource: str
    res: Resource
    namespace: str | None
    label_selector: str
    field_selector: str
    visible: set[str] = field(default_factory=set)
    queue: list[WatchEvent] = field(default_factory=list)
    last_due: float = 0.0
    closing: bool = False
    error: ApiError | None = None
    waiter: asyncio.Future[None] | None = None

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return labels_match(obj, self.label_selector) and fields_match(obj, self.field_selector)

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class ApiServer:
    """The objects of one cluster and the rules of writing them (synchronous)."""

    def __init__(
        self,
        *,
        now: Callable[[], float],
        wall: Callable[[], float],
        later: Callable[[float, Callable[[], None]], None],
        watch_delay: Callable[[], tuple[float, bool]] = lambda: (0.0, False),
    ) -> None:
        self._now = now
        self._wall = wall
        self._later = later
        self._watch_delay = watch_delay
        self.objects: dict[tuple[str, str, str], Json] = {}
        """(resource, namespace or "", name) -> object."""
        self.rv = 0
        self._uids = itertools.count(1)
        self._history: list[tuple[int, str, str, str, Json]] = []
        """(rv, resource, namespace, type, object) of recent changes, for watches that resume."""
        self._subs: list[_Sub] = []
        self.on_write: list[Callable[[Write], None]] = []
        self.admission: list[Callable[[str, str, Json | None, Json | None], str | None]] = []
        """Validating admission: ``(identity, resource, before, after)`` -> why it is
        denied (403 Forbidden, nothing stored), or None."""
        self.pdb_open_at = 0.0
        """Evictions of pods labelled :data:`PDB_LABEL` are refused before this time."""
        self.pod_grace_s = 2.0
        """How long an evicted or deleted pod terminates before it is gone."""

    # -------------------------------------------------------------- helpers

    @staticmethod
    def key(resource: Resource, namespace: str | None, name: str) -> tuple[str, str, str]:
        return (str(resource), namespace or "", name)

    def _missing(self, verb: str, resource: Resource, name: str) -> NotFound:
        return NotFound(f"{verb} {resource} {name}", 404, "not found")

    def _store(
        self,
        identity: str,
        verb: str,
        resource: Resource,
        namespace: str | None,
        name: str,
        before: Json | None,
        after: Json | None,
    ) -> Json | None:
        """Store ``after`` (None: delete) with a new resourceVersion; notify and report."""
        k = self.key(resource, namespace, name)
        for admit in self.admission:
            denied = admit(identity, k[0], before, after)
            if denied is not None:
                raise Forbidden(f"{verb} {resource} {name}", 403, denied)
        self.rv += 1
        if after is None:
            self.objects.pop(k, None)
            kind = "DELETED"
            shown = copy(before) if before is not None else {}
            shown.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        else:
            after.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
            self.objects[k] = after
            kind = "ADDED" if before is None else "MODIFIED"
            shown = after
        self._history.append((self.rv, k[0], k[1], kind, copy(shown)))
        if len(self._history) > HISTORY:
            del self._history[: len(self._history) - HISTORY]
        self._notify(k[0], k[1], kind, shown, before)
        w = Write(identity, k[0], k[1], name, verb, before, after, self._now())
        for hook in self.on_write:
            hook(w)
        return after

    def get_object(self, resource: Resource, name: str, namespace: str | None = None) -> Json:
        obj = self.objects.get(self.key(resource, namespace, name))
        if obj is None:
            raise self._missing("get", resource, name)
        return obj

    def find(self, resource: Resource, name: str, namespace: str | None = None) -> Json | None:
        """The stored object itself (not a copy: for the invariants and the models)."""
        return self.objects.get(self.key(resource, namespace, name))

    def all(self, resource: Resource, namespace: str | None = None) -> list[Json]:
        """Every stored object of a resource (not copies), in creation order."""
        r = str(resource)
        return [
            o
            for (res, ns, _), o in self.objects.items()
            if res == r and (namespace is None or ns == namespace)
        ]

    # ------------------------------------------------------------- requests

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> Json:
        return _obj(self.get_object(resource, name, namespace))

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        items = [
            copy(o)
            for o in self.all(resource, namespace)
            if labels_match(o, label_selector) and fields_match(o, field_selector)
        ]
        return ObjectList(items, str(self.rv))

    def create(
        self, identity: str, resource: Resource, body: Mapping[str, Any], namespace: str | None
    ) -> Json:
        obj = copy(dict(body))
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._uids):x}"
        name = str(meta.get("name") or "")
        if namespace:
            meta["namespace"] = namespace
        k = self.key(resource, namespace, name)
        if k in self.objects:
            raise Conflict(f"create {resource} {name}", 409, "already exists")
        meta["uid"] = meta.get("uid") or f"uid-{next(self._uids)}"
        meta["creationTimestamp"] = rfc3339(self._wall())
        if resource.version != "v1":
            meta["generation"] = 1
        stored = self._store(identity, "create", resource, namespace, name, None, obj)
        assert stored is not None
        return _obj(stored)

    def patch(
        self,
        identity: str,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json:
        old = self.objects.get(self.key(resource, namespace, name))
        if old is None:
            raise self._missing("patch", resource, name)
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and str(want_rv) != old["metadata"]["resourceVersion"]:
            raise Conflict(f"patch {resource} {name}", 409, "the object has been modified")
        body = {k: v for k, v in patch.items() if not (status and k == "spec")}
        if status and resource.version != "v1":
            body = {"status": patch.get("status") or {}}
        elif not status:
            body = {k: v for k, v in body.items() if k != "status"}
        new = strategic_patch(old, body) if kind is Patch.STRATEGIC else merge_patch(old, body)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if resource.version != "v1" and not status and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
        if new == old:  # the apiserver writes nothing for a no-op patch
            return _obj(old)
        stored = self._store(identity, "patch", resource, namespace, name, old, new)
        assert stored is not None
        return _obj(stored)

    def apply(
        self,
        identity: str,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None,
    ) -> Json:
        if self.key(resource, namespace, name) not in self.objects:
            return self.create(identity, resource, body, namespace)
        return self.patch(identity, resource, name, body, namespace=namespace)

    def delete(
        self, identity: str, resource: Resource, name: str, namespace: str | None = None
    ) -> None:
        old = self.objects.get(self.key(resource, namespace, name))
        if old is None:
            raise self._missing("delete", resource, name)
        if resource == PODS:
            self._terminate(identity, old, namespace)
            return
        self._store(identity, "delete", resource, namespace, name, old, None)

    def delete_all(
        self, identity: str, resource: Resource, namespace: str, label_selector: str
    ) -> None:
        for obj in [o for o in self.all(resource, namespace) if labels_match(o, label_selector)]:
            self.delete(identity, resource, obj["metadata"]["name"], namespace)

    def _terminate(self, identity: str, pod: Json, namespace: str | None) -> None:
        """Graceful deletion: ``deletionTimestamp`` now, gone after the grace period."""
        name = pod["metadata"]["name"]
        if not pod["metadata"].get("deletionTimestamp"):
            new = copy(pod)
            new["metadata"]["deletionTimestamp"] = rfc3339(self._wall())
            self._store(identity, "delete", PODS, namespace, name, pod, new)

        def gone() -> None:
            current = self.objects.get(self.key(PODS, namespace, name))
            if current is not None and current["metadata"].get("deletionTimestamp"):
                self._store("kubelet", "delete", PODS, namespace, name, current, None)

        self._later(self.pod_grace_s, gone)

    def evict(self, identity: str, namespace: str, name: str) -> None:
        pod = self.objects.get(self.key(PODS, namespace, name))
        if pod is None:
            raise self._missing("evict", PODS, f"{namespace}/{name}")
        labels = pod["metadata"].get("labels") or {}
        if labels.get(PDB_LABEL) == "block" and self._now() < self.pdb_open_at:
            raise TooManyRequests(
                f"evict {namespace}/{name}", 429, "Cannot evict pod: it would violate the PDB"
            )
        self._terminate(identity, pod, namespace)

    def bind(self, identity: str, namespace: str, name: str, uid: str, node: str) -> None:
        pod = self.objects.get(self.key(PODS, namespace, name))
        if pod is None:
            raise self._missing("bind", PODS, f"{namespace}/{name}")
        if pod["metadata"].get("uid") != uid or (pod.get("spec") or {}).get("nodeName"):
            raise Conflict(f"bind {namespace}/{name}", 409, "not that pod, or bound already")
        new = copy(pod)
        new.setdefault("spec", {})["nodeName"] = node
        self._store(identity, "bind", PODS, namespace, name, pod, new)

    # --------------------------------------------------------------- watches

    def subscribe(
        self,
        resource: Resource,
        resource_version: str,
        namespace: str | None,
        label_selector: str,
        field_selector: str,
    ) -> _Sub:
        """A watch from ``resource_version`` (410 if the history no longer reaches it)."""
        sub = _Sub(str(resource), resource, namespace, label_selector, field_selector)
        for o in self.all(resource, namespace):
            if sub.matches(o):
                sub.visible.add(o["metadata"]["name"])
        start = int(resource_version) if resource_version.isdigit() else self.rv
        if start < self.rv:
            oldest = self._history[0][0] if self._history else self.rv + 1
            if start + 1 < oldest:
                raise Gone(f"watch {resource}", 410, f"too old resource version: {start}")
            # Replay what happened since, from the names visible as of ``start``.
            replay = [h for h in self._history if h[1] == sub.resource and h[0] > start]
            sub.visible = self._names_at(sub, start)
            for _, _, ns, kind, obj in replay:
                if namespace is not None and ns != namespace:
                    continue
                self._deliver(sub, kind, obj, None)
        self._subs.append(sub)
        return sub

    def _names_at(self, sub: _Sub, rv: int) -> set[str]:
        """Names matching ``sub`` as of ``rv`` (current objects whose history since is undone)."""
        names = {o["metadata"]["name"] for o in self.all(sub.res) if sub.matches(o)}
        for h_rv, res, _, kind, obj in reversed(self._history):
            if h_rv <= rv or res != sub.resource:
                continue
            name = obj["metadata"]["name"]
            if kind == "ADDED":
                names.discard(name)
            elif kind == "DELETED":
                names.add(name)
        return names

    def unsubscribe(self, sub: _Sub) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def close_subs(self, pred: Callable[[_Sub], bool], error: ApiError | None) -> None:
        """End the streams ``pred`` picks (a partition: with ``error``)."""
        for sub in list(self._subs):
            if pred(sub):
                sub.closing = True
                sub.error = error
                sub.wake()

    def _notify(
        self, resource: str, namespace: str, kind: str, obj: Json, before: Json | None
    ) -> None:
        for sub in list(self._subs):
            if sub.resource != resource or (
                sub.namespace is not None and sub.namespace != namespace
            ):
                continue
            self._deliver(sub, kind, obj, before)

    def _deliver(self, sub: _Sub, kind: str, obj: Json, before: Json | None) -> None:
        name = obj["metadata"]["name"]
        was = name in sub.visible
        now = kind != "DELETED" and sub.matches(obj)
        if now:
            sub.visible.add(name)
            out = "MODIFIED" if was else "ADDED"
        elif was:
            sub.visible.discard(name)
            out = "DELETED"
        else:
            return
        event = WatchEvent(out, copy(obj))
        delay, end = self._watch_delay()
        due = max(sub.last_due, self._now() + delay)
        sub.last_due = due

        def arrive() -> None:
            sub.queue.append(event)
            if end:
                sub.closing = True
            sub.wake()

        if due <= self._now():
            arrive()
        else:
            self._later(due - self._now(), arrive)


# ------------------------------------------------------------------ clients


class KubeClient:
    """One process's client: :class:`~gpufleet.kubeapi.KubePort` over the :class:`ApiServer`.

    Each call is one scheduling point of the run: the world's choice says how long it
    takes, whether it fails before or after its effect, and whether the calling process
    dies there (SIGKILL: its tasks are cancelled, nothing of it runs again).
    """

    def __init__(self, world: World, proc: Proc) -> None:
        self.world = world
        self.proc = proc
        self.api = world.api

    async def _call(
        self, what: str, effect: Callable[[], T], *, writes: bool = False, key: bool = False
    ) -> T:
        result: T = await self.world.port_call(
            self.proc, "kube", what, effect, writes=writes, error=_unreachable, key=key
        )
        return result

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        return await self._call(
            f"get {resource} {name}", lambda: self.api.get(resource, name, namespace)
        )

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        sel = ",".join(filter(None, (label_selector, field_selector)))
        looked = field_selector.removeprefix("spec.nodeName=") if resource == PODS else ""

        def effect() -> ObjectList:
            listing = self.api.list(resource, namespace, label_selector, field_selector)
            if looked and looked != field_selector:  # a look at one node's pods, now
                self.world.pod_looks[(self.proc.label, looked)] = self.world.loop.time()
            return listing

        return await self._call(f"list {resource}" + (f" [{sel}]" if sel else ""), effect)

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
        world, proc = self.world, self.proc
        proc.check_alive()
        if world.partitioned(proc):
            await asyncio.sleep(1.0)
            raise _unreachable(f"watch {resource}")
        sub = self.api.subscribe(
            resource, resource_version, namespace, label_selector, field_selector
        )
        sub_owner = proc
        world.watching(sub_owner, sub)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                while not sub.queue:
                    if sub.closing or loop.time() >= deadline:
                        if sub.error is not None:
                            raise sub.error
                        return
                    sub.waiter = loop.create_future()
                    timer = loop.call_at(deadline, sub.wake)
                    try:
                        await sub.waiter
                    finally:
                        timer.cancel()
                        sub.waiter = None
                    proc.check_alive()
                event = sub.queue.pop(0)
                yield event
                proc.check_alive()
        finally:
            self.api.unsubscribe(sub)

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        name = (body.get("metadata") or {}).get("name") or "?"
        return await self._call(
            f"create {resource} {name}",
            lambda: self.api.create(self.proc.identity, resource, body, namespace),
            writes=True,
        )

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
        sub = "/status" if status else ""
        cas = " cas" if (patch.get("metadata") or {}).get("resourceVersion") else ""
        return await self._call(
            f"patch {resource} {name}{sub}{cas} {_gist(patch)}",
            lambda: self.api.patch(
                self.proc.identity,
                resource,
                name,
                patch,
                namespace=namespace,
                status=status,
                kind=kind,
            ),
            writes=True,
            key=resource == NODES and _telling(patch),
        )

    async def apply(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str = "gpufleet",
    ) -> Json:
        return await self._call(
            f"apply {resource} {name}",
            lambda: self.api.apply(self.proc.identity, resource, name, body, namespace),
            writes=True,
        )

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        await self._call(
            f"delete {resource} {name}",
            lambda: self.api.delete(self.proc.identity, resource, name, namespace),
            writes=True,
        )

    async def delete_all(self, resource: Resource, *, namespace: str, label_selector: str) -> None:
        await self._call(
            f"delete {resource} [{label_selector}]",
            lambda: self.api.delete_all(self.proc.identity, resource, namespace, label_selector),
            writes=True,
        )

    async def evict(self, namespace: str, name: str) -> None:
        await self._call(
            f"evict {namespace}/{name}",
            lambda: self.api.evict(self.proc.identity, namespace, name),
            writes=True,
        )

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        await self._call(
            f"bind {namespace}/{name} {node}",
            lambda: self.api.bind(self.proc.identity, namespace, name, uid, node),
            writes=True,
        )

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        reason = event.get("reason", "")
        involved = (event.get("involvedObject") or {}).get("name", "")
        await self._call(
            f"event {involved} {reason}",
            lambda: self.api.create(self.proc.identity, EVENTS, event, namespace),
            writes=True,
        )


def _unreachable(what: str) -> ApiError:
    return Unreachable(what, None, "no answer (dst)")


_TELLING = (
    "gpufleet.io/state",
    "gpufleet.io/agent-request",
    "gpufleet.io/agent-result",
    "gpufleet.io/bmc-action",
    "gpufleet.io/slurm-work",
    "gpufleet.io/operator-request",
)


def _telling(patch: Mapping[str, Any]) -> bool:
    """A Node write that belongs in the story: state, requests, answers, marks, reports."""
    meta = patch.get("metadata") or {}
    keys = {*(meta.get("labels") or {}), *(meta.get("annotations") or {})}
    return any(k in keys for k in _TELLING)


def _gist(patch: Mapping[str, Any]) -> str:
    """What a patch touches, short: its top-level paths and gpufleet keys."""
    parts: list[str] = []
    meta = patch.get("metadata") or {}
    for sect in ("labels", "annotations"):
        for k, v in (meta.get(sect) or {}).items():
            short = k.removeprefix("gpufleet.io/")
            if k == "gpufleet.io/state":
                parts.append(f"state={v}")
            elif short in ("record", "reason", "faults-seen", "lemon-score", "lemon-gpus"):
                continue
            else:
                parts.append(short if v is not None else f"-{short}")
    if "spec" in patch:
        parts.append("spec:" + ",".join(sorted(patch["spec"])))
    if "status" in patch:
        parts.append("status:" + ",".join(sorted(patch["status"] or {})))
    return "{" + " ".join(parts) + "}"


def node_body(
    name: str, *, pool: str = "default", annotations: Mapping[str, str] | None = None
) -> Json:
    """A Ready Node as a kubelet registers it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"gpufleet.io/pool": pool, "kubernetes.io/hostname": name},
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "allocatable": {"nvidia.com/gpu": "8"},
            "nodeInfo": {"systemUUID": ""},
        },
    }


_port: type[KubePort] = KubeClient  # mypy checks the client against the port here
__all__ = ["NODES", "PDB_LABEL", "ApiServer", "KubeClient", "Write", "node_body"]
