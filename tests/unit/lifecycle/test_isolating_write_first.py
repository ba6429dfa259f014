"""The write that cordons a node is made urgent (decision 0292): the client gives it a
slot before the work that follows earlier decisions. Only that write: the drain's reads,
the Events, the NodeRemediation and the ladder's later record writes stay ordinary."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.kubeapi import NODES, Resource
from gpufleet.kubeapi.slots import is_urgent

from .fakes import FakeKube
from .test_controller import fault, make, settle


class Watching(FakeKube):
    """The fake API, noting for each request whether it was made urgent."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, bool, bool]] = []
        """(verb, resource, urgent, cordons) per request, in order."""

    async def patch(self, resource: Resource, name: str, patch: Any, **kw: Any) -> Any:
        cordons = bool((patch.get("spec") or {}).get("unschedulable"))
        self.seen.append(("patch", resource.plural, is_urgent(), cordons))
        return await super().patch(resource, name, patch, **kw)

    async def get(self, resource: Resource, name: str, **kw: Any) -> Any:
        self.seen.append(("get", resource.plural, is_urgent(), False))
        return await super().get(resource, name, **kw)

    async def create(self, resource: Resource, body: Any, **kw: Any) -> Any:
        self.seen.append(("create", resource.plural, is_urgent(), False))
        return await super().create(resource, body, **kw)


def test_the_cordon_is_urgent_and_nothing_else_is() -> None:
    async def go() -> None:
        kube = Watching()
        _, ctl, clock = await make(4, kube=kube)
        kube.seen.clear()
        await fault(kube, ctl, "n1", clock.now())
        await settle(ctl)
        assert kube.nodes["n1"]["spec"].get("unschedulable") is True
        urgent = [s for s in kube.seen if s[2]]
        assert urgent == [("patch", NODES.plural, True, True)]  # the cordon, once
        ordinary = [s for s in kube.seen if not s[2]]
        assert ordinary, "the drain and the Events made requests too"
        assert not any(s[3] for s in ordinary)
        await ctl.close()

    asyncio.run(go())
