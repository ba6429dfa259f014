"""``gpufleet cleanup``: stop gpufleet's writers, then take gpufleet off every Node it may
release (:mod:`gpufleet.domain.uninstall` decides which, and what).

The writers (the controller, the Slurm syncer and operator, the agents) are stopped and
their pods waited for first: a controller still running would put back what was just
removed, an agent re-asserts its conditions every minute. Each Node is patched with its
resourceVersion (its taint list is replaced whole), re-read and decided again on a
conflict, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import dra as dra_codec
from gpufleet.api import nodedata
from gpufleet.domain import uninstall
from gpufleet.domain.enrollment import rfc3339
from gpufleet.kubeapi.client import KubeApi
from gpufleet.kubeapi.errors import Conflict, NotFound
from gpufleet.kubeapi.events import event_body
from gpufleet.kubeapi.resources import (
    DEVICE_TAINT_RULES,
    NODES,
    PODS,
    RESOURCE_SLICES,
    Json,
    Patch,
    Resource,
)

DEPLOYMENTS = Resource("deployments", "apps/v1")
DAEMONSETS = Resource("daemonsets", "apps/v1")
Progress = Callable[[str], None]
CONFLICT_RETRIES = 5
CLEANUP = "gpufleet-cleanup"
"""The Event source of ``gpufleet cleanup``."""


@dataclass
class Report:
    """What the cleanup did: Nodes released (with what came off), kept (with why),
    untouched (nothing of ours on them), and writers stopped."""

    stopped: list[str] = field(default_factory=list)
    released: dict[str, list[str]] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    untouched: list[str] = field(default_factory=list)
    slurm_undrained: list[str] = field(default_factory=list)
    slurm_kept: dict[str, str] = field(default_factory=dict)
    dra_removed: list[str] = field(default_factory=list)
    """gpufleet's DRA objects deleted (``devicetaintrule/NAME``, ``resourceslice/NAME``)."""
    dry_run: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "dryRun": self.dry_run,
            "stopped": self.stopped,
            "released": self.released,
            "kept": self.kept,
            "untouched": len(self.untouched),
            "slurmUndrained": self.slurm_undrained,
            "slurmKept": self.slurm_kept,
            "draRemoved": self.dra_removed,
        }


STOPPED_LABEL = "gpufleet.io/stopped-for-uninstall"
"""A DaemonSet is stopped by asking its pods for a Node label no Node has."""


async def stop_writers(
    client: KubeApi,
    namespace: str,
    workloads: Sequence[str],
    *,
    timeout_s: float,
    progress: Progress,
) -> list[str]:
    """Stop each workload (``deployment/NAME``, ``daemonset/NAME``; a bare name is a
    Deployment) and wait until none of its pods is left: a Deployment is scaled to
    zero, a DaemonSet's pods get a node selector no Node matches.

    A workload that does not exist is skipped (a disabled component). Raises
    TimeoutError when pods outlive ``timeout_s``: cleaning under a running
    controller or agent would be undone."""
    stopped: list[str] = []
    selectors: list[str] = []
    for workload in workloads:
        kind, _, name = workload.rpartition("/")
        resource = DAEMONSETS if kind.lower() == "daemonset" else DEPLOYMENTS
        what = f"{'daemonset' if resource is DAEMONSETS else 'deployment'} {namespace}/{name}"
        try:
            obj = await client.get(resource, name, namespace=namespace)
        except NotFound:
            progress(f"{what}: not found, skipped")
            continue
        stop: dict[str, Any]
        if resource is DAEMONSETS:
            stop = {"spec": {"template": {"spec": {"nodeSelector": {STOPPED_LABEL: "true"}}}}}
        else:
            stop = {"spec": {"replicas": 0}}
        await client.patch(resource, name, stop, namespace=namespace)
        labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if labels:  # an empty selector would match every pod, this Job's own included
            selectors.append(",".join(f"{k}={v}" for k, v in sorted(labels.items())))
        stopped.append(what)
        progress(f"{what}: stopped")
    deadline = time.monotonic() + timeout_s
    for selector in selectors:
        while (await client.list(PODS, namespace=namespace, label_selector=selector)).items:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods {selector} still running after {timeout_s:g}s")
            await asyncio.sleep(1.0)
    return stopped


async def release_nodes(
    client: KubeApi,
    *,
    dry_run: bool,
    progress: Progress,
    report: Report,
    selector: str = "",
) -> None:
    """Decide and patch every Node (matching ``selector``; see the module docstring)."""
    for node in (await client.list(NODES, label_selector=selector)).items:
        name = node["metadata"]["name"]
        for _attempt in range(CONFLICT_RETRIES):
            plan = uninstall.cleanup(node, recorded(node))
            if plan.kept is not None:
                report.kept[name] = plan.kept
                progress(f"node {name}: kept as it is ({plan.kept})")
                if not dry_run:
                    await _tell(client, node, plan.kept)
                break
            if not plan.removed:
                report.untouched.append(name)
                break
            try:
                if not dry_run and plan.patch is not None:
                    await client.patch(NODES, name, plan.patch)
                if not dry_run and plan.status_patch is not None:
                    await client.patch(
                        NODES, name, plan.status_patch, status=True, kind=Patch.STRATEGIC
                    )
            except Conflict:
                node = await client.get(NODES, name)
                continue
            report.released[name] = list(plan.removed)
            verb = "would remove" if dry_run else "removed"
            progress(f"node {name}: {verb} {', '.join(plan.removed)}")
            break
        else:
            report.kept[name] = f"changed under us {CONFLICT_RETRIES} times; not cleaned"
            progress(f"node {name}: {report.kept[name]}")


async def remove_dra(client: KubeApi, *, dry_run: bool, progress: Progress, report: Report) -> None:
    """Delete gpufleet's DeviceTaintRules and the agents' ResourceSlices (labelled
    ``app.kubernetes.io/managed-by=gpufleet``; anyone else's stay). The slices go with the
    rules: a quarantined GPU is then allocatable by no claim, rather than by every one."""
    for resource, kind in (
        (DEVICE_TAINT_RULES, "devicetaintrule"),
        (RESOURCE_SLICES, "resourceslice"),
    ):
        try:
            items = (await client.list(resource, label_selector=dra_codec.RULE_SELECTOR)).items
        except NotFound:  # the cluster does not serve it: nothing of gpufleet's there
            continue
        for body in items:
            name = body["metadata"]["name"]
            if not dry_run:
                with contextlib.suppress(NotFound):
                    await client.delete(resource, name)
            report.dra_removed.append(f"{kind}/{name}")
            progress(f"{kind} {name}: {'would delete' if dry_run else 'deleted'}")


async def _tell(client: KubeApi, node: Json, why: str) -> None:
    """A Warning Event on a kept Node: the report outlives the hook's Job (helm deletes a
    hook that succeeded), and ``kubectl describe node`` is where a person looks."""
    meta = node["metadata"]
    event = event_body(
        involved={"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta.get("uid")},
        type_="Warning",
        reason="KeptOnUninstall",
        message=f"gpufleet was removed but left this node as it was: {why}. Return it to "
        "service by hand once it is repaired (remove the gpufleet.io taints, uncordon).",
        component=CLEANUP,
        instance=CLEANUP,
        namespace="default",
        first=rfc3339(time.time()),
    )
    await client.create_event("default", event)


def recorded(node: dict[str, Any]) -> uninstall.Recorded:
    """What the Node's record says, read by the one codec (signature not checked: the
    cleanup only reads the state to decide whether to keep the Node as it is)."""
    stored = nodedata.read_record(node)
    if stored.trust is nodedata.Trust.UNREADABLE:
        return uninstall.Recorded(unreadable=True)
    return uninstall.Recorded(state=stored.record.state if stored.record else None)
