"""The provisioning service's Machine index (watch-fed) against the real apiserver:
Machines created, changed or deleted after the service started are served as they
are now, and a stale index never yields a token (the claim stays the guarded write)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from controller_harness import GV, SYSTEM_NS, Api, install

from gpufleet.domain import enrollment
from gpufleet.kubeapi import KubeApi
from gpufleet.provision import machines
from gpufleet.provision.index import MachineIndex
from gpufleet.provision.issuer import MACHINES, Provisioner, Refused, ServiceSettings, rearm
from gpufleet.provision.server import ServeOptions, boot_config
from gpufleet.waits import within

pytestmark = pytest.mark.integration

SECRET = "index-secret"
POOL = "index"


def spec(mac: str, secret: str = SECRET) -> machines.MachineSpec:
    return machines.MachineSpec.model_validate(
        {
            "macs": [mac],
            "serial": f"SN-{mac}",
            "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": f"{SYSTEM_NS}/x"},
            "pool": POOL,
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
            "enrollmentDigest": enrollment.digest(secret),
        }
    )


@pytest.fixture(scope="module")
def env(local_cluster: Any) -> Iterator[tuple[Any, Api]]:
    api = Api(local_cluster)
    install(api)
    try:
        yield local_cluster, api
    finally:
        api.delete(f"{GV}/machines?labelSelector=gpufleet.io%2Fpool%3D{POOL}")


async def until(what: str, check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def status_of(prov: Provisioner, mac: str, secret: str = SECRET) -> int:
    try:
        await prov.user_data(mac, client="t", enrollment_secret=secret)
    except Refused as exc:
        return exc.status
    return 200


def test_machines_created_changed_or_deleted_after_start_are_served_as_they_are_now(
    env: tuple[Any, Api],
) -> None:
    info, api = env

    async def scenario() -> None:
        kube = await KubeApi.connect(str(info.kubeconfig))
        index = MachineIndex(kube)
        task = asyncio.create_task(index.run())
        prov = Provisioner(kube, boot_config(ServeOptions(kubeconfig=info.kubeconfig)), index=index)
        try:
            await within(10, index.ready.wait())

            # Created after the service started: served at once (the index may not
            # have it yet: a miss reads the apiserver), then from the index.
            mac = "aa:00:00:02:00:01"
            api.post(f"{GV}/machines", machines.manifest("idx-new", spec(mac)))
            assert "#!ipxe" in await prov.ipxe(mac, client="t")
            await until("index has idx-new", lambda: index.lookup(mac) is not None)
            assert "idx-new" in await prov.meta_data(mac, client="t")

            # Changed after start: token issued, re-armed behind the service's back,
            # asked again at once: a new token (the index may still say disarmed).
            first = await prov.user_data(mac, client="t", enrollment_secret=SECRET)
            assert await status_of(prov, mac) == 409
            await rearm(kube, "idx-new", by="test", reason="test", now=time.time())
            second = await prov.user_data(mac, client="t", enrollment_secret=SECRET)
            assert second.token_id != first.token_id
            # The enrollment secret rotated: the new one works at once, the old one not.
            await rearm(kube, "idx-new", by="test", reason="test", now=time.time())
            api.patch(
                f"{GV}/machines/idx-new",
                {"spec": {"enrollmentDigest": enrollment.digest("rotated")}},
            )
            assert await status_of(prov, mac) == 403
            assert await status_of(prov, mac, "rotated") == 200

            # Deleted: no token even while the index may still hold it; then a 404 for all.
            gone = "aa:00:00:02:00:02"
            api.post(f"{GV}/machines", machines.manifest("idx-gone", spec(gone)))
            await until("index has idx-gone", lambda: index.lookup(gone) is not None)
            api.delete(f"{GV}/machines/idx-gone")
            assert await status_of(prov, gone) == 404
            await until("index dropped idx-gone", lambda: index.lookup(gone) is None)
            with pytest.raises(Refused) as refused:
                await prov.ipxe(gone, client="t")
            assert refused.value.status == 404
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await prov.drain_events()

    asyncio.run(scenario())


def test_a_stale_index_never_yields_a_token(env: tuple[Any, Api]) -> None:
    """An index frozen in the past (the watch fell behind) says *armed*; the Machine
    in the apiserver is disarmed or deleted: the claim loses and nothing is issued."""
    info, api = env
    mac, gone = "aa:00:00:02:00:03", "aa:00:00:02:00:04"
    api.post(f"{GV}/machines", machines.manifest("idx-stale", spec(mac)))
    api.post(f"{GV}/machines", machines.manifest("idx-stale-gone", spec(gone)))

    async def scenario() -> tuple[int, int, int]:
        kube = await KubeApi.connect(str(info.kubeconfig))
        armed = copy.deepcopy(await kube.get(MACHINES, "idx-stale"))
        armed_gone = copy.deepcopy(await kube.get(MACHINES, "idx-stale-gone"))
        frozen = MachineIndex(kube)
        frozen.replace([armed, armed_gone], "1")  # never follows a watch
        settings = ServiceSettings()
        config = boot_config(ServeOptions(kubeconfig=info.kubeconfig))
        direct = Provisioner(kube, config, settings)
        await direct.user_data(mac, client="t", enrollment_secret=SECRET)  # disarms it
        api.delete(f"{GV}/machines/idx-stale-gone")
        stale = Provisioner(kube, config, settings, index=frozen)
        assert frozen.lookup(mac) is not None and frozen.lookup(gone) is not None
        got = await status_of(stale, mac), await status_of(stale, gone)
        # Armed again in the apiserver (the index still has the first, older copy):
        # the claim with the old resourceVersion loses, the fresh read wins.
        await rearm(kube, "idx-stale", by="test", reason="test", now=time.time())
        again = await status_of(stale, mac)
        await direct.drain_events()
        await stale.drain_events()
        return got[0], got[1], again

    disarmed, deleted, rearmed = asyncio.run(scenario())
    assert (disarmed, deleted, rearmed) == (409, 404, 200)
