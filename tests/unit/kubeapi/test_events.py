"""The one Event builder: what every product's Events look like to ``kubectl describe``."""

from __future__ import annotations

from gpufleet.kubeapi.events import event_body

NODE = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}


def test_unnamed_event_is_named_by_the_apiserver_after_its_object() -> None:
    e = event_body(
        involved=NODE,
        type_="Warning",
        reason="Cordoned",
        message="x" * 2000,
        component="gpufleet-controller",
        instance="gpufleet-controller",
        namespace="default",
        first="2026-11-24T00:00:00Z",
    )
    assert e["metadata"] == {"generateName": "n1.", "namespace": "default"}
    assert e["involvedObject"] == NODE and e["count"] == 1
    assert e["lastTimestamp"] == e["firstTimestamp"] == "2026-11-24T00:00:00Z"
    assert len(e["message"]) == 1000
    assert e["source"] == {"component": "gpufleet-controller"}


def test_named_event_with_a_host_and_its_own_message_limit() -> None:
    e = event_body(
        involved=NODE,
        type_="Normal",
        reason="RequestRefused",
        message="y" * 2000,
        component="gpufleet-agent",
        instance="n1",
        namespace="default",
        first="2026-11-24T00:00:00Z",
        last="2026-11-24T00:00:05Z",
        name="n1.abc",
        host="n1",
        max_message=1024,
    )
    assert e["metadata"] == {"name": "n1.abc", "namespace": "default"}
    assert e["source"] == {"component": "gpufleet-agent", "host": "n1"}
    assert e["reportingInstance"] == "n1" and e["lastTimestamp"] == "2026-11-24T00:00:05Z"
    assert len(e["message"]) == 1024


def test_an_object_without_a_name_is_named_by_its_kind() -> None:
    e = event_body(
        involved={"apiVersion": "gpufleet.io/v1alpha1", "kind": "FleetPolicy"},
        type_="Normal",
        reason="BreakerReset",
        message="closed",
        component="c",
        instance="c",
        namespace="default",
        first="2026-11-24T00:00:00Z",
    )
    assert e["metadata"]["generateName"] == "fleetpolicy."
