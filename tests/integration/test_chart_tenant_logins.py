"""The chart's login pods per tenant (decision 0285): each entry of `tenants` gets its own
login Deployment, Service and users ConfigMap holding its users only, so one tenant's users
cannot log in where another's homes and keys are; slurmctld and slurmd still know every
user (a job runs as its user's uid on any node). Rendered by helm (scripts/build-helm.sh).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_chart_quality import key, render, render_fails

pytestmark = pytest.mark.integration

VALUES = """\
tenantController: {enabled: true}
networkPolicy: {enabled: true}
slurm:
  users: [{name: carol, uid: 20100, authorizedKeys: ["ssh-ed25519 AAAAC carol"]}]
tenants:
  - name: vision
    namespaces: [vision]
    users: [{name: alice, uid: 20001, gid: 20001, sshKeys: ["ssh-ed25519 AAAAA alice"]}]
  - name: speech
    namespaces: [speech]
    users:
      - {name: bob, uid: 20002, sshKeys: ["ssh-ed25519 AAAAB bob"]}
      - {name: dave, uid: 20003, sshKeys: ["ssh-ed25519 AAAAD dave"]}
"""
FULL = "gpufleet"
SELECTS = "app.kubernetes.io/name"


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    values = tmp_path_factory.mktemp("tenant-logins") / "values.yaml"
    values.write_text(VALUES)
    return {(k[0], k[2]): d for d in render(FULL, "-f", str(values)) for k in [key(d)]}


def _accounts(cm: dict[str, Any]) -> list[str]:
    return [line.split()[0] for line in cm["data"]["accounts"].splitlines() if line.strip()]


def _keys(cm: dict[str, Any]) -> set[str]:
    return {k.removesuffix(".keys") for k in cm["data"] if k.endswith(".keys")}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_each_tenant_has_a_login_that_knows_only_its_users(
    objects: dict[tuple[str, str], dict[str, Any]],
) -> None:
    for tenant, users in (("vision", ["alice"]), ("speech", ["bob", "dave"])):
        name = f"{FULL}-slurm-login-{tenant}"
        deployment = objects[("Deployment", name)]
        assert deployment["metadata"]["labels"]["gpufleet.io/tenant"] == tenant
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        users_cm = next(v["configMap"]["name"] for v in volumes if v["name"] == "slurm-users")
        assert users_cm == f"{FULL}-slurm-users-{tenant}"
        cm = objects[("ConfigMap", users_cm)]
        assert _accounts(cm) == users and _keys(cm) == set(users)
        assert objects[("Service", name)]["spec"]["selector"]["gpufleet.io/tenant"] == tenant


def test_slurm_knows_every_user_but_the_shared_login_only_slurm_users_keys(
    objects: dict[tuple[str, str], dict[str, Any]],
) -> None:
    shared = objects[("ConfigMap", f"{FULL}-slurm-users")]
    assert _accounts(shared) == ["carol", "alice", "bob", "dave"]
    assert _keys(shared) == {"carol"}  # tenants' users cannot log in to the shared pods
    ctld = objects[("StatefulSet", f"{FULL}-slurm-controller")]
    volumes = ctld["spec"]["template"]["spec"]["volumes"]
    assert {"name": f"{FULL}-slurm-users"} == next(
        v["configMap"] for v in volumes if v["name"] == "slurm-users"
    )


def test_every_login_service_and_policy_selects_exactly_one_deployments_pods(
    objects: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """A Service selecting two tenants' pods would send one tenant's ssh to the other's
    login pod; two Deployments selecting each other's pods would fight over them."""
    logins = {
        n: d["spec"]["template"]["metadata"]["labels"]
        for (kind, n), d in objects.items()
        if kind == "Deployment" and "slurm-login" in n
    }
    assert set(logins) == {f"{FULL}-slurm-login{s}" for s in ("", "-vision", "-speech")}
    for (kind, n), d in objects.items():
        if "slurm-login" not in n or kind not in ("Service", "NetworkPolicy", "Deployment"):
            continue
        spec = d["spec"]
        if kind == "Service":
            selector = spec["selector"]
        elif kind == "NetworkPolicy":
            selector = spec["podSelector"]["matchLabels"]
        else:
            selector = spec["selector"]["matchLabels"]
        assert [m for m, labels in logins.items() if _matches(selector, labels)] == [n], (kind, n)


def test_a_user_in_two_tenants_or_a_name_too_long_is_refused(tmp_path: Path) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text(VALUES.replace("name: bob", "name: alice"))
    assert '"alice" is also in tenant vision' in render_fails(
        "--set", "bmcSecretsNamespace=b", "--set", "controller.tickets.evidenceNamespace=e",
        "-f", str(twice),
    )  # fmt: skip
    long = tmp_path / "long.yaml"
    long.write_text(VALUES.replace("name: vision", "name: " + "v" * 45))
    assert "longer than 63 characters" in render_fails(
        "--set", "bmcSecretsNamespace=b", "--set", "controller.tickets.evidenceNamespace=e",
        "-f", str(long),
    )  # fmt: skip
