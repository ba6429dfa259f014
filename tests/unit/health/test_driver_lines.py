# ruff: noqa: E501
"""The kernel log parser against real driver lines from public reports (each case
names its source in tests/fixtures/health/driver-lines.yaml), and a property test:
no input line crashes the parser or yields a fault without a report in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import nvlink5
from gpufleet.domain.faults import FaultKind, Subsystem
from gpufleet.domain.policy import Response, default_policy
from gpufleet.health import kmsg

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parents[2] / "fixtures" / "health" / "driver-lines.yaml").read_text()
)


def test_every_case_names_its_source() -> None:
    for case in CASES:
        assert str(case["source"]).startswith(("https://", "format: ")), case["name"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"][:60] for c in CASES])
def test_real_driver_lines(case: dict[str, Any]) -> None:
    scan = kmsg.scan(case["lines"], node="n1", now=5.0, gpu_for_bus={"0000:3b:00": 3})
    assert scan.unparsed == case.get("unparsed", 0)
    assert scan.foreign == case.get("foreign", 0)
    assert len(scan.faults) == len(case["expect"]), [f.describe() for f in scan.faults]
    for fault, want in zip(scan.faults, case["expect"], strict=True):
        ev = fault.evidence
        assert fault.key == want["key"]
        assert ev.pci_bus_id == want["bus"]
        assert ev.gpu_instance == want.get("gpu_instance")
        assert ev.compute_instance == want.get("compute_instance")
        if "switch" in want:
            assert fault.subsystem is Subsystem.NVSWITCH
            assert ev.switch == want["switch"] and ev.scope() == want["switch"]
            assert ev.counters["sxid"] == want["sxid"] and ev.counters["link"] == want["link"]
        if "bucket" in want:
            assert fault.xid is not None
            assert nvlink5.bucket(fault.xid, ev.message) == want["bucket"]


def test_mig_xid_is_attributed_to_the_physical_gpu_and_shown_on_the_event() -> None:
    (case,) = [c for c in CASES if c["name"].startswith("MIG")]
    first = kmsg.scan(case["lines"], node="n1", now=1.0, gpu_for_bus={"0000:3b:00": 3}).faults[0]
    assert first.evidence.gpu_index == 3 and first.evidence.scope() == "gpu3"
    assert "GPU 3; MIG GPU instance 1 compute instance 0" in first.evidence.summary()


def test_nvlink5_messages_that_nvidia_ignores_do_not_take_the_node_out() -> None:
    policy = default_policy()
    found: dict[str, list[Response]] = {}
    for case in CASES:
        for fault in kmsg.scan(case["lines"], node="n1", now=1.0).faults:
            if fault.xid is not None and fault.xid in nvlink5.FAMILY:
                found.setdefault(
                    nvlink5.bucket(fault.xid, fault.evidence.message) or "", []
                ).append(policy.rule_for(fault).action)
    assert set(found["IGNORE"]) == {Response.LOG}
    assert set(found["RESET_GPU"]) == {Response.GPU_RESET}


@pytest.mark.parametrize(
    ("message", "want"),
    [
        # RLW_REMAP 0x1: do what an accompanying XID 154 says, else restart the job
        (
            "Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 01 (0x00000082 0x00000001 0x0 0x0 0x0 0x0)",
            "XID_154_EVAL",
        ),
        (
            "Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC0 i0 Link 01 (0x00000082 0x00000040 0x0 0x0 0x0 0x0)",
            "RESET_GPU",
        ),
        # RLW_RXPIPE 0x1 is ignored, but promoted to a reset when the driver says Fatal
        (
            "Xid (PCI:0000:04:00): 145, RLW_RXPIPE Fatal XC0 i0 Link 01 (0x000000c2 0x00000001 0x0 0x0 0x0 0x0)",
            "RESET_GPU",
        ),
        (
            "Xid (PCI:0000:04:00): 146, TLW_RX_PIPE0 Nonfatal XC0 i0 Link 01 (0x0 0x00000002 0x0 0x0 0x0 0x0)",
            "IGNORE",
        ),
        (
            "Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link -1 (0x0 0x00000000 0x0 0x0 0x0 0x0)",
            "RESET_GPU",
        ),
        ("Xid (PCI:0000:04:00): 145, something new", "RESET_GPU"),
        ("Xid (PCI:0000:04:00): 145, something new Nonfatal", "IGNORE"),
    ],
)
def test_nvlink5_decode(message: str, want: str) -> None:
    xid = int(message.split("): ")[1].split(",")[0])
    assert nvlink5.bucket(xid, message) == want
    assert nvlink5.bucket(79, message) is None


def test_xid_154_eval_restarts_the_job_without_taking_the_node_out() -> None:
    line = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 01 (0x00000082 0x00000001 0x0 0x0 0x0 0x0)"
    (fault,) = kmsg.scan([line], node="n1", now=1.0).faults
    assert default_policy().rule_for(fault).action is Response.RESTART_JOB


_MARKS = ["NVRM: Xid (PCI:0000:3b:00", "SXid (PCI:0000:04:00.0): ", "GPU-I:", "): 0, ",
          "fallen off the bus", "soft lockup - CPU#", "12,", "3,1,1,-;", "[ 1.0] ", "kernel: ",
          "Fatal, Link ", "Non-fatal", "\\x0a", "\n", " ", ",", ")", "("]  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=200),
            st.lists(st.sampled_from(_MARKS) | st.text(max_size=12), max_size=12).map("".join),
        ),
        max_size=12,
    )
)
def test_no_line_crashes_the_parser_and_every_fault_carries_its_report(lines: list[str]) -> None:
    scan = kmsg.scan(lines, node="n1", now=1.0)
    for fault in scan.faults:
        text = fault.evidence.message
        if fault.kind is FaultKind.XID:
            assert fault.xid is not None and fault.xid > 0
            assert f"{fault.xid}," in text.replace(" ", "") or "fallen off the bus" in text
        elif fault.kind in (FaultKind.NVSWITCH_FATAL, FaultKind.NVSWITCH_NONFATAL):
            assert "SXid (" in text
        else:
            assert "soft lockup" in text or "blocked for more than" in text


# One real line (https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1150) in every
# form a log reaches an operator in; the prefixes follow dmesg(1) and journalctl(1).
_LINE = "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"


@pytest.mark.parametrize(
    ("line", "kernel"),
    [
        (f"4,1201,812345678,-;{_LINE}", True),  # /dev/kmsg
        (f"[ 1843.308145] {_LINE}", True),  # dmesg
        (f"[Mon May 18 10:41:07 2026] {_LINE}", True),  # dmesg -T
        (f"2026-05-18T10:41:07,308145+00:00 {_LINE}", True),  # dmesg --time-format iso
        (f"kern  :warn  : 2026-05-18T10:41:07,308145+00:00 {_LINE}", True),  # dmesg -x iso
        (f"May 18 10:41:07 gpu-7 kernel: {_LINE}", True),  # journalctl -k, kern.log
        (f"May 18 10:41:07.308145 gpu-7 kernel: {_LINE}", True),  # -o short-precise
        (f"2026-05-18T10:41:07+0000 gpu-7 kernel: {_LINE}", True),  # -o short-iso
        (f"2026-05-18T10:41:07.308145+0000 gpu-7 kernel: {_LINE}", True),  # short-iso-precise
        (f"12,1201,812345678,-;{_LINE}", False),  # written to /dev/kmsg by a process
        (f"May 18 10:41:07 gpu-7 python3[4242]: {_LINE}", False),  # another program
        (f"user  :warn  : 2026-05-18T10:41:07,308145+00:00 {_LINE}", False),  # dmesg -x, user
    ],
)
def test_every_log_form_of_one_line(line: str, kernel: bool) -> None:
    scan = kmsg.scan([line], node="n1", now=1.0)
    assert [f.key for f in scan.faults] == (["xid-45"] if kernel else [])
    assert (scan.foreign, scan.unparsed) == ((0, 0) if kernel else (1, 0))


def test_simulated_nvlink5_xids_follow_the_decode() -> None:
    from gpufleet.health.backend_sim import SimulatedHardware

    hw = SimulatedHardware(hcas=0)
    try:
        hw.inject("xid=145,gpu=2")  # RLW_REMAP 0x40: fatal
        hw.inject("xid=145,gpu=2,unit=RLW_RXPIPE,severity=Nonfatal,status=0x00000008")
        hw.inject("xid=149,gpu=2,intr=0x026001c6")  # NETIR_LINK_EVT reason 0x26: ignore
        faults = kmsg.scan(hw.kernel_lines(), node="n1", now=1.0).faults
    finally:
        hw.close()
    policy = default_policy()
    assert [policy.rule_for(f).action for f in faults] == [
        Response.GPU_RESET,
        Response.LOG,
        Response.LOG,
    ]
