"""docs/faults.md lists every catalogued fault with the default policy's answer."""

from __future__ import annotations

from pathlib import Path

from gpufleet.domain import xids
from gpufleet.domain.explain import explain
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.policy import default_policy

DOC = Path(__file__).parents[3] / "docs" / "faults.md"


def test_fault_table_matches_the_catalogue_and_default_policy() -> None:
    lines = DOC.read_text().splitlines()
    table = [
        x for x in lines if x.startswith("| ") and not x.startswith("| XID") and "---" not in x
    ]
    rows = {line.split("|")[1].strip(): line for line in table}
    p = default_policy()
    for code in xids.XIDS:
        assert str(code) in rows, f"XID {code} missing from {DOC}"
        assert f"| {explain(p, xid=code).first} |" in rows[str(code)]
    for kind in FaultKind:
        if kind is FaultKind.XID:
            continue
        row = rows.get(f"`{kind}`")
        assert row is not None, f"{kind} missing from {DOC}"
        assert f"| {explain(p, fault=kind).first} |" in row
