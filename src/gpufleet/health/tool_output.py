"""Parsers for the output of vendor tools: ``dcgmi diag -j`` and nccl-tests.

Both are pure text-in, values-out, so they are tested without the tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import nccl_tests


@dataclass(frozen=True, slots=True)
class DcgmFailure:
    """One failed DCGM test on one GPU (``gpu`` None: not GPU-specific)."""

    test: str
    gpu: int | None
    status: str
    message: str


@dataclass(frozen=True, slots=True)
class DcgmReport:
    """What ``dcgmi diag -j`` said."""

    tests_run: int
    failures: tuple[DcgmFailure, ...]
    version: str | None


def _warnings(result: dict[str, Any]) -> str:
    w = result.get("warnings", result.get("info", ""))
    if isinstance(w, list):
        return "; ".join(x.get("message", str(x)) if isinstance(x, dict) else str(x) for x in w)
    return str(w)


def _gpu_of(result: dict[str, Any]) -> int | None:
    for key in ("gpu_id", "gpu_ids", "entity_id"):
        value = result.get(key)
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    return None


def parse_dcgmi_diag(text: str) -> DcgmReport | None:
    """Parse ``dcgmi diag -r N -j`` (DCGM 2.x, 3.x and 4.x layouts); None if not that JSON."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    if not isinstance(doc, dict):
        return None
    body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    if not isinstance(body, dict) or not isinstance(body.get("test_categories"), list):
        return None
    run = 0
    failures: list[DcgmFailure] = []
    for cat in body["test_categories"]:
        for test in cat.get("tests", []) if isinstance(cat, dict) else []:
            if not isinstance(test, dict):
                continue
            name = str(test.get("name", "?"))
            for result in test.get("results", []):
                if not isinstance(result, dict):
                    continue
                run += 1
                status = str(result.get("status", "")).strip().lower()
                if status in ("fail", "failed", "error"):
                    failures.append(DcgmFailure(name, _gpu_of(result), status, _warnings(result)))
    version = body.get("version") or doc.get("version")
    return DcgmReport(run, tuple(failures), str(version) if version else None)


# nccl-tests' output has its one codec in domain (the domain burn-in reads it too).
NcclTestsResult = nccl_tests.NcclTestsResult
parse_nccl_tests = nccl_tests.parse
