"""The one builder of core/v1 Events, for every product that posts them.

Events are how gpufleet explains itself to ``kubectl describe``: the same
fields (involved object, source and reporting component, first/last time,
count) in the same shape, whoever reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.kubeapi.resources import Json


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
