"""The gate reads a BMC's TLS keys from the Secret the Node names and hands them to the real
Redfish driver: with the right CA (the Secret's or the controller's bundle) the act goes ahead;
with a certificate that is not the pinned one it fails, naming the key, and the BMC received
no request at all (no identity read, no mark, no reset)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.domain import well_known
from gpufleet.gate import Done, Failed, Gate, redfish_bmcs
from gpufleet.kubeapi.secrets import encode_data
from gpufleet.local import pki
from gpufleet.local import redfish as emulator

from .test_gate import ATTEMPT, NODE, World, gate_with, policy, run


@pytest.fixture
def https_bmc(tmp_path: Path) -> Iterator[tuple[emulator.BmcState, str, pki.BmcPki]]:
    files = pki.create_bmc(tmp_path / "pki", ips=["127.0.0.1"])
    entry = {"node": NODE, "port": 0, "os_shutdown_seconds": 0.05, "tls": files.emulator_tls()}
    with emulator.serving({"user": "u", "password": "p", "bmcs": [entry]}) as (server,):
        yield server.bmc, f"https://127.0.0.1:{server.server_address[1]}", files  # type: ignore[attr-defined]


def world_with_secret(endpoint: str, **tls: str) -> World:
    world = World()
    data = {"endpoint": endpoint, "username": "u", "password": "p", **tls}
    world.secrets[("bmc", "n1")] = {"metadata": {"name": "n1"}, "data": encode_data(data)}
    return world


def real_gate(world: World, ca_file: Path | None = None) -> Gate:
    ca = str(ca_file) if ca_file else None
    return gate_with(world, redfish_bmcs(timeout_s=5.0, retry_delays=(0.05,), ca_file=ca))


def test_the_secrets_ca_lets_the_reboot_through(https_bmc) -> None:  # type: ignore[no-untyped-def]
    state, url, files = https_bmc
    world = world_with_secret(url, **{"ca.crt": files.ca_cert.read_text()})
    out = run(real_gate(world).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Done), out
    assert state.reset_posts_by_type == {"GracefulRestart": 1}


def test_the_controllers_bundle_serves_a_secret_without_ca(https_bmc) -> None:  # type: ignore[no-untyped-def]
    state, url, files = https_bmc
    out = run(
        real_gate(world_with_secret(url), files.ca_cert).bmc_step(NODE, ATTEMPT, policy=policy())
    )
    assert isinstance(out, Done), out
    assert state.reset_posts == 1


def test_a_certificate_that_is_not_the_pinned_one_fails_the_step_untouched(https_bmc) -> None:  # type: ignore[no-untyped-def]
    state, url, files = https_bmc
    world = world_with_secret(url, certSha256="ab" * 32)
    out = run(real_gate(world, files.ca_cert).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Failed) and not out.identity, out
    assert f"BMC {NODE} ({url}): TLS: the certificate's sha256 fingerprint" in out.detail
    assert "not the certSha256 of Secret bmc/n1" in out.detail
    assert state.requests == 0 and state.reset_posts == 0
    assert well_known.ANNOTATION_BMC_ACTION not in world.nodes[NODE]["metadata"]["annotations"]
