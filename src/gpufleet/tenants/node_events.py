"""Node faults told to the tenants whose work they touch: an Event in each of the tenant's
namespaces when a node it owns or runs pods on is taken out for repair (decision 0288).

The tenant controller calls :meth:`NodeEventCopier.copy` once per reconcile while it leads.
The decisions are :mod:`gpufleet.domain.tenant_events`; this reads the NodeRemediations,
the Nodes and the tenants' Pods and writes the Events. Each Event is named after its
incident and tenant: written once, a restarted controller's second write is refused as a
duplicate (409) and not repeated. An Event never holds up the reconcile: a failed read or
write is logged and tried again next time.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Sequence

from gpufleet.domain import tenancy, tenant_events
from gpufleet.domain.tenancy import Tenant
from gpufleet.kubeapi.errors import ApiError, Conflict
from gpufleet.kubeapi.events import event_body
from gpufleet.kubeapi.port import KubePort
from gpufleet.kubeapi.resources import NODES, PODS, Json, custom
from gpufleet.tenants.metrics import TenantMetrics

log = logging.getLogger(__name__)

COMPONENT = "gpufleet-tenant-controller"
NODE_REMEDIATIONS = custom("noderemediations")


class NodeEventCopier:
    """Writes each incident's Events into its tenants' namespaces, once."""

    def __init__(
        self,
        kube: KubePort,
        *,
        instance: str,
        metrics: TenantMetrics | None = None,
        remember: int = 4096,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.instance = instance
        self._written: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._remember = remember

    async def copy(self, tenants: Sequence[Tenant]) -> int:
        """Write the Events of the open incidents not written yet; how many were written."""
        if not tenants:
            return 0
        try:
            incidents = [
                i
                for i in map(
                    tenant_events.incident_of, (await self.kube.list(NODE_REMEDIATIONS)).items
                )
                if i is not None
            ]
            if not incidents:
                return 0
            touched = {i.node for i in incidents}
            labels = {
                n["metadata"]["name"]: dict(n["metadata"].get("labels") or {})
                for n in (await self.kube.list(NODES)).items
                if n["metadata"]["name"] in touched
            }
            pods_on: dict[str, list[tuple[str, str]]] = defaultdict(list)
            for ns in sorted({ns for t in tenants for ns in t.namespaces}):
                for pod in (await self.kube.list(PODS, namespace=ns)).items:
                    node = (pod.get("spec") or {}).get("nodeName")
                    if node in touched:
                        pods_on[node].append((ns, pod["metadata"]["name"]))
        except ApiError as exc:
            log.warning("tenants' node events: cannot read the incidents: %s", exc)
            return 0
        wrote = 0
        for ev in tenant_events.node_events(tenants, incidents, labels, pods_on):
            key = (ev.namespace, ev.name)
            if key in self._written:
                continue
            try:
                await self.kube.create_event(ev.namespace, self._body(ev))
                wrote += 1
                if self.metrics is not None:
                    self.metrics.count_events(ev.tenant, 1)
            except Conflict:
                pass  # written before (by this controller before a restart, or the other replica)
            except ApiError as exc:
                log.warning("tenant %s: Event in %s not written: %s", ev.tenant, ev.namespace, exc)
                continue
            self._written[key] = None
            while len(self._written) > self._remember:
                self._written.popitem(last=False)
        return wrote

    def _body(self, ev: tenant_events.TenantNodeEvent) -> Json:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # The Node is the object the Event is about; an Event lives in one namespace, so the
        # reference carries the tenant's namespace (core/v1 requires them to agree).
        body = event_body(
            involved={
                "apiVersion": "v1",
                "kind": "Node",
                "name": ev.node,
                "namespace": ev.namespace,
            },
            type_="Warning",
            reason=tenant_events.REASON,
            message=ev.message,
            component=COMPONENT,
            instance=self.instance,
            namespace=ev.namespace,
            first=now,
            name=ev.name,
        )
        # Labelled so `gpufleet status --tenant` finds the incidents that touched the tenant.
        body["metadata"]["labels"] = {
            **tenancy.labels(ev.tenant),
            tenant_events.LABEL_INCIDENT: ev.incident,
        }
        return body
