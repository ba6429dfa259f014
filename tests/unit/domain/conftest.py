"""Helpers shared by the domain tests: a tiny in-memory fleet that applies decisions."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpufleet.domain import events as ev
from gpufleet.domain.apply import apply_decision
from gpufleet.domain.decide import Decision, decide
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.policy import Policy, default_policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.states import NodeState


@dataclass
class Fleet:
    """Applies decisions the way an executor would: store record, update the view."""

    policy: Policy
    records: dict[str, NodeRecord]
    view: FleetView = field(init=False)
    log: list[tuple[str, Decision]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.view = FleetView.of(self.records.values())

    def send(self, node: str, event: ev.Event, now: float) -> Decision:
        before = self.records[node]
        d = decide(before, self.view, event, self.policy, now)
        self.records[node] = d.record
        self.view = apply_decision(self.view, before, d, now=now, policy=self.policy)
        self.log.append((node, d))
        return d

    def state(self, node: str) -> NodeState:
        return self.records[node].state


def make_fleet(n: int, policy: Policy | None = None, pool: str = "default") -> Fleet:
    recs = {
        f"n{i}": NodeRecord.new(f"n{i}", at=0.0, pool=pool, state=NodeState.PRODUCTION)
        for i in range(n)
    }
    return Fleet(policy or default_policy(), recs)


def xid(node: str, code: int, at: float, gpu: int = 0, **kw: object) -> ev.FaultObserved:
    return ev.FaultObserved(
        FaultEvent(FaultKind.XID, node, at=at, xid=code, evidence=Evidence(gpu_index=gpu, **kw))  # type: ignore[arg-type]
    )


def fault(node: str, kind: FaultKind, at: float, **kw: object) -> ev.FaultObserved:
    return ev.FaultObserved(FaultEvent(kind, node, at=at, evidence=Evidence(**kw)))  # type: ignore[arg-type]


@pytest.fixture
def policy() -> Policy:
    return default_policy()
