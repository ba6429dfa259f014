"""``gpufleet status`` lists the NVLink domains the controller holds as one (the FleetPolicy's
``status.domainFaults``, decision 0240), in the table and as data; none, no panel."""

from __future__ import annotations

from rich.console import Console

from gpufleet.demo import status as fleet_status

POLICY = {
    "metadata": {"name": "default"},
    "status": {
        "breaker": {"open": False, "faultingNodes": 3},
        "domainFaults": {
            "nvl-a": {
                "size": 4,
                "faulty": True,
                "reporting": ["a0", "a1", "a2"],
                "held": 4,
                "waiting": 0,
                "reason": "a fault of the switch side on a0, a1, a2",
            }
        },
    },
}


def _text(st: fleet_status.FleetStatus) -> str:
    console = Console(width=160, record=True)
    console.print(fleet_status.render(st, wide=True))
    return console.export_text()


def test_a_held_domain_is_listed_with_its_trays_and_why() -> None:
    st = fleet_status.summarize([], [], [POLICY], now=0.0)
    assert st.domains == [("nvl-a", True, 4, 4, "a fault of the switch side on a0, a1, a2")]
    data = fleet_status.to_data(st)
    assert data["nvlinkDomainsHeld"] == [
        {"domain": "nvl-a", "faulty": True, "held": 4, "size": 4,
         "why": "a fault of the switch side on a0, a1, a2"}
    ]  # fmt: skip
    text = _text(st)
    assert "NVLink domains held as one" in text and "4 of 4" in text


def test_no_domain_held_no_panel() -> None:
    st = fleet_status.summarize([], [], [{"metadata": {"name": "default"}, "status": {}}], now=0.0)
    assert st.domains == [] and "NVLink domains held" not in _text(st)
