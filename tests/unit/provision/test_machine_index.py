"""The Machine index's bookkeeping (no apiserver: the watch loop is tested in
tests/integration/test_provision_index.py)."""

from __future__ import annotations

from typing import Any

from gpufleet.provision.index import MachineIndex


def machine(name: str, *macs: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"macs": list(macs)}}


def test_nothing_is_answered_before_a_complete_list() -> None:
    index = MachineIndex(api=None)  # type: ignore[arg-type]
    index.apply("ADDED", machine("a", "aa:00:00:00:00:01"))
    assert index.lookup("aa:00:00:00:00:01") is None
    index.replace([machine("a", "aa:00:00:00:00:01")], "5")
    assert index.synced and index.resource_version == "5"
    assert index.lookup("aa:00:00:00:00:01") is not None


def test_events_add_change_and_remove_macs() -> None:
    index = MachineIndex(api=None)  # type: ignore[arg-type]
    index.replace([machine("a", "aa:00:00:00:00:01", "aa:00:00:00:00:02")], "5")
    index.apply("ADDED", machine("b", "AA-00-00-00-00-03", rv="6"))
    assert (index.lookup("aa:00:00:00:00:03") or {})["metadata"]["name"] == "b"
    # a MAC moved from a to b: a no longer answers for it
    index.apply("MODIFIED", machine("a", "aa:00:00:00:00:01", rv="7"))
    index.apply("MODIFIED", machine("b", "aa:00:00:00:00:03", "aa:00:00:00:00:02", rv="8"))
    assert (index.lookup("aa:00:00:00:00:02") or {})["metadata"]["name"] == "b"
    assert (index.lookup("aa:00:00:00:00:01") or {})["metadata"]["resourceVersion"] == "7"
    index.apply("DELETED", machine("b", "aa:00:00:00:00:03", "aa:00:00:00:00:02", rv="9"))
    assert index.lookup("aa:00:00:00:00:02") is None and index.lookup("aa:00:00:00:00:03") is None
    assert len(index) == 1
    index.apply("BOOKMARK", {"metadata": {"resourceVersion": "12"}})
    assert index.resource_version == "12"


def test_a_new_list_replaces_everything() -> None:
    index = MachineIndex(api=None)  # type: ignore[arg-type]
    index.replace([machine("a", "aa:00:00:00:00:01")], "5")
    index.replace([machine("b", "aa:00:00:00:00:02")], "9")
    assert index.lookup("aa:00:00:00:00:01") is None
    assert index.lookup("aa:00:00:00:00:02") is not None
