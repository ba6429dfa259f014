"""Is this BMC the node's? The pure comparison behind every power action."""

from __future__ import annotations

import uuid

from gpufleet.remediate.identity import BmcIdentity, ExpectedIdentity, mismatches, same_uuid

SEEN = BmcIdentity(serial="SN-A1", uuid="6b1d8f3e-1c2a-4f5e-9a7b-0c1d2e3f4a5b", hostname="node-a")


def test_with_a_machine_the_serial_decides() -> None:
    expected = ExpectedIdentity(node="node-a", machine="node-a", serial="sn-a1 ")
    assert mismatches(expected, SEEN) == ()  # case and blanks do not matter
    other = ExpectedIdentity(node="node-a", machine="node-a", serial="SN-B7")
    (problem,) = mismatches(other, SEEN)
    assert "SN-A1" in problem and "SN-B7" in problem


def test_with_a_machine_the_host_name_does_not_matter() -> None:
    expected = ExpectedIdentity(node="node-a", machine="node-a", serial="SN-A1")
    assert mismatches(expected, BmcIdentity(serial="SN-A1", hostname="localhost")) == ()


def test_a_bmc_without_a_serial_cannot_be_verified_against_a_machine() -> None:
    expected = ExpectedIdentity(node="node-a", machine="node-a", serial="SN-A1")
    (problem,) = mismatches(expected, BmcIdentity(hostname="node-a"))
    assert "no SerialNumber" in problem


def test_a_missing_machine_is_unverifiable() -> None:
    expected = ExpectedIdentity(node="node-a", machine="m", machine_error="no Machine m")
    assert mismatches(expected, SEEN) == ("no Machine m",)


def test_the_secret_must_point_at_the_machines_bmc() -> None:
    expected = ExpectedIdentity(
        node="node-a",
        machine="node-a",
        serial="SN-A1",
        machine_endpoint="https://10.0.0.5/",
        endpoint="https://10.0.0.9",
    )
    (problem,) = mismatches(expected, SEEN)
    assert "10.0.0.9" in problem and "10.0.0.5" in problem
    same = ExpectedIdentity(
        node="node-a",
        machine="node-a",
        serial="SN-A1",
        machine_endpoint="https://10.0.0.5/",
        endpoint="https://10.0.0.5",
    )
    assert mismatches(same, SEEN) == ()


def test_without_a_machine_the_host_name_must_name_the_node() -> None:
    assert mismatches(ExpectedIdentity(node="node-a"), SEEN) == ()
    fqdn = BmcIdentity(hostname="node-a.rack3.example.com")
    assert mismatches(ExpectedIdentity(node="node-a"), fqdn) == ()
    assert mismatches(ExpectedIdentity(node="node-b"), SEEN)
    assert mismatches(ExpectedIdentity(node="node-a"), BmcIdentity(serial="x"))  # no HostName


def test_a_node_in_a_name_prefix_is_not_a_match() -> None:
    assert mismatches(ExpectedIdentity(node="node-a"), BmcIdentity(hostname="node-a1"))


def test_the_kubelets_system_uuid_must_match_where_both_report_one() -> None:
    expected = ExpectedIdentity(node="node-a", system_uuid=str(uuid.uuid4()))
    (problem,) = mismatches(expected, SEEN)
    assert "UUID" in problem
    assert mismatches(ExpectedIdentity(node="node-a", system_uuid=SEEN.uuid), SEEN) == ()
    assert mismatches(ExpectedIdentity(node="node-a"), SEEN) == ()  # the node reports none


def test_the_mixed_endian_spelling_of_one_uuid_is_the_same_machine() -> None:
    u = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    swapped = uuid.UUID(bytes=u.bytes_le)
    assert str(swapped) == "33221100-5544-7766-8899-aabbccddeeff"
    assert same_uuid(str(u), str(swapped)) and same_uuid(str(swapped), str(u))
    assert not same_uuid(str(u), str(uuid.uuid4()))
