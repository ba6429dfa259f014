"""Repeated Events are aggregated on the real apiserver: one Event per reason, object and
message, whose count and lastTimestamp grow (as Kubernetes' own recorder does), and the
controller's RBAC (create and patch, no get) is all it takes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufleet.domain.enrollment import rfc3339
from gpufleet.kubeapi import EVENTS, KubeApi
from gpufleet.kubeapi.events import EventRecorder, event_body

pytestmark = pytest.mark.integration

NODE = "event-aggregation-node"


def _event(message: str, at: float) -> dict[str, Any]:
    return event_body(
        involved={"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-agg"},
        type_="Warning",
        reason="ActionWithheld",
        message=message,
        component="gpufleet-controller",
        instance="gpufleet-controller",
        namespace="default",
        first=rfc3339(at),
    )


def test_six_repeats_are_one_event_with_count_six(local_cluster: Any) -> None:
    async def go() -> list[dict[str, Any]]:
        kube = await KubeApi.connect(str(local_cluster.kubeconfig))
        rec = EventRecorder(kube)
        t0 = 1_800_000_000.0
        for i in range(6):
            await rec.record("default", _event("budget: cordon", t0 + i))
        await rec.record("default", _event("breaker-open: cordon", t0 + 7))
        found = await kube.list(
            EVENTS, namespace="default", field_selector=f"involvedObject.name={NODE}"
        )
        for e in found.items:
            await kube.delete(EVENTS, e["metadata"]["name"], namespace="default")
        return list(found.items)

    events = {e["message"]: e for e in asyncio.run(go())}
    assert set(events) == {"budget: cordon", "breaker-open: cordon"}
    repeated = events["budget: cordon"]
    assert repeated["count"] == 6
    assert repeated["firstTimestamp"] == rfc3339(1_800_000_000.0)
    assert repeated["lastTimestamp"] == rfc3339(1_800_000_005.0)
    assert events["breaker-open: cordon"]["count"] == 1
