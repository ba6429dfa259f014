"""``gpufleet status`` sums what the goodput ledger wrote on the controller's
NodeRemediations (``status.goodput``) into one line; without a ledger, no line."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpufleet.demo import status as fleet_status

LABELS = {"app.kubernetes.io/managed-by": "gpufleet-controller"}


def closed(name: str, lost: dict[str, float] | None, labels: dict[str, str] = LABELS) -> Any:
    status: dict[str, Any] = {
        "phase": "Succeeded",
        "startedAt": "2026-01-01T00:00:00Z",
        "completedAt": "2026-01-01T01:00:00Z",
    }
    if lost is not None:
        status["goodput"] = {"lostGpuSeconds": lost, "trainings": ["llm"]}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"node": "n"}, "status": status}


def _text(st: fleet_status.FleetStatus) -> str:
    console = Console(width=200, record=True)
    console.print(fleet_status.render(st))
    return console.export_text()


def test_the_ledger_line_sums_the_charged_incidents() -> None:
    rems = [
        closed("a", {"detection": 3600.0, "recovery": 7200.0}),
        closed("b", {"detection": 3600.0}),
        closed("c", None),
        closed("forged", {"detection": 1e9}, labels={}),
    ]
    st = fleet_status.summarize([], rems, [], now=0.0)
    assert st.goodput_charged == 2
    assert st.goodput_lost == {"detection": 7200.0, "recovery": 7200.0}
    assert fleet_status.to_data(st)["goodput"] == {
        "incidents": 2,
        "lostGpuSeconds": {"detection": 7200.0, "recovery": 7200.0},
    }
    assert "4.00 GPU-h lost in 2 incident(s) (detection 2.00, recovery 2.00" in _text(st)


def test_no_ledger_no_line() -> None:
    st = fleet_status.summarize([], [closed("c", None)], [], now=0.0)
    assert "goodput ledger" not in _text(st)
