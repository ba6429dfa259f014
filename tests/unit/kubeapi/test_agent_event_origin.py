"""Which Events count as what a node's agent saw on that node (the RMA evidence reads them):
only those the node's own agent posted about itself, as :func:`event_body` builds them."""

from __future__ import annotations

from typing import Any

from gpufleet.domain import well_known
from gpufleet.kubeapi.events import event_body, from_agent_of

AGENT = well_known.AGENT


def posted(*, about: str, by_instance: str, component: str = AGENT, host: str | None = None) -> Any:
    return event_body(
        involved={"apiVersion": "v1", "kind": "Node", "name": about, "uid": "u"},
        type_="Warning",
        reason="Xid79",
        message="NVRM: Xid (PCI:0000:1b:00): 79",
        component=component,
        instance=by_instance,
        namespace="default",
        first="2026-11-29T00:00:00Z",
        host=by_instance if host is None else host,
    )


def test_the_nodes_own_agent_counts() -> None:
    assert from_agent_of(posted(about="n1", by_instance="n1"), "n1", agent=AGENT)


def test_another_nodes_agent_or_another_component_does_not() -> None:
    assert not from_agent_of(posted(about="n1", by_instance="n2"), "n1", agent=AGENT)
    assert not from_agent_of(posted(about="n1", by_instance="n1", host="n2"), "n1", agent=AGENT)
    assert not from_agent_of(
        posted(about="n1", by_instance="n1", component="gpufleet-controller"), "n1", agent=AGENT
    )
    assert not from_agent_of(posted(about="n2", by_instance="n2"), "n1", agent=AGENT)


def test_an_event_missing_the_reporting_fields_does_not() -> None:
    """An Event with only ``source.component`` set (what the old check read) is not enough."""
    bare = posted(about="n1", by_instance="n1")
    del bare["reportingInstance"]
    assert not from_agent_of(bare, "n1", agent=AGENT)
    pod = posted(about="n1", by_instance="n1")
    pod["involvedObject"]["kind"] = "Pod"
    assert not from_agent_of(pod, "n1", agent=AGENT)
