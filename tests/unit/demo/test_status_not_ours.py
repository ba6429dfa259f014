"""`gpufleet status` counts a NodeRemediation only if ours and its Node points to it."""

from __future__ import annotations

from typing import Any

from gpufleet.demo.status import not_ours
from gpufleet.domain import well_known
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import Incident
from gpufleet.lifecycle import remediations


def nrem(name: str, node: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"node": node}}


def test_the_controllers_manifest_carries_its_mark() -> None:
    inc = Incident(key="xid-79", description="x", opened_at=1.0, plan=None)
    body = remediations.manifest("n1", inc, default_policy())
    assert body["metadata"]["labels"][well_known.LABEL_MANAGED_BY] == well_known.CONTROLLER
    pointers = {"n1": body["metadata"]["name"]}
    assert not_ours(body, pointers) is None


def test_forged_or_unpointed_remediations_are_not_ours() -> None:
    mark = {well_known.LABEL_MANAGED_BY: well_known.CONTROLLER}
    pointers = {"n1": "n1-1000"}
    forged = not_ours(nrem("n1-1000", "n1"), pointers)
    assert forged is not None and "not created by" in forged
    stray = not_ours(nrem("n1-2000", "n1", mark), pointers)
    assert stray is not None and "does not point" in stray
    assert not_ours(nrem("n2-1", "n2", mark), pointers) is not None
    # A finished incident of ours is history, not a forgery.
    assert not_ours(nrem("n1-500", "n1", mark), pointers, finished=True) is None
