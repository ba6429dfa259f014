"""A new machine joins: iPXE -> cloud-init -> token -> Node -> burn-in -> production, with
the lifecycle controller checking the inventory; a mismatch goes to triage; a reimage
re-arms the machine and network-boots it once on its own BMC."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from controller_harness import (
    GV,
    SYSTEM_NS,
    Api,
    answer_request,
    bmc_counters,
    free_port,
    install,
    policy_spec,
    put_bmc_secret,
    put_policy,
    report_fault,
    running,
    self_subject_review,
    wait_for,
)

from gpufleet.domain import enrollment, inventory, node_reports, well_known
from gpufleet.local import kube as local_kube
from gpufleet.provision import machines
from gpufleet.provision.issuer import ServiceSettings
from gpufleet.provision.server import ServeOptions, in_thread

pytestmark = pytest.mark.integration

SECRET = "join-secret"
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def env(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    api = Api(local_cluster)
    install(api)
    spec = policy_spec()
    for rule in spec["rules"]:
        if rule["match"].get("xid") == 79:
            rule["action"] = "reimage"  # straight to the reimage rung
    put_policy(api, "day0", spec)
    logs = tmp_path_factory.mktemp("day0-logs")
    options = ServeOptions(kubeconfig=local_cluster.kubeconfig, port=free_port())
    try:
        with (
            in_thread(options, ServiceSettings()) as url,
            running(local_cluster, logs, policy="day0"),
        ):
            yield local_cluster, api, url
    finally:
        for name in ("day0-join", "day0-odd"):
            api.delete(f"/api/v1/nodes/{name}")
            api.delete(f"{GV}/machines/{name}")
        api.delete(f"{GV}/fleetpolicies/day0")
        api.delete(f"{GV}/noderemediations")


def add_machine(api: Api, info: Any, name: str, mac: str, bmc_node: str) -> None:
    bmc = info.bmcs[bmc_node]
    secret = put_bmc_secret(api, name, bmc.url, bmc.user, bmc.password)
    spec = machines.MachineSpec.model_validate(
        {
            "macs": [mac],
            "serial": f"SN-{bmc_node}",
            "bmc": {"endpoint": bmc.url, "credentialsSecret": secret},
            "pool": "day0",
            "hardware": {"gpuModel": H100, "gpuCount": 8, "hcaCount": 8},
            "topology": {"leaf": "ib-leaf-009", "block": "ib-block-b"},
            "enrollmentDigest": enrollment.digest(SECRET),
        }
    )
    api.post(f"{GV}/machines", machines.manifest(name, spec))


def boot(url: str, mac: str) -> tuple[str, dict[str, str]]:
    """What a booting machine does: iPXE, then user-data. Returns (token, kubelet labels)."""
    script = httpx.get(f"{url}/ipxe", params={"mac": mac})
    assert script.status_code == 200, script.text
    got = httpx.get(f"{url}/cloud-init/{mac}/user-data", headers={"X-Gpufleet-Enrollment": SECRET})
    assert got.status_code == 200, got.text
    doc = yaml.safe_load(got.text.removeprefix("#cloud-config\n"))
    join = yaml.safe_load(doc["write_files"][0]["content"])
    value = join["nodeRegistration"]["kubeletExtraArgs"][0]["value"]
    labels = dict(pair.split("=", 1) for pair in value.split(","))
    return join["discovery"]["bootstrapToken"]["token"], labels


def join(api: Api, name: str, labels: dict[str, str], observed: inventory.Hardware) -> None:
    """What kubeadm join + the kubelet + the agent do: register the Node with the labels,
    become Ready, report the hardware found."""
    body = local_kube.node_manifest(name, 200, local_kube.NodeShape())
    body["metadata"]["labels"].update(labels)
    api.post("/api/v1/nodes", body)
    wait_for(
        f"{name} Ready",
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in api.node(name).get("status", {}).get("conditions", [])
        ),
        timeout=60,
    )
    api.set_annotation(name, node_reports.hardware(observed))


def test_a_new_machine_joins_passes_burn_in_and_a_reimage_boots_it_again(env: Any) -> None:
    info, api, url = env
    bmc_node = info.node_names[3]
    add_machine(api, info, "day0-join", "aa:00:00:00:09:01", bmc_node)
    token, labels = boot(url, "aa:00:00:00:09:01")
    assert self_subject_review(info, token).status_code == 201
    join(api, "day0-join", labels, inventory.Hardware("NVIDIA H100 80GB HBM3", 8, 8))

    wait_for("burn-in", lambda: api.state("day0-join") == "burn-in", timeout=30)
    machine = api.get(f"{GV}/machines/day0-join")["status"]
    assert machine["node"] == "day0-join" and machine["phase"] == "Joined"
    # The token was used: the controller revoked it (single use).
    wait_for(
        "used token refused",
        lambda: self_subject_review(info, token).status_code == 401,
        timeout=20,
    )
    node = api.node("day0-join")
    assert node["metadata"]["annotations"][well_known.ANNOTATION_BMC_SECRET] == (
        f"{SYSTEM_NS}/bmc-day0-join"
    )
    assert answer_request(api, "day0-join", passed=True) == "checks"
    wait_for("production", lambda: api.state("day0-join") == "production", timeout=30)

    # XID 79 -> reimage: re-armed, one one-time PXE boot on this machine's BMC only.
    others = {n: bmc_counters(info, n)["BootCount"] for n in info.node_names if n != bmc_node}
    before = bmc_counters(info, bmc_node)
    report_fault(api, "day0-join", 79)
    wait_for("verifying after reimage", lambda: api.state("day0-join") == "verifying", timeout=60)
    after = bmc_counters(info, bmc_node)
    assert after["BootCount"] == before["BootCount"] + 1
    assert after["LastBootSource"] == "Pxe"
    assert {n: bmc_counters(info, n)["BootCount"] for n in others} == others
    status = api.get(f"{GV}/machines/day0-join")["status"]
    assert status["armed"] is True and status["armedBy"] == well_known.CONTROLLER
    new_token, _ = boot(url, "aa:00:00:00:09:01")
    assert new_token != token and self_subject_review(info, new_token).status_code == 201


def test_an_inventory_mismatch_goes_to_triage_with_the_difference(env: Any) -> None:
    info, api, url = env
    add_machine(api, info, "day0-odd", "aa:00:00:00:09:02", info.node_names[3])
    _token, labels = boot(url, "aa:00:00:00:09:02")
    join(api, "day0-odd", labels, inventory.Hardware(H100, 7, 8))
    wait_for("triage", lambda: api.state("day0-odd") == "triage", timeout=30)
    reason = api.node("day0-odd")["metadata"]["annotations"][well_known.ANNOTATION_REASON]
    assert "GPU count: expected 8, observed 7" in reason
    assert api.get(f"{GV}/machines/day0-odd")["status"]["phase"] == "Mismatch"
