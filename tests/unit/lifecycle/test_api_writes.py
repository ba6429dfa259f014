"""What one incident costs the apiserver in NodeRemediation writes: one create, and a
status write only when the status people see changed (not one create per decision)."""

from __future__ import annotations

import asyncio
from collections import Counter
from itertools import pairwise
from typing import Any

from gpufleet.domain import conditions
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem

from .fakes import set_condition
from .test_controller import answer, make, record, settle


def test_an_incident_creates_its_node_remediation_once() -> None:
    async def go() -> None:
        kube, ctl, clock = await make(10)
        sent: Counter[str] = Counter()
        statuses: list[Any] = []
        create, patch = kube.create, kube.patch

        async def counting_create(resource: Any, body: Any, **kw: Any) -> Any:
            if resource.plural == "noderemediations":
                sent["create"] += 1
            return await create(resource, body, **kw)

        async def counting_patch(resource: Any, name: str, body: Any, **kw: Any) -> Any:
            if resource.plural == "noderemediations":
                sent["status"] += 1
                statuses.append(body["status"])
            return await patch(resource, name, body, **kw)

        kube.create, kube.patch = counting_create, counting_patch  # type: ignore[method-assign]
        fault = FaultEvent(
            FaultKind.XID, "n1", at=clock.now(), xid=48, evidence=Evidence(gpu_index=2)
        )
        set_condition(kube.nodes["n1"], conditions.problem(Subsystem.GPU, [fault]))
        await ctl.on_node(kube.nodes["n1"])
        await settle(ctl)
        answer(kube, "n1", True)
        await ctl.on_node(kube.nodes["n1"])
        await settle(ctl)
        answer(kube, "n1", True)
        await ctl.on_node(kube.nodes["n1"])
        await settle(ctl)
        for _ in range(3):  # watch events of the controller's own writes: nothing new
            await ctl.on_node(kube.nodes["n1"])
        await settle(ctl)
        assert record(kube, "n1").state.value == "production"
        assert sent["create"] == 1
        assert sent["status"] == len(statuses) >= 2
        assert all(a != b for a, b in pairwise(statuses))
        assert statuses[-1]["outcome"] == "repaired"
        await ctl.close()

    asyncio.run(go())
