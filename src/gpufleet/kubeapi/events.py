"""The one builder of core/v1 Events, for every product that posts them.

Events are how gpufleet explains itself to ``kubectl describe``: the same
fields (involved object, source and reporting component, first/last time,
count) in the same shape, whoever reports. :class:`EventRecorder` aggregates
repeats into one Event (count and lastTimestamp), as Kubernetes' recorder does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.kubeapi.errors import Conflict, NotFound
from gpufleet.kubeapi.port import KubePort
from gpufleet.kubeapi.resources import EVENTS, Json


def event_body(
    *,
    involved: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    component: str,
    instance: str,
    namespace: str,
    first: str,
    last: str | None = None,
    name: str | None = None,
    host: str | None = None,
    max_message: int = 1000,
) -> Json:
    """A core/v1 Event about ``involved`` (apiVersion, kind, name, uid if known).

    Without ``name`` the apiserver names it (``generateName``: the object's name
    and a dot). Timestamps are RFC 3339 text; ``last`` defaults to ``first``.
    """
    source: dict[str, str] = {"component": component}
    if host is not None:
        source["host"] = host
    prefix = str(involved.get("name") or str(involved.get("kind", "object")).lower())
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            **({"name": name} if name else {"generateName": f"{prefix}."}),
            "namespace": namespace,
        },
        "involvedObject": dict(involved),
        "type": type_,
        "reason": reason,
        "message": message[:max_message],
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": first,
        "lastTimestamp": last or first,
        "count": 1,
    }


def from_agent_of(event: Mapping[str, Any], node: str, *, agent: str) -> bool:
    """Whether ``event`` was posted by the agent of ``node`` about ``node`` itself.

    The agent posts its Events (:func:`event_body`) with ``component`` and
    ``reportingComponent`` its name, ``reportingInstance`` and ``source.host`` its
    node. Any account that may create Events can claim the first; only the node's own
    agent may claim the node (the chart's ``<release>-agent-events`` admission policy),
    so a reader that must trust what the agent saw on a node (the RMA evidence) takes
    an Event only when all of them name that agent and that node.
    """
    involved = event.get("involvedObject") or {}
    source = event.get("source") or {}
    return (
        involved.get("kind") == "Node"
        and involved.get("name") == node
        and event.get("reportingComponent") == agent
        and source.get("component") == agent
        and event.get("reportingInstance") == node
        and source.get("host", node) == node
    )


class EventRecorder:
    """Posts Events the way Kubernetes' own recorder aggregates them.

    The same reason, object, type and message again is not a new Event: the
    first one's ``count`` and ``lastTimestamp`` are patched, so ``kubectl
    describe`` shows "x6 over 13s" instead of six lines (and etcd keeps one
    object). The Event's name is derived from what makes it "the same", plus
    this recorder's start time: a restarted process starts new Events (as
    Kubernetes' in-memory correlator does) and never needs to read an Event
    (the writer's RBAC is create and patch). An Event the apiserver has
    expired (NotFound on the patch) is created anew; one whose create answered
    AlreadyExists is this process's own, created by a try whose answer was lost.
    """

    def __init__(self, kube: KubePort, *, clock: Clock = SYSTEM_CLOCK, remember: int = 4096):
        self.kube = kube
        self._epoch = f"{int(clock.now() * 1000):x}"
        self._counts: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._remember = remember
        self._lock = asyncio.Lock()

    def name_of(self, event: Mapping[str, Any]) -> str:
        """A stable DNS-subdomain name for every repeat of ``event`` in this process."""
        inv = event.get("involvedObject") or {}
        same = "\x00".join(
            str(x)
            for x in (
                inv.get("apiVersion"),
                inv.get("kind"),
                inv.get("namespace"),
                inv.get("name"),
                inv.get("uid"),
                event.get("type"),
                event.get("reason"),
                event.get("message"),
                event.get("reportingComponent"),
            )
        )
        digest = hashlib.sha256(same.encode()).hexdigest()[:16]
        prefix = str(inv.get("name") or str(inv.get("kind", "object")).lower())[:200]
        return f"{prefix}.{digest}.{self._epoch}"

    async def record(self, namespace: str, event: Mapping[str, Any]) -> int:
        """Post ``event`` (from :func:`event_body`) or count it on its first post.

        Returns the count the Event now carries. Raises what the port raises
        (the caller logs it: an Event never holds up a decision).
        """
        name = self.name_of(event)
        key = (namespace, name)
        last = event.get("lastTimestamp") or event.get("firstTimestamp")
        async with self._lock:
            count = self._counts.get(key)
            if count is not None:
                try:
                    await self.kube.patch(
                        EVENTS,
                        name,
                        {"count": count + 1, "lastTimestamp": last},
                        namespace=namespace,
                    )
                    self._remember_count(key, count + 1)
                    return count + 1
                except NotFound:
                    pass  # expired (the apiserver's Event TTL): a new one
            body = dict(event)
            body["metadata"] = {"name": name, "namespace": namespace}
            body["count"] = 1
            # A Conflict: the name carries this process's start, so it exists because our
            # own create went through and its answer was lost. Taken for a failure, every
            # repeat was refused again, and a Notice, which its decision's write waits
            # for, held that write back for good.
            with contextlib.suppress(Conflict):
                await self.kube.create_event(namespace, body)
            self._remember_count(key, 1)
            return 1

    def _remember_count(self, key: tuple[str, str], count: int) -> None:
        self._counts[key] = count
        self._counts.move_to_end(key)
        while len(self._counts) > self._remember:
            self._counts.popitem(last=False)
