"""kopf builds no diff base for Nodes (the controller only watches their events), and the
default one for every other kind (the FleetPolicy's daemon)."""

from __future__ import annotations

from typing import Any

import kopf

from gpufleet.lifecycle.operator import NodesWithoutDiffBase


def body(api_version: str, kind: str) -> kopf.Body:
    raw: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "x", "labels": {"a": "b"}, "annotations": {"c": "d"}},
        "spec": {"rules": [1, 2]},
        "status": {"conditions": []},
    }
    return kopf.Body(raw)


def test_a_node_gets_no_diff_base_and_other_kinds_the_default() -> None:
    ours, default = NodesWithoutDiffBase(), kopf.AnnotationsDiffBaseStorage()
    node = body("v1", "Node")
    assert ours.build(body=node) is None and ours.fetch(body=node) is None
    policy = body("gpufleet.io/v1alpha1", "FleetPolicy")
    assert ours.build(body=policy) == default.build(body=policy)
    assert ours.build(body=policy) is not None
    assert ours.fetch(body=policy) == default.fetch(body=policy)
