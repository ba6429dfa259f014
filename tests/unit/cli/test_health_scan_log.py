# ruff: noqa: E501
"""`gpufleet health scan-log`: faults in a saved kernel log, offline."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.main import app

runner = CliRunner()

# dmesg -T lines from https://github.com/akash-network/support/issues/244 and a
# journal line of another program carrying the same text (not a kernel record).
LOG = """\
[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008
[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No
Nov 14 13:06:01 wngpu-1 python3[4242]: NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No
[Fri Aug  9 13:33:00 2024] NVRM: Xid (PCI:zz
"""


def test_scan_log_reports_faults_with_the_policy_response(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(LOG)
    r = runner.invoke(app, ["health", "scan-log", str(log), "-o", "json"])
    assert r.exit_code == 1, r.output
    data = json.loads(r.output)
    assert [(f["fault"], f["pci"], f["policy"]) for f in data["faults"]] == [
        ("xid-43", "0000:00:05", "ignore"),
        ("xid-94", "0000:00:08", "restart-job"),
    ]
    assert (data["unparsed"], data["foreign"]) == (1, 1)


def test_scan_log_reads_stdin_and_exits_0_without_faults() -> None:
    r = runner.invoke(app, ["health", "scan-log", "-"], input="[    1.000000] Linux version 6.8\n")
    assert r.exit_code == 0, r.output
    assert "0 fault(s) in 1 record(s)" in r.output


def test_scan_log_of_a_missing_file_is_one_error_line(tmp_path: Path) -> None:
    r = runner.invoke(app, ["health", "scan-log", str(tmp_path / "nope.log")])
    assert r.exit_code == 2
    assert "cannot read" in r.output
