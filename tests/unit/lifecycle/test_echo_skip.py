"""The echo of the controller's own Node write is not decided again (decision 0252),
and only it: the exact resourceVersion its own patch returned, under the same policy;
forgotten on a takeover, another event and a failed write."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpufleet.domain import well_known
from gpufleet.kubeapi import NODES, ApiError
from gpufleet.lifecycle.controller import Controller

from .fakes import FakeKube
from .test_controller import fault, make, record, settle


def counting(ctl: Controller) -> Counter[str]:
    """How many times each Node was decided (a pass of the node pass over it)."""
    decided: Counter[str] = Counter()
    reconcile = ctl.nodes._reconcile

    async def counted(body: Any, *, extra: Any) -> None:
        decided[str(body["metadata"]["name"])] += 1
        await reconcile(body, extra=extra)

    ctl.nodes._reconcile = counted  # type: ignore[method-assign]
    return decided


async def faulted(n: int = 10) -> tuple[FakeKube, Controller, Counter[str]]:
    """A controller that has just cordoned n1 (its write's echo not delivered yet)."""
    kube, ctl, clock = await make(n)
    await fault(kube, ctl, "n1", clock.now())
    await settle(ctl)
    assert kube.nodes["n1"]["spec"].get("unschedulable") is True
    return kube, ctl, counting(ctl)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_the_echo_of_its_own_write_is_not_decided_again() -> None:
    async def go() -> None:
        kube, ctl, decided = await faulted()
        written = kube.nodes["n1"]["metadata"]["resourceVersion"]
        assert ctl.nodes.book.get("n1")["metadata"]["resourceVersion"] == written  # type: ignore[index]
        await ctl.on_node(kube.nodes["n1"])  # the watch delivers the controller's own write
        assert decided["n1"] == 0
        await ctl.on_node(kube.nodes["n1"])  # delivered again (a re-list): decided, as before
        assert decided["n1"] == 1
        await ctl.close()

    run(go)


def test_a_foreign_write_is_decided() -> None:
    async def go() -> None:
        kube, ctl, decided = await faulted()
        # Someone else writes the Node after the controller: a version it never wrote.
        await kube.patch(NODES, "n1", {"metadata": {"labels": {"example.com/rack": "r1"}}})
        await ctl.on_node(kube.nodes["n1"])
        assert decided["n1"] == 1
        await ctl.close()

    run(go)


def test_a_takeover_decides_every_held_node_its_own_writes_included() -> None:
    async def go() -> None:
        kube, ctl, decided = await faulted()

        async def same_policy() -> None:  # the FleetPolicy read afresh, unchanged
            return None

        ctl.policies.reload = same_policy  # type: ignore[method-assign]
        ctl.deactivate("lease lost")
        await ctl.activate()
        assert decided["n1"] == 1  # the Node as the controller last wrote it
        assert set(decided) == set(kube.nodes)
        await ctl.close()

    run(go)


def test_a_new_policy_decides_the_echo() -> None:
    async def go() -> None:
        kube, ctl, decided = await faulted()
        ctl.policies.use(ctl.policies.policy.model_copy(update={"paused": True}))
        await ctl.on_node(kube.nodes["n1"])
        assert decided["n1"] == 1
        await ctl.close()

    run(go)


def test_a_failed_write_records_nothing() -> None:
    async def go() -> None:
        kube, ctl, decided = await faulted()
        patch = kube.patch

        async def failing(resource: Any, name: str, body: Any, **kw: Any) -> Any:
            if resource == NODES:
                raise ApiError(f"patch node {name}", 500, "etcd timeout")
            return await patch(resource, name, body, **kw)

        kube.patch = failing  # type: ignore[method-assign]
        with pytest.raises(ApiError):
            await fault(kube, ctl, "n2", ctl.clock.now())
        kube.patch = patch  # type: ignore[method-assign]
        assert "xid-79" not in kube.nodes["n2"]["metadata"]["annotations"].get(
            well_known.ANNOTATION_RECORD, ""
        )
        # The Node as it was (nothing written): its next delivery is decided and the
        # fault recorded (held here: n1 holds the budget of one node out).
        await ctl.on_node(kube.nodes["n2"])
        assert decided["n2"] == 2
        assert [o.key for o in record(kube, "n2").occurrences] == ["xid-79"]
        await settle(ctl)
        await ctl.close()

    run(go)
