"""Parsers against real-format fixtures: kmsg XID lines, NVML value sets, sysfs trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.domain.faults import FaultKind
from gpufleet.domain.profiles import SkuProfile
from gpufleet.health import kmsg, nvml_values, sysfs, tool_output
from gpufleet.health.skus import bundled

FIXTURES = Path(__file__).parents[2] / "fixtures" / "health"
H100: SkuProfile = bundled().get("h100-sxm")


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_xid_lines_of_several_driver_versions_become_faults_with_gpu_and_bus() -> None:
    buses = {"0000:3b:00": 2, "0000:b3:00": 6, "0000:18:00": 0, "0000:db:00": 7}
    scan = kmsg.scan(lines("kmsg-drivers.txt"), node="n1", now=10.0, gpu_for_bus=buses)
    got = [(f.key, f.evidence.gpu_index, f.evidence.pci_bus_id) for f in scan.faults]
    assert got == [
        ("xid-79", 2, "0000:3b:00"),
        ("xid-48", 6, "0000:b3:00"),
        ("xid-13", 0, "0000:18:00"),
        ("xid-31", None, "0000:5d:00"),
        ("xid-154", 7, "0000:db:00"),
        ("xid-119", None, "0000:ab:00"),
        ("xid-79", None, "0000:9a:00"),  # "fallen off the bus" without an Xid
        ("kernel-soft-lockup", None, None),
        ("kernel-hung-task", None, None),
    ]
    assert scan.unparsed == 0


def test_xid_154_carries_the_recovery_action_the_driver_asks_for() -> None:
    scan = kmsg.scan(lines("kmsg-drivers.txt"), node="n1", now=1.0)
    (x154,) = [f for f in scan.faults if f.xid == 154]
    assert x154.evidence.recovery_action == "node-reboot"
    lockup = next(f for f in scan.faults if f.kind is FaultKind.KERNEL_SOFT_LOCKUP)
    assert lockup.evidence.counters == {"cpu": 12, "stuck_seconds": 23}


def test_truncated_and_garbage_kernel_lines_are_counted_never_faulted() -> None:
    scan = kmsg.scan(lines("kmsg-garbage.txt"), node="n1", now=1.0)
    assert scan.faults == ()
    assert scan.unparsed == 3


def test_kmsg_record_fields_are_parsed() -> None:
    rec = kmsg.parse_record("3,1201,812345678,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, x")
    assert rec is not None and (rec.seq, rec.usec) == (1201, 812345678)
    assert kmsg.parse_record(" SUBSYSTEM=pci") is None


def nvml(name: str) -> nvml_values.GpuReading:
    reading = nvml_values.parse_gpu(json.loads((FIXTURES / name).read_text()))
    assert reading is not None
    return reading


def test_healthy_h100_value_set_has_no_fault() -> None:
    g = nvml("nvml-h100-healthy.json")
    assert g.unknown == ()
    assert nvml_values.gpu_faults(g, H100, node="n1", now=1.0) == []


def test_faulty_value_set_names_each_problem_with_counters() -> None:
    g = nvml("nvml-h100-faulty.json")
    faults = nvml_values.gpu_faults(g, H100, node="n1", now=1.0)
    kinds = {f.kind for f in faults}
    assert kinds == {
        FaultKind.ECC_UNCORRECTABLE,
        FaultKind.ROW_REMAP_PENDING,
        FaultKind.THERMAL_THROTTLE,
        FaultKind.POWER_THROTTLE,
        FaultKind.PCIE_DEGRADED,
        FaultKind.NVLINK_DOWN,
    }
    assert all(
        f.evidence.gpu_index == 3 and f.evidence.pci_bus_id == "00000000:5D:00.0" for f in faults
    )
    nv = next(f for f in faults if f.kind is FaultKind.NVLINK_DOWN)
    assert "down: 3" in nv.evidence.message and nv.evidence.counters["nvlink_active"] == 17


def test_garbage_nvml_values_are_unknown_not_faults() -> None:
    g = nvml("nvml-garbage.json")
    assert set(g.unknown) >= {
        "ecc_uncorrected_volatile",
        "remapped_rows",
        "temperature_c",
        "pcie_width",
        "nvlink_state",
        "retired_pages_sbe",
    }
    assert nvml_values.gpu_faults(g, H100, node="n1", now=1.0) == []
    assert nvml_values.parse_gpu({"index": "zero"}) is None


def test_idle_gpu_with_lowered_link_speed_is_not_degraded_but_busy_one_is() -> None:
    base = json.loads((FIXTURES / "nvml-h100-healthy.json").read_text())
    idle = nvml_values.parse_gpu({**base, "pcie_gen": 1, "clocks_event_reasons": 1})
    busy = nvml_values.parse_gpu({**base, "pcie_gen": 3, "clocks_event_reasons": 0})
    assert idle is not None and busy is not None
    assert nvml_values.gpu_faults(idle, H100, node="n", now=0) == []
    assert [f.kind for f in nvml_values.gpu_faults(busy, H100, node="n", now=0)] == [
        FaultKind.PCIE_DEGRADED
    ]


def make_tree(root: Path, ports: dict[str, tuple[str, str, str, str, str]]) -> None:
    for hca, (state, phys, rate, downed, symbols) in ports.items():
        p = root / "sys/class/infiniband" / hca / "ports/1"
        (p / "counters").mkdir(parents=True)
        (p / "state").write_text(state + "\n")
        (p / "phys_state").write_text(phys + "\n")
        (p / "rate").write_text(rate + "\n")
        (p / "link_layer").write_text("InfiniBand\n")
        (p / "counters/link_downed").write_text(downed + "\n")
        (p / "counters/symbol_error").write_text(symbols + "\n")


def test_sysfs_ports_up_down_and_garbage(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            "mlx5_0": ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "0", "0"),
            "mlx5_1": ("1: DOWN", "2: Polling", "10 Gb/sec (4X SDR)", "3", "0"),
            "mlx5_2": ("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", "oops", ""),
        },
    )
    ports = sysfs.read_ib_ports(tmp_path)
    assert ports is not None
    by = {p.hca: p for p in ports}
    assert (by["mlx5_0"].state, by["mlx5_0"].rate_gbps) == ("ACTIVE", 400.0)
    assert (by["mlx5_1"].state, by["mlx5_1"].phys_state) == ("DOWN", "POLLING")
    assert by["mlx5_2"].counters["link_downed"] is None
    from gpufleet.health.monitors import ib_faults

    baseline: dict[tuple[str, int], dict[str, int]] = {}
    faults = ib_faults(ports, baseline, H100, node="n", now=1.0)
    assert sorted((f.kind.value, f.evidence.hca) for f in faults) == [
        ("ib-port-down", "mlx5_1"),
        ("ib-rate-degraded", "mlx5_2"),
    ]


def test_a_rising_link_downed_counter_is_a_flap_and_a_reset_counter_is_not(tmp_path: Path) -> None:
    from gpufleet.health.monitors import ib_faults

    make_tree(tmp_path, {"mlx5_0": ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "5", "0")})
    base: dict[tuple[str, int], dict[str, int]] = {}
    read = lambda: sysfs.read_ib_ports(tmp_path) or []  # noqa: E731
    assert ib_faults(read(), base, H100, node="n", now=1.0) == []  # first read: baseline only
    counters = tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters"
    (counters / "link_downed").write_text("7\n")
    (counters / "symbol_error").write_text("50\n")
    faults = ib_faults(read(), base, H100, node="n", now=2.0)
    assert sorted(f.kind.value for f in faults) == ["ib-link-flap", "ib-symbol-errors"]
    flap = next(f for f in faults if f.kind is FaultKind.IB_LINK_FLAP)
    assert flap.evidence.counters["link_downed_delta"] == 2
    (counters / "link_downed").write_text("0\n")  # counters cleared
    assert ib_faults(read(), base, H100, node="n", now=3.0) == []


def test_missing_infiniband_class_is_unknown(tmp_path: Path) -> None:
    assert sysfs.read_ib_ports(tmp_path) is None
    assert sysfs.read_pci_link(tmp_path, "0000:0c:00.0") is None


@pytest.mark.parametrize(
    ("text", "speed"), [("32.0 GT/s PCIe", 32.0), ("8 GT/s", 8.0), ("Unknown", None), ("", None)]
)
def test_pci_link_speed_formats(text: str, speed: float | None) -> None:
    assert sysfs.parse_speed(text) == speed


def test_dcgmi_diag_json_of_dcgm3_and_dcgm4() -> None:
    v3 = json.dumps(
        {
            "DCGM GPU Diagnostic": {
                "test_categories": [
                    {
                        "category": "Hardware",
                        "tests": [
                            {
                                "name": "GPU Memory",
                                "results": [
                                    {"gpu_ids": "0", "status": "Pass"},
                                    {
                                        "gpu_ids": "5",
                                        "status": "Fail",
                                        "warnings": "Error using CUDA API",
                                    },
                                ],
                            }
                        ],
                    }
                ],
                "version": "3.3.5",
            }
        }
    )
    report = tool_output.parse_dcgmi_diag(v3)
    assert report is not None and report.tests_run == 2
    assert [(f.test, f.gpu) for f in report.failures] == [("GPU Memory", 5)]
    v4 = json.dumps(
        {
            "DCGM Diagnostic": {
                "test_categories": [
                    {
                        "category": "Hardware",
                        "tests": [
                            {
                                "name": "memory",
                                "results": [
                                    {
                                        "entity_group": "GPU",
                                        "entity_id": 2,
                                        "status": "Fail",
                                        "warnings": [
                                            {"error_id": 83, "message": "page retirement"}
                                        ],
                                    }
                                ],
                            }
                        ],
                    }
                ]
            }
        }
    )
    r4 = tool_output.parse_dcgmi_diag(v4)
    assert (
        r4 is not None and r4.failures[0].gpu == 2 and "page retirement" in r4.failures[0].message
    )
    assert tool_output.parse_dcgmi_diag("Error: unable to connect to host engine") is None


NCCL_OUT = (FIXTURES / "nccl-tests-all-reduce.txt").read_text()


def test_nccl_tests_output() -> None:
    r = tool_output.parse_nccl_tests(NCCL_OUT)
    assert r is not None and r.peak_busbw == pytest.approx(455.36)
    assert r.avg_busbw == pytest.approx(453.83) and r.wrong == 0
    assert tool_output.parse_nccl_tests("NCCL WARN init failed") is None
