"""Every XID and fault class: meaning, NVIDIA's action, and what the default policy does."""

from __future__ import annotations

import pytest

from gpufleet.domain import xids
from gpufleet.domain.faults import FAULTS, Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Response, default_policy

REQUIRED_XIDS = [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 110,
                 119, 120, 121, 136, 140, 143, 144, 145, 146, 147, 148, 149, 150, 154,
                 155, 156, 158]  # fmt: skip

# What one occurrence does under the default policy.
EXPECTED_FIRST_RESPONSE = {
    8: Response.RESTART_JOB, 13: Response.RESTART_JOB, 31: Response.RESTART_JOB,
    32: Response.RESTART_JOB,
    43: Response.IGNORE, 45: Response.LOG, 46: Response.GPU_RESET, 48: Response.GPU_RESET,
    61: Response.LOG, 62: Response.GPU_RESET, 63: Response.LOG, 64: Response.GPU_RESET,
    68: Response.RESTART_JOB, 69: Response.RESTART_JOB, 74: Response.GPU_RESET,
    79: Response.REBOOT, 92: Response.LOG, 94: Response.RESTART_JOB, 95: Response.GPU_RESET,
    109: Response.GPU_RESET, 110: Response.GPU_RESET, 119: Response.REBOOT,
    120: Response.GPU_RESET, 121: Response.LOG,
    136: Response.GPU_RESET, 140: Response.GPU_RESET, 143: Response.GPU_RESET,
    # 144-150 without a decodable message: a reset (the message decides; test_nvlink5)
    144: Response.GPU_RESET, 145: Response.GPU_RESET, 146: Response.GPU_RESET,
    147: Response.GPU_RESET, 148: Response.GPU_RESET, 149: Response.GPU_RESET,
    150: Response.GPU_RESET, 154: Response.GPU_RESET, 155: Response.GPU_RESET,
    156: Response.GPU_RESET, 157: Response.LOG, 158: Response.GPU_RESET,
}  # fmt: skip


def test_catalogue_covers_the_xids_that_matter() -> None:
    assert set(REQUIRED_XIDS) <= set(xids.XIDS)
    assert set(EXPECTED_FIRST_RESPONSE) == set(xids.XIDS)


@pytest.mark.parametrize("code", sorted(xids.XIDS))
def test_xid_entry_and_default_response(code: int) -> None:
    info = xids.XIDS[code]
    assert info.code == code
    assert info.meaning and info.mnemonic
    rule = default_policy().rule_for(
        FaultEvent(FaultKind.XID, "n", at=0, xid=code, evidence=Evidence(gpu_index=0))
    )
    assert rule.action is EXPECTED_FIRST_RESPONSE[code]
    # An application-level XID alone never takes a node out.
    if info.xid_class is xids.XidClass.APPLICATION:
        assert not rule.action.takes_node_out
    # NVIDIA says the node needs attention: the default policy takes it out.
    if info.nvidia_action in (xids.NvidiaAction.RESET_GPU, xids.NvidiaAction.RESTART_BM):
        assert rule.action.takes_node_out


def test_xid_61_follows_nvidia_contact_support_and_newest_reset_xids_are_listed() -> None:
    assert xids.XIDS[61].nvidia_action is xids.NvidiaAction.CONTACT_SUPPORT
    for code in (110, 155, 156, 158):
        assert xids.XIDS[code].nvidia_action is xids.NvidiaAction.RESET_GPU
    for code in range(144, 151):
        assert xids.XIDS[code].nvidia_action is xids.NvidiaAction.WORKFLOW_NVLINK5_ERR
        assert xids.XIDS[code].subsystem is Subsystem.NVLINK


def test_xid_79_is_reboot_class() -> None:
    info = xids.XIDS[79]
    assert info.nvidia_action is xids.NvidiaAction.RESTART_BM
    assert info.start_at is Step.REBOOT


@pytest.mark.parametrize("kind", [k for k in FaultKind if k is not FaultKind.XID])
def test_every_fault_kind_has_meaning_subsystem_and_a_rule(kind: FaultKind) -> None:
    info = FAULTS[kind]
    assert info.meaning
    assert isinstance(info.subsystem, Subsystem)
    event = FaultEvent(kind, "n", at=0)
    rule = default_policy().rule_for(event)
    assert rule.match.fault is kind
    assert isinstance(rule.action, Response)


def test_fault_event_requires_xid_number_only_for_xids() -> None:
    with pytest.raises(ValueError, match="XID number"):
        FaultEvent(FaultKind.XID, "n", at=0)
    with pytest.raises(ValueError, match="XID number"):
        FaultEvent(FaultKind.GPU_MISSING, "n", at=0, xid=79)


def test_evidence_summary_and_scope() -> None:
    e = Evidence(gpu_index=3, pci_bus_id="0000:1b:00.0", counters={"dbe": 2}, message="boom")
    assert e.scope() == "gpu3"
    assert e.summary() == "GPU 3; PCI 0000:1b:00.0; dbe=2; boom"
    assert Evidence(hca="mlx5_0", port=1).scope() == "mlx5_0/1"
    assert Evidence().scope() == "node"
    f = FaultEvent(FaultKind.XID, "n", at=0, xid=79, evidence=e)
    assert f.key == "xid-79"
    assert f.describe() == "xid79 gpu3"
    assert f.subsystem is Subsystem.GPU
    assert FaultEvent(FaultKind.IB_PORT_DOWN, "n", at=0).subsystem is Subsystem.INFINIBAND
