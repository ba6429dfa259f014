"""gpufleet's custom resources as ``kubectl get`` shows them on the real apiserver: every
kind in the ``gpufleet`` category, printer columns that are filled (the apiserver's own
Table printing), and a FleetPolicy whose ``Valid`` condition survives the breaker's status
save (conditions merged by type, metav1.Condition)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from controller_harness import GV, Api, install

from gpufleet.api import fleetpolicy
from gpufleet.domain.policy import default_policy
from gpufleet.gate.fence import StaticFence
from gpufleet.kubeapi import KubeApi
from gpufleet.lifecycle.controller import Controller, ControllerSettings

pytestmark = pytest.mark.integration

MACHINE = "conventions-gfm-0"
POLICY = "conventions-policy"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


@pytest.fixture(scope="module")
def api(local_cluster: Any) -> Iterator[Api]:
    api = Api(local_cluster)
    install(api)
    try:
        yield api
    finally:
        api.delete(f"{GV}/machines/{MACHINE}")
        api.delete(f"{GV}/{fleetpolicy.PLURAL}/{POLICY}")


def cells(api: Api, path: str) -> dict[str, Any]:
    """The printer columns of one object, as ``kubectl get`` receives them."""
    r = api.http.get(path, headers={"Accept": TABLE})
    r.raise_for_status()
    table = r.json()
    names = [c["name"] for c in table["columnDefinitions"]]
    [row] = table["rows"]
    return dict(zip(names, row["cells"], strict=True))


def test_every_kind_is_listed_by_kubectl_get_gpufleet(api: Api) -> None:
    resources = api.get(GV)["resources"]
    kinds = {r["kind"] for r in resources if "gpufleet" in (r.get("categories") or [])}
    assert kinds == {
        "FleetPolicy",
        "NodeRemediation",
        "Machine",
        "SlurmCluster",
        "MaintenancePlan",
        "Tenant",
    }


def test_a_new_machine_shows_phase_and_armed(api: Api) -> None:
    api.post(
        f"{GV}/machines",
        {
            "apiVersion": f"{GV.removeprefix('/apis/')}",
            "kind": "Machine",
            "metadata": {"name": MACHINE},
            "spec": {
                "macs": ["aa:bb:cc:00:99:01"],
                "serial": "SN-conventions",
                "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": "x/y"},
                "pool": "conventions",
                "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
            },
        },
    )
    row = cells(api, f"{GV}/machines/{MACHINE}")
    assert row["Phase"] == "Registered" and row["Armed"] is True
    # readers get the defaults too (no writer had to initialise the status)
    status = api.get(f"{GV}/machines/{MACHINE}")["status"]
    assert status["phase"] == "Registered" and status["armed"] is True


def test_fleetpolicy_valid_survives_the_breaker_save(api: Api, local_cluster: Any) -> None:
    spec = default_policy().model_dump(by_alias=True, mode="json")
    del spec["paused"], spec["dryRun"]  # the apiserver fills them in
    api.post(
        f"{GV}/{fleetpolicy.PLURAL}",
        {
            "apiVersion": GV.removeprefix("/apis/"),
            "kind": "FleetPolicy",
            "metadata": {"name": POLICY},
            "spec": spec,
        },
    )

    async def go() -> None:
        kube = await KubeApi.connect(str(local_cluster.kubeconfig))
        ctl = Controller(
            kube,
            ControllerSettings(policy_name=POLICY, status_save_delay_s=0.0),
            fence=StaticFence("crd-conventions"),
        )
        await ctl.on_policy(api.get(f"{GV}/{fleetpolicy.PLURAL}/{POLICY}"))
        await ctl.save_fleet_status()  # replaced the whole list before
        await ctl.save_fleet_status()

    asyncio.run(go())
    row = cells(api, f"{GV}/{fleetpolicy.PLURAL}/{POLICY}")
    assert row["Valid"] == "True" and row["Breaker-Open"] is False
    assert row["Paused"] is False and row["DryRun"] is False  # defaulted, not blank
    obj = api.get(f"{GV}/{fleetpolicy.PLURAL}/{POLICY}")
    conds = {c["type"]: c for c in obj["status"]["conditions"]}
    assert set(conds) == {"Valid", "BreakerOpen", "FaultsWaiting"}
    assert conds["FaultsWaiting"]["status"] == "False"  # no node holds a withheld fault
    assert all(c["observedGeneration"] == obj["metadata"]["generation"] for c in conds.values())
