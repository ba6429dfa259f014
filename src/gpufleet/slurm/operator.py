"""The SlurmCluster operator: config rendering, ConfigMap, reconfigure, status.

One reconcile of one SlurmCluster, as ordered steps:

1. validate the spec with the same pydantic model the CRD schema came from
   (a bad spec sets ``Ready=False, reason=InvalidSpec`` and stops: nothing is
   rendered from a spec we do not understand; a value the renderer will not
   write, e.g. a Node address with a line break, sets ``reason=UnsafeValue``; a
   partition whose pools select no Node sets ``reason=PartitionWithoutNodes``:
   in both cases nothing is applied and slurmctld keeps its last config. Only the
   very first config, before any Node of a pool joined, is applied with that
   partition empty (``Nodes=""``), still ``Ready=False``, so that slurmctld can start);
2. select the Nodes of each pool, label them ``gpufleet.io/slurm-cluster``
   (the slurmd DaemonSet's node selector) and unlabel Nodes that left;
3. read the fabric topology of the members from their labels (:mod:`gpufleet.domain.topology`):
   write the per-level labels Kubernetes schedulers read (when asked), post an Event on
   each Node whose labels contradict each other, set ``TopologyConsistent``;
   render slurm.conf, gres.conf and topology.conf (or .yaml); server-side apply the
   ConfigMap ``<name>-slurm-config`` (owned by the SlurmCluster);
4. if the rendered hash differs from ``status.configHash``: write the files
   (when ``conf_dir`` is set: the controller pod mounts the shared config
   volume there) and run ``scontrol reconfigure``; after a failure, not again
   before ``reconfigure_retry_s`` (``Ready=False, reason=ReconfigurePending``);
5. status: nodes by Slurm state (from slurmrestd), hash, ``Ready`` condition
   (``False, reason=NodesNotInSlurm`` while slurmctld does not know a member Node: its
   config not loaded yet); written only when it changed.

After each pass over the SlurmClusters, the slurmd roll (when given one,
:mod:`gpufleet.slurm.slurmd_roll`) replaces outdated slurmd pods the Slurm way.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.api import conditions
from gpufleet.api import slurmcluster as crd
from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.domain import slurm_sync, topology, well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.kubeapi import NODES, ApiError, KubePort, Patch, Resource, custom, get_or_none
from gpufleet.kubeapi.events import EventRecorder
from gpufleet.slurm import render, topology_labels
from gpufleet.slurm.errors import SlurmError
from gpufleet.slurm.ports import ScontrolPort, SlurmRestPort
from gpufleet.slurm.render import node_info as node_info
from gpufleet.slurm.slurmd_roll import SlurmdRoll

log = logging.getLogger("gpufleet.slurm.operator")
SLURM_CLUSTERS = custom(crd.PLURAL)
CONFIGMAPS = Resource("configmaps")


def state_bucket(view: slurm_sync.SlurmView) -> str:
    """The one word ``sinfo`` would use: drained, draining, down, idle, mixed, allocated..."""
    if view.drained:
        busy = view.state in ("mixed", "allocated") or "COMPLETING" in view.flags
        return "draining" if busy else "drained"
    if view.down:
        return "down"
    return view.state or "unknown"


COLUMN_STATES = ("idle", "drained")
"""States the SlurmCluster's printer columns show: always present (0 when none), so the
IDLE and DRAINED columns of ``kubectl get slurmclusters`` are never blank."""


def nodes_by_state(views: Mapping[str, slurm_sync.SlurmView], names: list[str]) -> dict[str, int]:
    counts = Counter(state_bucket(views[n]) if n in views else "missing" for n in names)
    return dict(sorted({**dict.fromkeys(COLUMN_STATES, 0), **counts}.items()))


@dataclass(frozen=True)
class OperatorSettings:
    interval_s: float = 5.0
    """Seconds between reconciles of every SlurmCluster (Node changes show up within it)."""
    conf_dir: Path | None = None
    """Where slurmctld reads its config (shared volume); None: ConfigMap only."""
    reconfigure: bool = True
    """Run ``scontrol reconfigure`` after a change. False where slurmctld reloads by itself
    once the new files reach it (the chart: a ConfigMap volume is updated by the kubelet up
    to a minute later, so a reconfigure from here could make slurmctld read the old files)."""
    reconfigure_retry_s: float = 120.0
    """After a reconfigure failed, how long before the next try (not every pass). Slurm
    24.11 restarts slurmctld on every reconfigure; one that failed by timing out may have
    been delivered all the same, and a restarting slurmctld is exactly when the next one
    fails again. Retried every pass, a slow slurmctld (software emulation, loaded) was
    restarted every minute and never allocated a job."""


class ClusterOperator:
    def __init__(
        self,
        *,
        kube: KubePort,
        scontrol: ScontrolPort | None,
        rest: SlurmRestPort | None,
        settings: OperatorSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        roll: SlurmdRoll | None = None,
    ) -> None:
        self.kube, self.scontrol, self.rest = kube, scontrol, rest
        self.settings = settings or OperatorSettings()
        self.clock = clock
        self.roll = roll
        """Replaces the chart's outdated slurmd pods (None: no DaemonSet to roll)."""
        self._retry_at: dict[tuple[str, str], float] = {}
        """Per SlurmCluster, when a failed reconfigure may be tried again."""
        self.topology = topology_labels.TopologyReporter(kube, EventRecorder(kube, clock=clock))
        """Scheduler labels and contradiction Events from each cluster's topology."""

    async def reconcile(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Reconcile one SlurmCluster; returns the status written (None if it is gone)."""
        obj = await get_or_none(self.kube, SLURM_CLUSTERS, name, namespace=namespace)
        if obj is None:
            return None
        old_status = obj.get("status") or {}
        generation = int(obj["metadata"].get("generation", 0))
        status: dict[str, Any] = {"observedGeneration": generation}
        try:
            spec = crd.SlurmClusterSpec.model_validate(obj.get("spec") or {})
        except ValidationError as e:
            status["conditions"] = _ready(
                old_status, "False", "InvalidSpec", str(e), self.clock.now(), generation
            )
            return await self._write_status(namespace, name, old_status, status)

        items = (await self.kube.list(NODES)).items
        infos = [node_info(n) for n in items]
        pools = render.assign(spec, infos)
        members = sorted(n.name for m in pools.values() for n in m)
        was_member = _members_of(items, f"{namespace}.{name}")
        await self._label_members(namespace, name, items, set(members))
        selected = [n for m in pools.values() for n in m]
        fabric = render.fabric_of(spec, selected) if spec.topology.enabled else None
        await self.topology.apply(
            items,
            set(members),
            was_member,
            fabric or topology.FabricTopology(()),
            render.scheduler_keys(spec) if fabric is not None else None,
            self.clock.now(),
        )
        kept = old_status.get("configHash")
        empty: render.EmptyPartition | None = None
        try:
            data = render.render_all(spec, selected, fabric=fabric)
        except render.EmptyPartition as e:
            if kept:  # a good config exists: slurmctld keeps it, its nodes stay in Slurm
                return await self._not_rendered(namespace, name, old_status, status, e, kept)
            # The first config (no Node joined yet): slurmctld starts with the partition
            # empty; Ready stays False and says which partition waits for nodes.
            empty = e
            try:
                data = render.render_all(spec, selected, empty_partitions=True, fabric=fabric)
            except render.NotRendered as other:
                return await self._not_rendered(namespace, name, old_status, status, other, kept)
        except render.NotRendered as e:
            return await self._not_rendered(namespace, name, old_status, status, e, kept)
        digest = render.config_hash(data)
        await self._apply_configmap(obj, data, digest)
        status["configHash"] = digest
        status["nodes"] = len(members)
        status["lastReconfigure"] = old_status.get("lastReconfigure", "")
        reason, message = "Reconciled", f"{len(members)} nodes, config {digest}"
        if digest != old_status.get("configHash"):
            key, now = (namespace, name), self.clock.now()
            wait = self._retry_at.get(key, now) - now
            if wait > 0:
                reason = "ReconfigurePending"
                message = f"the last reconfigure failed; next try in {wait:.0f} s"
                status["configHash"] = old_status.get("configHash", "")
            else:
                try:
                    if await self._push_config(data):
                        status["lastReconfigure"] = rfc3339(now)
                    self._retry_at.pop(key, None)
                except (SlurmError, OSError) as e:
                    reason, message = "ReconfigureFailed", str(e)[:1000]
                    status["configHash"] = old_status.get("configHash", "")
                    self._retry_at[key] = now + self.settings.reconfigure_retry_s
        if self.rest is not None:
            try:
                if self.rest.version is None:
                    await self.rest.connect()
                status["nodesByState"] = nodes_by_state(await self.rest.nodes(), members)
                unknown = status["nodesByState"].get("missing", 0)
                if unknown and reason == "Reconciled":
                    # Rendered, but slurmctld has not read it yet (a reconfigure to come, or
                    # the new files not yet in its pod): its users cannot get those nodes.
                    reason = "NodesNotInSlurm"
                    message = (
                        f"slurmctld does not know {unknown} of the {len(members)} nodes yet "
                        f"(config {digest} not loaded)"
                    )
            except SlurmError as e:
                reason, message = "SlurmUnavailable", str(e)[:1000]
                status["nodesByState"] = old_status.get("nodesByState", {})
        if empty is not None:
            reason = empty.reason
            message = f"{empty}; rendered with it empty (no config was applied before)"
        ready: conditions.Status = "True" if reason == "Reconciled" else "False"
        status["conditions"] = _ready(
            old_status, ready, reason, message, self.clock.now(), generation
        )
        if fabric is not None:
            consistent, said = topology_labels.summary(fabric)
            status["conditions"] = conditions.set_condition(
                status["conditions"],
                "TopologyConsistent",
                "True" if consistent else "False",
                "Consistent" if consistent else topology.REASON,
                said,
                now=self.clock.now(),
                observed_generation=generation,
            )
        return await self._write_status(namespace, name, old_status, status)

    async def _not_rendered(
        self,
        namespace: str,
        name: str,
        old_status: Mapping[str, Any],
        status: dict[str, Any],
        e: render.NotRendered,
        kept: str | None,
    ) -> dict[str, Any]:
        """Nothing applied: ``Ready=False`` with the renderer's reason; slurmctld keeps its
        last config (or none)."""
        message = f"{e}; slurmctld keeps " + (
            f"its last config ({kept})" if kept else "no config: none was rendered yet"
        )
        log.warning("slurmcluster=%s/%s not rendered: %s", namespace, name, message)
        generation = int(status.get("observedGeneration") or 0)
        status["conditions"] = _ready(
            old_status, "False", e.reason, message, self.clock.now(), generation
        )
        return await self._write_status(namespace, name, old_status, status)

    async def _label_members(
        self, namespace: str, name: str, items: list[dict[str, Any]], members: set[str]
    ) -> None:
        value = f"{namespace}.{name}"
        for node in items:
            node_name = node["metadata"]["name"]
            has = (node["metadata"].get("labels") or {}).get(well_known.LABEL_SLURM_CLUSTER)
            want = value if node_name in members else (None if has == value else has)
            if has != want:
                patch = {"metadata": {"labels": {well_known.LABEL_SLURM_CLUSTER: want}}}
                await self.kube.patch(NODES, node_name, patch, kind=Patch.STRATEGIC)

    async def _apply_configmap(self, obj: Mapping[str, Any], data: dict[str, str], h: str) -> None:
        meta = obj["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{meta['name']}-slurm-config",
                "namespace": meta["namespace"],
                "labels": {"app.kubernetes.io/managed-by": "gpufleet"},
                "annotations": {f"{well_known.GROUP}/config-hash": h},
                "ownerReferences": [
                    {
                        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
                        "kind": crd.KIND,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "data": data,
        }
        await self.kube.apply(
            CONFIGMAPS, f"{meta['name']}-slurm-config", body, namespace=meta["namespace"]
        )

    async def _push_config(self, data: Mapping[str, str]) -> bool:
        """Writes the files to ``conf_dir`` (if set) and reconfigures (if set); True when a
        reconfigure was sent."""
        conf_dir = self.settings.conf_dir
        if conf_dir is not None:
            conf_dir.mkdir(parents=True, exist_ok=True)
            for fname, text in data.items():
                tmp = conf_dir / f".{fname}.tmp"
                tmp.write_text(text)
                os.replace(tmp, conf_dir / fname)
        if self.scontrol is not None and self.settings.reconfigure:
            await self.scontrol.reconfigure()
            log.info("scontrol reconfigure done")
            return True
        return False

    async def _write_status(
        self, namespace: str, name: str, old: Mapping[str, Any], new: dict[str, Any]
    ) -> dict[str, Any]:
        if _comparable(old) != _comparable(new):
            await self.kube.patch(
                SLURM_CLUSTERS, name, {"status": new}, namespace=namespace, status=True
            )
        return new

    async def run(self) -> None:
        while True:
            try:
                listing = await self.kube.list(SLURM_CLUSTERS)
                for item in listing.items:
                    meta = item["metadata"]
                    await self.reconcile(meta["namespace"], meta["name"])
            except (ApiError, SlurmError) as e:
                log.warning("reconcile pass failed: %s", e)
            if self.roll is not None:
                try:
                    await self.roll.run_pass()
                except (ApiError, SlurmError) as e:
                    log.warning("slurmd roll pass failed: %s", e)
            await asyncio.sleep(self.settings.interval_s)


def _members_of(items: list[dict[str, Any]], value: str) -> set[str]:
    """The Nodes labelled as this SlurmCluster's before this pass."""
    return {
        n["metadata"]["name"]
        for n in items
        if (n["metadata"].get("labels") or {}).get(well_known.LABEL_SLURM_CLUSTER) == value
    }


def _ready(
    old: Mapping[str, Any],
    status: conditions.Status,
    reason: str,
    message: str,
    now: float,
    generation: int,
) -> list[dict[str, Any]]:
    """The status conditions with ``Ready`` set (metav1 semantics, api.conditions): others
    are kept, lastTransitionTime moves only when the status flips."""
    return conditions.set_condition(
        old.get("conditions"),
        "Ready",
        status,
        reason,
        message,
        now=now,
        observed_generation=generation,
    )


def _comparable(status: Mapping[str, Any]) -> Any:
    return {k: v for k, v in status.items() if k != "lastReconfigure"}
