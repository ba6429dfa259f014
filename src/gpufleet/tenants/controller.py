"""The tenant controller's loop: Tenants in, quotas, bindings, policies and Slurm accounts out.

Each pass reads every Tenant, the pods of their namespaces, the objects gpufleet
wrote for tenants and (with a Slurm port) Slurm's accounts and running GPUs, lets
``gpufleet.domain.tenancy`` decide, writes only the differences and each Tenant's
status. A pass runs when a Tenant or a pod changes (watches) and every
``interval_s`` (Slurm has no watch). It acts only while ``may_act()`` (the Lease).
Nothing here stops a pod or a job: a limit below use blocks new work only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.api import conditions as cond
from gpufleet.api import tenant as tenant_api
from gpufleet.api.names import API_VERSION
from gpufleet.domain import tenancy, tenant_nodes, well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.tenancy import SlurmAccount, SlurmTenancy, Tenant
from gpufleet.kubeapi import ApiError, Conflict, KubePort, NotFound, Resource, custom
from gpufleet.kubeapi.events import event_body
from gpufleet.kubeapi.resources import NODES, PODS
from gpufleet.slurm.nodes import addresses_of
from gpufleet.tenants.metrics import TenantMetrics
from gpufleet.tenants.node_events import NodeEventCopier
from gpufleet.tenants.ports import SlurmAssociations, TenantReservations
from gpufleet.waits import wait_set

log = logging.getLogger("gpufleet.tenants")

TENANTS = custom(tenant_api.PLURAL)
RESOURCES: Mapping[str, Resource] = {
    "ResourceQuota": Resource("resourcequotas"),
    "RoleBinding": Resource("rolebindings", "rbac.authorization.k8s.io/v1"),
    "NetworkPolicy": Resource("networkpolicies", "networking.k8s.io/v1"),
}
API_VERSIONS = {kind: r.version for kind, r in RESOURCES.items()}
OWNED_SELECTOR = f"{well_known.LABEL_MANAGED_BY}={tenancy.MANAGED_BY},{tenancy.LABEL_TENANT}"
COMPONENT = "gpufleet-tenant-controller"
FIELD_MANAGER = "gpufleet-tenants"


@dataclass(frozen=True)
class TenantSettings:
    interval_s: float = 10.0
    role: str = tenancy.DEFAULT_ROLE
    dry_run: bool = False
    coalesce_s: float = 0.5
    """After a wake, wait this long so that a burst of pod changes makes one pass."""


class TenantController:
    """One acting replica's loop (see the module docstring); handed only its ports."""

    def __init__(
        self,
        kube: KubePort,
        slurm: SlurmAssociations | None,
        settings: TenantSettings = TenantSettings(),
        *,
        may_act: Callable[[], bool] = lambda: True,
        now: Callable[[], float] = time.time,
        metrics: TenantMetrics | None = None,
        node_events: NodeEventCopier | None = None,
        reservations: TenantReservations | None = None,
    ) -> None:
        self.kube = kube
        self.reservations = reservations
        self.metrics = metrics
        self.node_events = node_events
        self.slurm = slurm
        self.settings = settings
        self.may_act = may_act
        self.now = now
        self.wake = asyncio.Event()
        self.passes = 0

    # --- the loop ---------------------------------------------------------------

    async def run(self) -> None:
        """Passes until cancelled; a failed pass is logged and retried at the next wake."""
        watches = [
            asyncio.create_task(self._watch(TENANTS)),
            asyncio.create_task(self._watch(PODS)),
        ]
        try:
            while True:
                self.wake.clear()
                if self.may_act():
                    try:
                        await self.reconcile()
                    except ApiError as e:
                        log.warning("tenant pass failed, retried: %s", e)
                    except Exception:  # the Slurm port raises what its commands raise
                        log.exception("tenant pass failed, retried")
                if await wait_set(self.wake, self.settings.interval_s):
                    await asyncio.sleep(self.settings.coalesce_s)
        finally:
            for w in watches:
                w.cancel()
            await asyncio.gather(*watches, return_exceptions=True)

    async def _watch(self, resource: Resource) -> None:
        """Wake the loop on every change of ``resource`` (a watch, restarted after errors)."""
        while True:
            try:
                listed = await self.kube.list(resource)
                async for _ in self.kube.watch(resource, listed.resource_version, timeout_s=240):
                    self.wake.set()
            except ApiError as e:
                log.debug("watch %s ended: %s", resource, e)
                await asyncio.sleep(1.0)

    # --- one pass ---------------------------------------------------------------

    async def reconcile(self) -> None:
        """One pass over every Tenant."""
        objects = (await self.kube.list(TENANTS)).items
        parsed: dict[str, Tenant] = {}
        for obj in objects:
            name = obj["metadata"]["name"]
            errors = tenant_api.problems(obj)
            if errors:
                await self._status(obj, invalid=errors)
            else:
                parsed[name] = tenant_api.from_object(obj)
        conflicts = tenancy.conflicts(parsed.values())
        nodes = await self._nodes(parsed.values(), conflicts)
        slurm = await self.slurm.read() if self.slurm is not None else None
        owned = await self._owned()
        desired_accounts: dict[str, SlurmAccount | None] = {}
        for obj in objects:
            t = parsed.get(obj["metadata"]["name"])
            if t is None:
                if obj["metadata"].get("deletionTimestamp"):
                    await self._release_invalid(obj, owned.get(obj["metadata"]["name"], {}))
                continue
            acct = await self._one(obj, t, conflicts.get(t.name, []), slurm, owned, nodes)
            if acct is not None:
                desired_accounts[acct[0]] = acct[1]
        if slurm is not None and self.slurm is not None:
            ops = tenancy.plan_associations(desired_accounts, slurm)
            if ops:
                log.info("Slurm associations: %s", ops)
                if not self.settings.dry_run:
                    await self.slurm.apply(ops)
        if self.reservations is not None and nodes is not None:
            accounts = {t.name: t.account for t in parsed.values()}
            await self._reservations(nodes, accounts)
        if self.node_events is not None and not self.settings.dry_run:
            await self.node_events.copy(list(parsed.values()))
        self.passes += 1

    async def _nodes(
        self, tenants: Iterable[Tenant], conflicts: dict[str, list[str]]
    ) -> _TenantNodes | None:
        """Mark the nodes each tenant owns (label and NoSchedule taint), release the others
        gpufleet marked; adds node conflicts to ``conflicts``. None: the Nodes could not be
        read, so nothing of them is written this pass (and no tenant's nodes are shown)."""
        try:
            listed = (await self.kube.list(NODES)).items
        except ApiError as e:
            log.warning("tenant nodes not read, none written this pass: %s", e)
            return None
        by_name = {str(n["metadata"]["name"]): n for n in listed}
        applicable = [t for t in tenants if not t.deleting and not conflicts.get(t.name)]
        own = tenant_nodes.ownership(
            applicable, {n: o["metadata"].get("labels") or {} for n, o in by_name.items()}
        )
        for name, found in own.conflicts.items():
            conflicts.setdefault(name, []).extend(found)
        plan = tenant_nodes.plan_nodes(own, by_name)
        for w in plan.writes:
            what = f"tenant {w.tenant}" if w.tenant else "released"
            if self.settings.dry_run:
                log.info("dry run: would mark node %s: %s", w.node, what)
                continue
            try:
                await self.kube.patch(NODES, w.node, dict(w.patch))
                log.info("node %s: %s", w.node, what)
            except (Conflict, NotFound):
                log.info("node %s changed meanwhile: marked at the next pass", w.node)
        aliases = {n: addresses_of(o) for n, o in by_name.items()}
        return _TenantNodes(own, plan.foreign, aliases)

    async def _reservations(self, nodes: _TenantNodes, accounts: Mapping[str, str]) -> None:
        """Each tenant's Slurm reservation on its own nodes for its account (decision 0291);
        a failure is logged and the next pass tries again (nodes stay marked either way)."""
        assert self.reservations is not None
        try:
            known = await self.reservations.node_names()
            current = await self.reservations.reservations()
        except Exception as e:  # the port raises what its commands raise
            log.warning("tenant reservations not read, none written this pass: %s", e)
            return
        names = tenant_nodes.slurm_names(nodes.aliases, known)
        wanted = tenant_nodes.wanted_reservations(nodes.ownership, accounts, names)
        for w in tenant_nodes.plan_reservations(wanted, current):
            r = w.reservation
            if self.settings.dry_run:
                log.info("dry run: would %s reservation %s on %s", w.op, r.name, sorted(r.nodes))
                continue
            try:
                if w.op == "delete":
                    await self.reservations.delete_reservation(r.name)
                else:
                    await self.reservations.put_tenant_reservation(r, create=w.op == "create")
                log.info("reservation %s: %s on %s", r.name, w.op, sorted(r.nodes))
            except Exception as e:
                log.warning("reservation %s: %s failed, tried again: %s", r.name, w.op, e)

    async def _owned(self) -> dict[str, dict[tuple[str, str, str], Any]]:
        """Every object gpufleet wrote for a tenant, per tenant, by (kind, namespace, name)."""
        out: dict[str, dict[tuple[str, str, str], Any]] = {}
        for kind, resource in RESOURCES.items():
            for o in (await self.kube.list(resource, label_selector=OWNED_SELECTOR)).items:
                meta = o["metadata"]
                key = (kind, meta["namespace"], meta["name"])
                out.setdefault(meta["labels"][tenancy.LABEL_TENANT], {})[key] = o
        return out

    async def _one(
        self,
        obj: Mapping[str, Any],
        t: Tenant,
        conflict: list[str],
        slurm: SlurmTenancy | None,
        owned: Mapping[str, Mapping[tuple[str, str, str], Any]],
        nodes: _TenantNodes | None = None,
    ) -> tuple[str, SlurmAccount | None] | None:
        """Reconcile one valid tenant; returns its Slurm account's desired state (or None:
        leave Slurm alone for it)."""
        mine = dict(owned.get(t.name, {}))
        if not t.deleting and tenancy.FINALIZER not in (obj["metadata"].get("finalizers") or []):
            await self._finalizers(obj, add=True)
        pods: list[Mapping[str, Any]] = []
        per_ns: dict[str, int] = {}
        for ns in t.namespaces:
            listed = (await self.kube.list(PODS, namespace=ns)).items
            pods.extend(listed)
            per_ns[ns] = sum(tenancy.pod_gpus(p) for p in listed)
        slurm_gpus = slurm.gpus_running.get(t.account, 0) if slurm is not None else 0
        usage = tenancy.Usage(per_ns, slurm_gpus)
        if conflict and not t.deleting:
            await self._status(
                obj,
                usage=usage,
                quota=t.gpu_quota,
                conflict=conflict,
                nodes=[] if nodes is not None else None,
            )
            return None
        limits = tenancy.split(t.gpu_quota, usage, deleting=t.deleting)
        desired = [] if conflict else tenancy.desired_objects(t, limits, role=self.settings.role)
        left = (
            tenancy.left_running(pods, t.account, slurm_gpus) if t.deleting and not conflict else []
        )
        gone = t.deleting and not left
        if gone:
            desired = []
        for o in desired:
            if o.key not in mine:
                found = await self._get(o)
                if found is not None:
                    mine[o.key] = found
        ops = tenancy.plan_objects(t.name, desired, mine)
        await self._write(t, ops)
        foreign = [
            f"{k} {ns}/{n} exists and is not gpufleet's: left alone" for k, ns, n in ops.foreign
        ]
        mine_nodes: list[str] | None = None
        if nodes is not None and not t.deleting:
            wanted = nodes.ownership.nodes_of(t.name)
            foreign += [nodes.foreign[n] for n in wanted if n in nodes.foreign]
            mine_nodes = [n for n in wanted if n not in nodes.foreign]
        account: SlurmAccount | None = None
        slurm_note: list[str] = []
        if gone:
            cur = slurm.accounts.get(t.account) if slurm is not None else None
            if cur is not None and tenancy.managed_tenant(cur.description) == t.name:
                return (t.account, None)  # removed now; the finalizer goes at the next pass
            await self._finish(obj, t)
            return None
        if slurm is not None and not conflict:
            account = tenancy.desired_account(t, limits.slurm_gpus)
            slurm_note = [
                f"Slurm account {a} exists and is not gpufleet's: left alone"
                for a in tenancy.foreign_accounts({t.account: account}, slurm)
            ]
        await self._status(
            obj,
            usage=usage,
            limits=limits,
            quota=t.gpu_quota,
            left=left,
            notes=foreign + slurm_note,
            conflict=conflict,
            nodes=mine_nodes,
        )
        return (t.account, account) if account is not None and not slurm_note else None

    async def _release_invalid(
        self, obj: Mapping[str, Any], mine: Mapping[tuple[str, str, str], Any]
    ) -> None:
        """A deleted Tenant whose spec cannot be read: its namespaces and account are unknown,
        so nothing is waited for; the objects labelled for it go (no pod or job stops for
        that) and any Slurm account it had is left for people to remove."""
        name = obj["metadata"]["name"]
        if tenancy.FINALIZER not in (obj["metadata"].get("finalizers") or []):
            return
        if self.settings.dry_run:
            log.info("dry run: would release invalid tenant %s", name)
            return
        ops = tenancy.plan_objects(name, [], mine)
        await self._write(tenancy.Tenant(name=name, created=""), ops)
        await self._event(
            obj,
            "TenantRemoved",
            "Warning",
            "deleted with a spec that cannot be read: its objects removed, its Slurm account "
            "(if any) left in place",
        )
        await self._finalizers(obj, add=False)
        if self.metrics is not None:
            self.metrics.forget(name)

    async def _get(self, o: tenancy.KubeObject) -> Any:
        try:
            return await self.kube.get(RESOURCES[o.kind], o.name, namespace=o.namespace)
        except NotFound:
            return None

    async def _write(self, t: Tenant, ops: tenancy.KubeOps) -> None:
        if self.settings.dry_run:
            for o in ops.put:
                log.info("dry run: would write %s %s/%s", o.kind, o.namespace, o.name)
            for o in ops.delete:
                log.info("dry run: would delete %s %s/%s", o.kind, o.namespace, o.name)
            return
        for o in ops.put:
            body = {"apiVersion": API_VERSIONS[o.kind], "kind": o.kind, **o.body}
            await self.kube.apply(
                RESOURCES[o.kind], o.name, body, namespace=o.namespace, field_manager=FIELD_MANAGER
            )
            log.info("tenant %s: wrote %s %s/%s", t.name, o.kind, o.namespace, o.name)
        for o in ops.delete:
            with contextlib.suppress(NotFound):
                await self.kube.delete(RESOURCES[o.kind], o.name, namespace=o.namespace)
            log.info("tenant %s: removed %s %s/%s", t.name, o.kind, o.namespace, o.name)

    async def _finish(self, obj: Mapping[str, Any], t: Tenant) -> None:
        """Drop the finalizer of a deleted tenant whose work ended and objects are gone."""
        if self.settings.dry_run:
            log.info("dry run: would release tenant %s", t.name)
            return
        await self._event(obj, "TenantRemoved", "Normal", "its work ended; its objects removed")
        await self._finalizers(obj, add=False)
        if self.metrics is not None:
            self.metrics.forget(t.name)

    async def _finalizers(self, obj: Mapping[str, Any], *, add: bool) -> None:
        """Add or drop gpufleet's finalizer, guarded by the object's current resourceVersion
        (read again: this pass may have written its status since it was listed)."""
        if self.settings.dry_run:
            return
        try:
            meta = (await self.kube.get(TENANTS, obj["metadata"]["name"]))["metadata"]
        except NotFound:
            return
        have = list(meta.get("finalizers") or [])
        want = [*have, tenancy.FINALIZER] if add else [f for f in have if f != tenancy.FINALIZER]
        if want == have:
            return
        patch = {"metadata": {"finalizers": want, "resourceVersion": meta["resourceVersion"]}}
        with contextlib.suppress(Conflict, NotFound):  # changed meanwhile: the next pass
            await self.kube.patch(TENANTS, meta["name"], patch)

    async def _event(self, obj: Mapping[str, Any], reason: str, type_: str, message: str) -> None:
        meta = obj["metadata"]
        involved = {
            "apiVersion": API_VERSION,
            "kind": tenant_api.KIND,
            "name": meta["name"],
            "uid": meta.get("uid", ""),
        }
        when = rfc3339(self.now())
        body = event_body(
            involved=involved,
            type_=type_,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=COMPONENT,
            namespace="default",
            first=when,
        )
        with contextlib.suppress(ApiError):
            await self.kube.create_event("default", body)

    async def _status(
        self,
        obj: Mapping[str, Any],
        *,
        invalid: Sequence[str] = (),
        usage: tenancy.Usage | None = None,
        limits: tenancy.Split | None = None,
        quota: int | None = None,
        left: Sequence[str] = (),
        notes: Sequence[str] = (),
        conflict: Sequence[str] = (),
        nodes: Sequence[str] | None = None,
    ) -> None:
        """Write the status when it changed (conditions merged by type); ``nodes``: those it
        owns (None: not read this pass, the status keeps what it said)."""
        meta = obj["metadata"]
        old = dict(obj.get("status") or {})
        gen = int(meta.get("generation") or 0)
        now = self.now()
        cs: list[dict[str, Any]] = list(old.get("conditions") or [])

        def put(type_: str, status: cond.Status, reason: str, message: str) -> None:
            nonlocal cs
            cs = cond.set_condition(
                cs, type_, status, reason, message, now=now, observed_generation=gen
            )

        deleting = bool(meta.get("deletionTimestamp"))
        if invalid:
            put("Ready", "False", "Invalid", "; ".join(invalid))
        elif conflict:
            put("Conflict", "True", "Conflict", "; ".join(conflict) + ": nothing of it is applied")
            put("Ready", "False", "Conflict", "an older tenant holds part of it (see Conflict)")
        else:
            put("Conflict", "False", "NoConflict", "nothing it claims is held by an older tenant")
            if notes:
                put("Ready", "False", "NotOwned", "; ".join(notes))
            elif deleting:
                put("Ready", "False", "Deleting", "being deleted")
            else:
                put("Ready", "True", "Applied", "quota, bindings and policies applied")
        if usage is not None and not invalid and not conflict:
            why = tenancy.below_use(quota, usage)
            put(
                "QuotaBelowUse",
                "True" if why else "False",
                "QuotaBelowUse" if why else "WithinQuota",
                why or "what runs fits the quota",
            )
        if deleting:
            put(
                "Deleting",
                "True",
                "WaitingForWork" if left else "Removing",
                "quota 0 on both sides; waiting for what runs to end on its own"
                if left
                else "its work ended: removing what gpufleet wrote",
            )
        status: dict[str, Any] = {"conditions": cs, "observedGeneration": gen}
        if usage is not None:
            status["usage"] = {
                "kubernetesGpus": usage.kubernetes_gpus,
                "slurmGpus": usage.slurm_gpus,
            }
        if limits is not None:
            status["limits"] = {
                "kubernetesGpus": limits.kubernetes_gpus,
                "slurmGpus": limits.slurm_gpus,
            }
        status["left"] = list(left)
        if nodes is not None:
            status["nodes"] = list(nodes)
        if self.metrics is not None:
            self.metrics.observe(
                meta["name"], quota, usage, limits, {c["type"]: c["status"] == "True" for c in cs}
            )
        if all(old.get(k) == v for k, v in status.items()):
            return
        newly = {c["type"] for c in cs if c["status"] == "True"} - {
            c.get("type") for c in old.get("conditions") or [] if c.get("status") == "True"
        }
        if self.settings.dry_run:
            return
        with contextlib.suppress(NotFound):
            await self.kube.patch(TENANTS, meta["name"], {"status": status}, status=True)
        for c in cs:
            if c["type"] in newly and c["type"] in ("Conflict", "QuotaBelowUse", "Deleting"):
                await self._event(obj, f"Tenant{c['type']}", "Warning", c["message"])
            invalid_now = c["type"] == "Ready" and c["reason"] == "Invalid"
            if invalid_now and c["message"] != _message(old, "Ready"):
                await self._event(obj, "TenantInvalid", "Warning", c["message"])


@dataclass(frozen=True)
class _TenantNodes:
    """This pass's node ownership and the nodes left alone (a label or taint not ours)."""

    ownership: tenant_nodes.Ownership
    foreign: Mapping[str, str]
    aliases: Mapping[str, frozenset[str]]
    """Per Node, the names its Slurm node may go by (its name, host name, addresses)."""


def _message(status: Mapping[str, Any], type_: str) -> str | None:
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("message"))
    return None
