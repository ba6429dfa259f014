"""Machine boot paths trust the Secret, not the Machine (issue 33, defect 4).

A Machine that names another machine's BMC Secret and an endpoint of its own must
not receive that BMC's credentials; an unauthenticated iPXE request must not start a
boot the watchdog would later power-cycle; the per-MAC rate limit counts a MAC
however it is spelled. Live: tests/integration/test_safety_boot_paths.py.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from typing import Any

import pytest

from gpufleet.api.machine import MachineSpec, manifest
from gpufleet.clock import ManualClock
from gpufleet.domain import boot_watch, enrollment
from gpufleet.kubeapi import ObjectList, Resource
from gpufleet.kubeapi.machines import MACHINES
from gpufleet.kubeapi.machines import MachineStore as KubeMachineStore
from gpufleet.provision import issuer, render
from gpufleet.provision.index import MachineIndex
from gpufleet.provision.issuer import Provisioner, Refused
from gpufleet.remediate import identity, machine_power, redfish

from ..lifecycle.fakes import FakeKube

CONFIG = render.BootConfig(
    apiserver="10.0.0.1:6443", ca_hash="sha256:" + "0" * 64, public_url="http://10.0.0.2:8080"
)
OWN = "https://10.0.1.7"
OTHER = "https://10.0.1.8"
MAC = "aa:bb:cc:00:01:07"


def _secret(endpoint: str | None) -> dict[str, Any]:
    data = {"username": "root", "password": "pw"} | ({"endpoint": endpoint} if endpoint else {})
    return {
        "metadata": {"name": "bmc-n7", "namespace": "bmc"},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


class _Kube(FakeKube):
    """FakeKube that also answers the service's existence selector (``mac.gpufleet.io/<hex>``)."""

    async def list(self, resource: Resource, **kw: Any) -> ObjectList:
        selector = str(kw.get("label_selector") or "")
        if resource == MACHINES and selector and "=" not in selector:
            items = [
                copy.deepcopy(v)
                for (plural, _), v in self.custom.items()
                if plural == MACHINES.plural and selector in v["metadata"].get("labels", {})
            ]
            return ObjectList(items, "1")
        return await super().list(resource, **kw)


def _kube(machine_endpoint: str, secret_endpoint: str | None, **status: Any) -> FakeKube:
    kube = _Kube()
    spec = MachineSpec.model_validate(
        {
            "macs": [MAC],
            "serial": "SN-7",
            "bmc": {"endpoint": machine_endpoint, "credentialsSecret": "bmc/bmc-n7"},
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
        }
    )
    body = manifest("n7", spec)
    body["metadata"]["resourceVersion"] = "1"
    body["status"] = dict(status)
    kube.custom[(MACHINES.plural, "n7")] = body
    kube.secrets[("bmc", "bmc-n7")] = _secret(secret_endpoint)
    return kube


class _NoBmc:
    """Stands in for the Redfish client: any use of the BMC fails the test."""

    def __init__(self, creds: redfish.BmcCredentials, *_: Any, **__: Any) -> None:
        raise AssertionError(f"the BMC at {creds.endpoint} was contacted")


# ------------------------------------------------------------------ the rule


def test_credentials_go_only_to_the_endpoint_stored_with_them() -> None:
    assert identity.endpoint_problem("n7", OWN, "bmc/x", OWN + "/") is None
    assert identity.endpoint_problem("n7", "HTTPS://10.0.1.7", "bmc/x", OWN) is None
    moved = identity.endpoint_problem("n7", OTHER, "bmc/x", OWN)
    assert moved is not None and OTHER in moved and OWN in moved and "refused" in moved
    bare = identity.endpoint_problem("n7", OWN, "bmc/x", None)
    assert bare is not None and "names no endpoint" in bare


# --------------------------------------------------- gpufleet machines power-on


@pytest.mark.parametrize("secret_endpoint", [OWN, None])
def test_power_on_refuses_a_machine_whose_endpoint_is_not_its_secrets(
    monkeypatch: pytest.MonkeyPatch, secret_endpoint: str | None
) -> None:
    monkeypatch.setattr(redfish, "RedfishClient", _NoBmc)
    kube = _kube(OTHER, secret_endpoint)

    async def go() -> None:
        with pytest.raises(machine_power.BmcEndpointMismatch):
            await machine_power.network_boot(
                KubeMachineStore(kube), "n7", open_bmc=_NoBmc, by="admin", now=1e9
            )

    asyncio.run(go())
    machine = kube.custom[(MACHINES.plural, "n7")]
    assert machine["status"] == {}  # nothing recorded: not re-armed, no boot
    [event] = kube.events
    assert event["reason"] == "BmcEndpointMismatch" and event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Machine"


def test_the_machines_bmc_is_the_secrets_endpoint() -> None:
    kube = _kube(OWN + "/", OWN)

    async def go() -> str:
        body = await kube.get(MACHINES, "n7")
        creds = await machine_power.machine_credentials(KubeMachineStore(kube), body)
        return creds.endpoint

    assert asyncio.run(go()) == OWN


# ------------------------------------------------------------- the service


def _service(kube: FakeKube, clock: ManualClock | None = None) -> Provisioner:
    """The service with its Machine index fed from ``kube`` (as the watch would)."""
    index = MachineIndex(api=kube)
    index.replace([kube.custom[(MACHINES.plural, "n7")]], "1")
    return Provisioner(kube, CONFIG, clock=clock or ManualClock(), index=index)


def _reasons(kube: FakeKube) -> list[str]:
    return [e["reason"] for e in kube.events]


def test_a_serial_is_never_checked_at_an_endpoint_other_than_the_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redfish, "RedfishClient", _NoBmc)
    kube = _kube(OTHER, OWN)
    prov = _service(kube)

    async def go() -> None:
        with pytest.raises(Refused) as refused:
            await prov.user_data(MAC, client="10.9.9.9", serial="SN-7")
        assert refused.value.status == 403
        await prov.drain_events()

    asyncio.run(go())
    assert "BmcEndpointMismatch" in _reasons(kube) and "TokenRefused" in _reasons(kube)
    assert not [k for k in kube.secrets if k[0] == issuer.TOKEN_NAMESPACE]  # no token


def test_an_ipxe_request_nobody_asked_for_is_served_but_never_watched() -> None:
    kube = _kube(OWN, OWN)
    prov = _service(kube)

    async def go() -> str:
        script = await prov.ipxe(MAC.upper(), client="10.9.9.9")
        await prov.drain_events()
        return script

    assert asyncio.run(go()).startswith("#!ipxe")
    status = kube.custom[(MACHINES.plural, "n7")]["status"]
    assert "boot" not in status and boot_watch.progress_of(status) is None
    assert _reasons(kube) == ["UnrequestedNetworkBoot"]


def test_the_ipxe_request_of_a_requested_boot_advances_it() -> None:
    clock = ManualClock()
    requested = boot_watch.requested_status(by="admin", at=clock.now(), attempt=2)
    kube = _kube(OWN, OWN, **requested)
    prov = _service(kube, clock)
    clock.advance(5)
    asyncio.run(prov.ipxe(MAC, client="10.9.9.9"))
    progress = boot_watch.progress_of(kube.custom[(MACHINES.plural, "n7")]["status"])
    assert progress is not None and progress.attempt == 2
    assert progress.stage is boot_watch.Stage.NETWORK_BOOT
    assert progress.network_boot_at == enrollment.parse_rfc3339(enrollment.rfc3339(clock.now()))


def test_the_per_mac_limit_counts_a_mac_however_it_is_spelled() -> None:
    kube = _kube(OWN, OWN)
    prov = _service(kube)
    spellings = ["aa:bb:cc:00:01:07", "AA-BB-CC-00-01-07", "aabb.cc00.0107", "AABBCC000107"]
    burst = prov.settings.per_mac.burst
    for i in range(burst):  # distinct clients: only the MAC's bucket is in play
        prov.rate_limit(f"10.0.0.{i}", spellings[i % len(spellings)])
    with pytest.raises(Refused) as refused:
        prov.rate_limit("10.0.0.200", spellings[burst % len(spellings)])
    assert refused.value.status == 429 and MAC in refused.value.reason
    # Malformed MACs share one bucket, so varying the garbage buys nothing either.
    for i in range(burst):
        prov.rate_limit(f"10.1.0.{i}", f"zz{i}")
    with pytest.raises(Refused):
        prov.rate_limit("10.1.0.200", "not-a-mac")


def test_a_boot_requested_after_the_index_was_fed_is_found_on_a_fresh_read() -> None:
    clock = ManualClock()
    kube = _kube(OWN, OWN)
    prov = _service(kube, clock)  # the index holds the Machine before its power-on
    machine = kube.custom[(MACHINES.plural, "n7")]
    machine["status"] = boot_watch.requested_status(by="admin", at=clock.now(), attempt=1)
    clock.advance(3)
    asyncio.run(prov.ipxe(MAC, client="10.9.9.9"))
    progress = boot_watch.progress_of(kube.custom[(MACHINES.plural, "n7")]["status"])
    assert progress is not None and progress.stage is boot_watch.Stage.NETWORK_BOOT
    assert "UnrequestedNetworkBoot" not in _reasons(kube)
