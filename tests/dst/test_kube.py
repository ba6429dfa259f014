"""The in-memory apiserver: the rules gpufleet's safety rests on."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.dst.kube import PDB_LABEL, ApiServer, node_body
from gpufleet.kubeapi import NODES, PODS, Conflict, Gone, Patch, TooManyRequests, custom

POLICIES = custom("fleetpolicies")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.timers: list[tuple[float, object]] = []

    def later(self, delay: float, fn: object) -> None:
        self.timers.append((self.t + delay, fn))

    def advance(self, dt: float) -> None:
        self.t += dt
        due = [fn for at, fn in self.timers if at <= self.t]
        self.timers = [(at, fn) for at, fn in self.timers if at > self.t]
        for fn in due:
            fn()  # type: ignore[operator]


@pytest.fixture
def api() -> tuple[ApiServer, Clock]:
    c = Clock()
    server = ApiServer(now=lambda: c.t, wall=lambda: 1e9 + c.t, later=c.later)
    server.create("kubelet", NODES, node_body("n1"), None)
    return server, c


def test_a_patch_with_a_stale_resource_version_is_refused(api: tuple[ApiServer, Clock]) -> None:
    server, _ = api
    rv = server.get(NODES, "n1")["metadata"]["resourceVersion"]
    server.patch("a", NODES, "n1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(Conflict):
        server.patch("b", NODES, "n1", {"metadata": {"resourceVersion": rv, "labels": {"y": "1"}}})
    assert "y" not in server.get(NODES, "n1")["metadata"]["labels"]


def test_strategic_patches_merge_conditions_by_type_and_replace_taints(
    api: tuple[ApiServer, Clock],
) -> None:
    server, _ = api
    server.patch(
        "agent",
        NODES,
        "n1",
        {"status": {"conditions": [{"type": "GpuProblem", "status": "True"}]}},
        status=True,
        kind=Patch.STRATEGIC,
    )
    server.patch("admin", NODES, "n1", {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})
    server.patch(
        "syncer",
        NODES,
        "n1",
        {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}},
        kind=Patch.STRATEGIC,
    )
    node = server.get(NODES, "n1")
    assert {c["type"] for c in node["status"]["conditions"]} == {"Ready", "GpuProblem"}
    assert [t["key"] for t in node["spec"]["taints"]] == ["b"]  # no merge key: replaced
    server.patch(
        "agent",
        NODES,
        "n1",
        {"status": {"conditions": [{"type": "GpuProblem", "$patch": "delete"}]}},
        status=True,
        kind=Patch.STRATEGIC,
    )
    assert [c["type"] for c in server.get(NODES, "n1")["status"]["conditions"]] == ["Ready"]


def test_the_status_subresource_and_the_generation(api: tuple[ApiServer, Clock]) -> None:
    server, _ = api
    server.create("admin", POLICIES, {"metadata": {"name": "p"}, "spec": {"paused": False}}, None)
    server.patch(
        "ctl", POLICIES, "p", {"status": {"ok": True}, "spec": {"paused": True}}, status=True
    )
    p = server.get(POLICIES, "p")
    assert p["spec"] == {"paused": False} and p["status"] == {"ok": True}
    assert p["metadata"]["generation"] == 1
    server.patch("admin", POLICIES, "p", {"spec": {"paused": True}, "status": {"ok": False}})
    p = server.get(POLICIES, "p")
    assert p["metadata"]["generation"] == 2 and p["status"] == {"ok": True}
    server.patch("ctl", NODES, "n1", {"spec": {"unschedulable": True}}, status=True)
    assert not server.get(NODES, "n1")["spec"].get("unschedulable")


def test_selectors(api: tuple[ApiServer, Clock]) -> None:
    server, _ = api
    server.create("kubelet", NODES, node_body("n2", pool="b"), None)
    assert [
        n["metadata"]["name"] for n in server.list(NODES, label_selector="gpufleet.io/pool=b").items
    ] == ["n2"]
    assert len(server.list(NODES, label_selector="gpufleet.io/pool!=b").items) == 1
    assert len(server.list(NODES, field_selector="metadata.name=n1").items) == 1
    assert not server.list(NODES, label_selector="missing").items


def test_watches_deliver_in_order_late_and_say_deleted_when_a_selector_stops_matching() -> None:
    c = Clock()
    delays = iter([2.0, 0.0, 0.0, 0.0])
    server = ApiServer(
        now=lambda: c.t, wall=lambda: c.t, later=c.later, watch_delay=lambda: (next(delays), False)
    )
    server.create("kubelet", NODES, node_body("n1"), None)
    rv = server.list(NODES).resource_version
    sub = server.subscribe(NODES, rv, None, "x=1", "")
    server.patch("a", NODES, "n1", {"metadata": {"labels": {"x": "1"}}})  # 2 s late
    server.patch("a", NODES, "n1", {"metadata": {"labels": {"x": "2"}}})  # not before it
    assert sub.queue == []
    c.advance(2.0)
    assert [e.type for e in sub.queue] == ["ADDED", "DELETED"]


def test_a_watch_from_a_compacted_version_is_gone(api: tuple[ApiServer, Clock]) -> None:
    server, _ = api
    server._history.clear()
    server.patch("a", NODES, "n1", {"metadata": {"labels": {"x": "1"}}})
    server.patch("a", NODES, "n1", {"metadata": {"labels": {"x": "2"}}})
    server._history.pop(0)
    with pytest.raises(Gone):
        server.subscribe(NODES, "1", None, "", "")


def test_eviction_respects_the_budget_and_terminates_gracefully(
    api: tuple[ApiServer, Clock],
) -> None:
    server, c = api
    pod = {"metadata": {"name": "p", "labels": {PDB_LABEL: "block"}}, "spec": {"nodeName": "n1"}}
    server.create("user", PODS, pod, "w")
    server.pdb_open_at = 10.0
    with pytest.raises(TooManyRequests):
        server.evict("ctl", "w", "p")
    c.advance(10.0)
    server.evict("ctl", "w", "p")
    assert server.get(PODS, "p", "w")["metadata"]["deletionTimestamp"]
    c.advance(server.pod_grace_s)
    assert server.find(PODS, "p", "w") is None


def test_every_write_is_reported_with_its_identity(api: tuple[ApiServer, Clock]) -> None:
    server, _ = api
    seen: list[tuple[str, str]] = []
    server.on_write.append(lambda w: seen.append((w.identity, w.verb)))
    server.patch("ctl", NODES, "n1", {"metadata": {"annotations": {"gpufleet.io/x": "1"}}})
    server.patch("ctl", NODES, "n1", {"metadata": {"annotations": {"gpufleet.io/x": "1"}}})  # no-op
    assert seen == [("ctl", "patch")]


def test_the_client_is_a_kubeport() -> None:
    from gpufleet.dst.kube import KubeClient
    from gpufleet.kubeapi import KubePort

    port: type[KubePort] = KubeClient
    assert asyncio.iscoroutinefunction(port.get)
