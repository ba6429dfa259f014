"""The controller's registration check (lifecycle.machines) over the in-memory KubePort."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from gpufleet.domain import events as ev
from gpufleet.domain import inventory, node_reports, well_known
from gpufleet.lifecycle import machines

from .fakes import FakeKube

TOKEN = ("kube-system", "bootstrap-token-abcdef")


class Api(FakeKube):
    """The fake apiserver with Machine ``m1`` (when given) and its boot's join token."""

    def __init__(self, machine: dict[str, Any] | None) -> None:
        super().__init__()
        if machine is not None:
            self.custom[(well_known.MACHINE_PLURAL, "m1")] = copy.deepcopy(machine)
        self.secrets[TOKEN] = {"metadata": {"name": TOKEN[1], "namespace": TOKEN[0]}}

    @property
    def status(self) -> dict[str, Any]:
        machine = self.custom.get((well_known.MACHINE_PLURAL, "m1")) or {}
        return dict(machine.get("status") or {})


MACHINE = {
    "metadata": {"name": "m1"},
    "spec": {
        "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
        "bmc": {"endpoint": "http://bmc", "credentialsSecret": "gpufleet-system/bmc-m1"},
    },
    "status": {"armed": False, "tokenId": "abcdef"},
}


def node(
    labelled: bool = True, hw: inventory.Hardware | None = None, legacy: bool = False
) -> dict[str, Any]:
    """A joining Node; ``hw`` as the agent reports it (``legacy``: as an older agent did,
    in the former GpufleetHardware condition)."""
    conds: list[dict[str, Any]] = [{"type": "Ready", "status": "True"}]
    annotations: dict[str, str] = {}
    if hw is not None and legacy:
        text = inventory.encode(hw)
        conds.append({"type": well_known.CONDITION_HARDWARE, "status": "False", "message": text})
    elif hw is not None:
        report = node_reports.hardware(hw)
        annotations[report.key] = report.value
    labels = {well_known.LABEL_MACHINE: "m1"} if labelled else {}
    return {
        "metadata": {"name": "n1", "labels": labels, "annotations": annotations},
        "status": {"conditions": conds},
    }


def run(api: Api, body: dict[str, Any]) -> machines.Registration | None:
    return asyncio.run(machines.registration(api, body))


def test_a_node_without_a_machine_label_registers_unchecked() -> None:
    got = run(Api(None), node(labelled=False))
    assert got is not None and isinstance(got.event, ev.Registered)
    assert "not checked" in got.event.detail


def test_registration_waits_for_the_agents_hardware_report() -> None:
    assert run(Api(MACHINE), node()) is None


def test_a_match_registers_records_the_node_revokes_the_token_and_links_the_bmc() -> None:
    api = Api(MACHINE)
    got = run(api, node(hw=inventory.Hardware("NVIDIA H100 80GB HBM3", 8, 8)))
    assert got is not None and isinstance(got.event, ev.Registered)
    assert api.status["node"] == "n1" and api.status["phase"] == "Joined"
    [matches] = api.status["conditions"]
    assert (matches["type"], matches["status"], matches["reason"]) == (
        "HardwareMatches",
        "True",
        "Matches",
    )
    assert TOKEN not in api.secrets  # the used join token is revoked
    assert got.annotations == {well_known.ANNOTATION_BMC_SECRET: "gpufleet-system/bmc-m1"}


def test_an_older_agents_hardware_condition_is_still_read() -> None:
    """A node whose agent is not upgraded yet reports in the former condition."""
    got = run(Api(MACHINE), node(hw=inventory.Hardware("NVIDIA-H100-80GB-HBM3", 8, 6), legacy=True))
    assert got is not None and isinstance(got.event, ev.InventoryMismatch)


def test_a_difference_is_a_mismatch_in_words_and_a_missing_machine_too() -> None:
    api = Api(MACHINE)
    got = run(api, node(hw=inventory.Hardware("NVIDIA-H100-80GB-HBM3", 8, 6)))
    assert got is not None and isinstance(got.event, ev.InventoryMismatch)
    assert got.event.detail == "inventory mismatch: InfiniBand HCA count: expected 8, observed 6"
    assert api.status["phase"] == "Mismatch"
    missing = run(Api(None), node(hw=inventory.Hardware("x", 8, 8)))
    assert missing is not None and isinstance(missing.event, ev.InventoryMismatch)


def rejoined(ready_at: str) -> dict[str, Any]:
    """The reimaged machine's existing Node, Ready again since ``ready_at``."""
    body = node()
    body["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastTransitionTime": ready_at}
    ]
    return body


def reimaged(armed: bool = False) -> dict[str, Any]:
    machine = copy.deepcopy(MACHINE)
    machine["status"] = {
        "armed": armed,
        "tokenId": "abcdef",
        "tokenIssuedAt": "2026-11-24T10:00:00Z",
    }
    return machine


def test_a_reimaged_machines_token_is_revoked_once_its_node_is_ready_again() -> None:
    api = Api(reimaged())
    revoked = asyncio.run(machines.revoke_rejoined_token(api, rejoined("2026-11-24T10:02:30Z")))
    assert revoked and TOKEN not in api.secrets


def test_a_token_is_kept_if_the_node_was_ready_before_it_or_the_machine_is_armed() -> None:
    """Ready since before the token: the machine has not rejoined with it yet (the Node
    stayed Ready through a quick reboot, or the boot is still under way): kept, it
    expires on its own. An armed Machine has no token claimed by a boot."""
    for machine, ready_at in (
        (reimaged(), "2026-11-24T09:59:00Z"),
        (reimaged(armed=True), "2026-11-24T10:02:30Z"),
    ):
        api = Api(machine)
        assert not asyncio.run(machines.revoke_rejoined_token(api, rejoined(ready_at)))
        assert TOKEN in api.secrets


def test_no_machine_or_no_ready_time_revokes_nothing() -> None:
    api = Api(None)
    assert not asyncio.run(machines.revoke_rejoined_token(api, rejoined("2026-11-24T10:02:30Z")))
    api = Api(reimaged())
    body = rejoined("2026-11-24T10:02:30Z")
    body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert not asyncio.run(machines.revoke_rejoined_token(api, body))
    assert TOKEN in api.secrets


def test_a_reimage_to_a_version_records_it_with_the_rearm_and_a_repair_keeps_it() -> None:
    api = Api({**MACHINE, "status": {**MACHINE["status"], "image": "v1"}})
    body = {"metadata": {"name": "n1", "labels": {well_known.LABEL_MACHINE: "m1"}}}
    asyncio.run(machines.rearm_for_reimage(api, body, 1_800_000_000.0, image="v2"))
    assert api.status["image"] == "v2" and api.status["armed"] is True
    assert TOKEN not in api.secrets  # the previous boot's token is revoked
    asyncio.run(machines.rearm_for_reimage(api, body, 1_800_000_100.0))
    assert api.status["image"] == "v2"  # a repair's reimage installs what the machine has
