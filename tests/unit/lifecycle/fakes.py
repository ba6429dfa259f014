"""An in-memory :class:`~gpufleet.kubeapi.KubePort`: Nodes, Pods, Secrets, custom objects, Events.

It answers what the apiserver would for the calls it models (NotFound for a
missing object, Conflict for a stale ``resourceVersion`` or an existing name,
label selectors on lists) and raises NotImplementedError for the rest, so a
unit test never passes because a call silently did nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpufleet.api import fleetpolicy, nodedata
from gpufleet.api.nodedata import SigningKey
from gpufleet.clock import Clock
from gpufleet.domain.policy import Policy, SlurmWait, default_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.gate import BmcFactory, StaticFence
from gpufleet.kubeapi import (
    EVENTS,
    NODES,
    PODS,
    SECRETS,
    Conflict,
    Json,
    KubePort,
    NotFound,
    ObjectList,
    Patch,
    Resource,
)
from gpufleet.lifecycle import nodes
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from ..fakes import UnmodelledKube


class FakeKube(UnmodelledKube):
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.custom: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.patches = 0
        self._rv = 0
        # The cluster as installed: the FleetPolicy the controller saves its status in.
        self.custom[(fleetpolicy.PLURAL, "default")] = {
            "metadata": {"name": "default"},
            "spec": {},
        }

    def add_node(self, body: dict[str, Any]) -> None:
        self._rv += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self.nodes[body["metadata"]["name"]] = body

    # ------------------------------------------------------------------ helpers

    def _next_rv(self, node: Mapping[str, Any]) -> str:
        """A Node's next resourceVersion: above every one given out, and above the one a
        test's own change gave it (:func:`changed`)."""
        self._rv = max(self._rv, int(node["metadata"]["resourceVersion"])) + 1
        return str(self._rv)

    def _missing(self, resource: Resource, name: str) -> NotFound:
        return NotFound(f"get {resource} {name}", 404, "not found")

    def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        for p in self.pods:
            meta = p["metadata"]
            if meta["name"] == name and meta.get("namespace", namespace) == namespace:
                return p
        raise self._missing(PODS, f"{namespace}/{name}")

    # --------------------------------------------------------------------- port

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        if resource == NODES:
            if name not in self.nodes:
                raise self._missing(resource, name)
            return copy.deepcopy(self.nodes[name])
        if resource == SECRETS:
            if (str(namespace), name) not in self.secrets:
                raise self._missing(resource, f"{namespace}/{name}")
            return copy.deepcopy(self.secrets[(str(namespace), name)])
        if resource == PODS:
            return copy.deepcopy(self._pod(str(namespace), name))
        key = (resource.plural, name)
        if resource.version != "v1" and key in self.custom:
            return copy.deepcopy(self.custom[key])
        if resource.version != "v1":
            raise self._missing(resource, name)
        raise NotImplementedError(f"get {resource}")

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        if resource == NODES and not field_selector:
            items = list(self.nodes.values())
        elif resource == PODS and field_selector.startswith("spec.nodeName="):
            node = field_selector.partition("=")[2]
            items = [p for p in self.pods if p["spec"].get("nodeName") == node]
        elif resource.version != "v1" and not field_selector:
            items = [v for (plural, _), v in self.custom.items() if plural == resource.plural]
        else:
            raise NotImplementedError(f"list {resource} ({field_selector})")
        items = [copy.deepcopy(o) for o in items if _labels_match(o, label_selector)]
        return ObjectList(items, str(self._rv))

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        name = str(body["metadata"]["name"])
        if resource == SECRETS:
            key = (str(namespace), name)
            if key in self.secrets:
                raise Conflict(f"create {resource} {name}", 409, "already exists")
            self.secrets[key] = copy.deepcopy(dict(body))
            return dict(body)
        if resource == EVENTS:
            self.events.append(dict(body))
            return dict(body)
        if resource.version == "v1":
            raise NotImplementedError(f"create {resource}")
        ckey = (resource.plural, name)
        if ckey in self.custom:
            raise Conflict(f"create {resource} {name}", 409, "already exists")
        stored = copy.deepcopy(dict(body))
        self._rv += 1
        stored.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self.custom[ckey] = stored
        return copy.deepcopy(stored)

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
        if resource == NODES:
            if name not in self.nodes:
                raise self._missing(resource, name)
            if kind is Patch.STRATEGIC:
                return self._strategic_node(name, patch)
            node = self.nodes[name]
            rv = patch.get("metadata", {}).get("resourceVersion")
            if rv is not None and rv != node["metadata"]["resourceVersion"]:
                raise Conflict(f"patch node {name}", 409, "changed")
            self.patches += 1
            merged = nodes.apply_merge_patch(node, patch)
            merged["metadata"]["resourceVersion"] = self._next_rv(node)
            self.nodes[name] = merged
            return copy.deepcopy(merged)
        if resource == EVENTS and kind is Patch.MERGE:
            for i, event in enumerate(self.events):
                if event.get("metadata", {}).get("name") == name:
                    self.events[i] = nodes.apply_merge_patch(event, patch)
                    return copy.deepcopy(self.events[i])
            raise self._missing(resource, name)
        if resource.version == "v1" or kind is not Patch.MERGE:
            raise NotImplementedError(f"patch {resource}")
        key = (resource.plural, name)
        if key not in self.custom:
            raise self._missing(resource, name)
        obj = self.custom[key]
        rv = (patch.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != (obj.get("metadata") or {}).get("resourceVersion"):
            raise Conflict(f"patch {resource} {name}", 409, "changed")
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        if status:
            # The status subresource ignores everything but status.
            obj["status"] = nodes.apply_merge_patch(obj.get("status") or {}, patch["status"])
        else:
            keep = obj.get("status")
            obj = nodes.apply_merge_patch(obj, {k: v for k, v in patch.items() if k != "status"})
            if keep is not None:
                obj["status"] = keep
            self.custom[key] = obj
        return copy.deepcopy(obj)

    def _strategic_node(self, name: str, patch: Mapping[str, Any]) -> Json:
        """Node conditions merge by ``type`` (the only strategic patch gpufleet sends)."""
        if set(patch) != {"status"} or set(patch["status"]) != {"conditions"}:
            raise NotImplementedError("strategic patch other than status.conditions")
        node = self.nodes[name]
        conds = {c["type"]: c for c in node.setdefault("status", {}).get("conditions") or []}
        for c in patch["status"]["conditions"]:
            if c.get("$patch") == "delete":
                conds.pop(c["type"], None)
            else:
                conds[c["type"]] = {**conds.get(c["type"], {}), **c}
        node["status"]["conditions"] = list(conds.values())
        node["metadata"]["resourceVersion"] = self._next_rv(node)
        self.patches += 1
        return copy.deepcopy(node)

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        if resource == SECRETS:
            if self.secrets.pop((str(namespace), name), None) is None:
                raise self._missing(resource, f"{namespace}/{name}")
        elif resource == PODS:
            self.pods.remove(self._pod(str(namespace), name))
        elif resource.version != "v1":
            if self.custom.pop((resource.plural, name), None) is None:
                raise self._missing(resource, name)
        else:
            raise NotImplementedError(f"delete {resource}")

    async def evict(self, namespace: str, name: str) -> None:
        self.pods.remove(self._pod(namespace, name))

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        pod = self._pod(namespace, name)
        if pod["metadata"].get("uid", uid) != uid or pod["spec"].get("nodeName"):
            raise Conflict(f"bind pod {namespace}/{name}", 409, "not the pod, or bound")
        pod["spec"]["nodeName"] = node

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        name = event.get("metadata", {}).get("name")
        if name is not None and any(e.get("metadata", {}).get("name") == name for e in self.events):
            raise Conflict(f"create event {name}", 409, "already exists")
        self.events.append(copy.deepcopy(dict(event)))


def _labels_match(obj: Mapping[str, Any], selector: str) -> bool:
    """Equality-based selectors (``k=v,k2=v2``), the only kind gpufleet sends."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


_port: type[KubePort] = FakeKube  # mypy checks the fake against the port here

KEY = SigningKey.of(b"unit-test-record-key-0123456789")
"""A record signing key for tests that build patches themselves."""

FENCE = StaticFence("unit-test-controller")
"""The unit tests' controller acts (it holds its lease); leadership is tested on its own."""


def controller(
    kube: KubePort,
    settings: ControllerSettings | None = None,
    *,
    clock: Clock,
    bmcs: BmcFactory | None = None,
) -> Controller:
    """A controller on the in-memory API that holds its lease (``FENCE``)."""
    return Controller(kube, settings, clock=clock, fence=FENCE, bmcs=bmcs)


def signed(ctl: Controller, record: NodeRecord) -> dict[str, str]:
    """The record and its signature by ``ctl``'s key, as the controller writes them
    (a test that puts a record on a Node by hand must sign it, or it is not trusted)."""
    return nodedata.record_annotations(record, ctl.nodes.keys[0])


def k8s_policy() -> Policy:
    """The default policy for a fleet without Slurm (``drain.slurm: never``): the unit
    tests run no syncer, so a Slurm node would wait for Slurm's word forever."""
    policy = default_policy()
    return policy.model_copy(
        update={"drain": policy.drain.model_copy(update={"slurm": SlurmWait.NEVER})}
    )


def node(name: str, *, pool: str = "default", unschedulable: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"gpufleet.io/pool": pool},
            "annotations": {},
        },
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def changed(body: dict[str, Any]) -> None:
    """A test changed the stored Node in place: a new resourceVersion, as the apiserver
    gives every write (the controller's own write's echo is not decided again: decision
    0252)."""
    meta = body.setdefault("metadata", {})
    meta["resourceVersion"] = str(int(meta.get("resourceVersion", "0")) + 1)


def set_annotation(body: dict[str, Any], report: Any) -> None:
    """What the agent writes for data (domain.node_reports): an annotation."""
    body["metadata"].setdefault("annotations", {})[report.key] = report.value
    changed(body)


def set_condition(body: dict[str, Any], cond: Any) -> None:
    conds = [c for c in body["status"].get("conditions", []) if c["type"] != cond.type]
    conds.append(
        {"type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message}
    )
    body["status"]["conditions"] = conds
    changed(body)
