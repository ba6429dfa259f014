"""Fabric faults judged with their NVLink domain on real components: the apiserver, the
controller as a process, KWOK trays labelled in two NVLink domains (four and three trays).

A switch fault (nvswitch-fatal) reported on three trays of domain ``nvl-a`` takes all four of
its trays out as one and holds them: each is drained with the ``nvlink-domain`` incident, and no
ladder step starts on any of them however long they wait; domain ``nvl-b`` is untouched. One
Event on the FleetPolicy says so and ``status.domainFaults`` lists the domain. A fabric fault of
one tray of ``nvl-b`` alone is the tray's own: drained at once, its ladder starts once the
window has passed. When the fabric of ``nvl-a`` reports healthy again, its trays are verified.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    labelled_fleet,
    policy_spec,
    put_policy,
    running,
)
from waiting import wait_for

from gpufleet.domain import conditions, domain_faults, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

POLICY = "domain-faults"
LABEL = "network.topology.nvidia.com/accelerator"
NODES = {"nvl-a": [f"fab-a-{i}" for i in range(4)], "nvl-b": [f"fab-b-{i}" for i in range(3)]}
WINDOW = 3.0


@pytest.fixture(scope="module")
def api(local_cluster: ClusterInfo) -> Iterator[Api]:
    with labelled_fleet(local_cluster, LABEL, NODES, pool="domain-faults", policy=POLICY) as api:
        yield api


def spec() -> dict[str, Any]:
    s = policy_spec()
    s["safety"]["budget"] = {"maxNodes": 20, "maxPercent": 100, "minNodes": 1}
    s["safety"]["breaker"] = {"maxNodes": 50, "maxPercent": 100, "minNodes": 20}  # out of the way
    s["domainFaults"] = {"minTrays": 2, "windowSeconds": WINDOW}
    return s


def report(api: Api, node: str, kind: FaultKind, subsystem: Subsystem, **evidence: Any) -> None:
    fault = FaultEvent(kind, node, at=time.time(), evidence=Evidence(**evidence))
    api.set_condition(node, conditions.problem(subsystem, [fault]))


def held(api: Api, name: str) -> bool:
    record = api.record(name)
    return (
        record is not None
        and record.state.value == "draining"
        and domain_faults.held(record.incident)
        and record.incident is not None
        and record.incident.drained
    )


def policy_events(api: Api, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.events(POLICY) if e["reason"] == reason]


def domain_status(api: Api) -> dict[str, Any]:
    status = api.get(f"{GV}/fleetpolicies/{POLICY}").get("status") or {}
    return dict(status.get("domainFaults") or {})


def test_a_switch_fault_takes_its_domain_out_as_one_and_a_trays_own_fault_stays_its_own(
    local_cluster: ClusterInfo, api: Api, tmp_path: Path
) -> None:
    every = [n for names in NODES.values() for n in names]
    put_policy(api, POLICY, spec())
    with running(local_cluster, tmp_path, policy=POLICY) as ctl:
        wait_for("adopted", lambda: all(api.state(n) == "production" for n in every))
        since = {n: api.resource_version(n) for n in every}
        a, b = NODES["nvl-a"], NODES["nvl-b"]
        for name in a[:3]:
            report(
                api, name, FaultKind.NVSWITCH_FATAL, Subsystem.NVSWITCH,
                switch="nvidia-nvswitch0", message="SXid 24007 (fatal)",
            )  # fmt: skip
        wait_for("nvl-a held as one", lambda: all(held(api, n) for n in a), timeout=30)
        # Held: many windows later no tray of nvl-a has started a ladder step.
        ctl.wait_ticks(int(3 * WINDOW / 0.3), timeout=60)
        for name in a:
            seen = api.records_since(name, since[name])
            steps = [r for r in seen if r.incident is not None and r.incident.tried]
            assert not steps, (name, steps[-1].incident)
            assert held(api, name)
            node = api.node(name)
            assert node["spec"].get("unschedulable")
            ann = node["metadata"].get("annotations") or {}
            assert well_known.ANNOTATION_AGENT_REQUEST not in ann
        assert all(api.state(n) == "production" for n in b)
        faulted = wait_for(
            "one DomainFaulted Event", lambda: policy_events(api, "DomainFaulted"), timeout=30
        )
        assert len(faulted) == 1 and "NVLink domain nvl-a" in faulted[0]["message"]
        wait_for(
            "status.domainFaults",
            lambda: (domain_status(api).get("nvl-a") or {}).get("held") == 4,
            timeout=30,
        )
        status = domain_status(api)["nvl-a"]
        assert status["faulty"] and status["size"] == 4
        assert status["reporting"] == a[:3] and "nvl-b" not in domain_status(api)

        # One tray's own fabric fault: drained at once, its ladder once the window passed.
        lone = b[0]
        report(api, lone, FaultKind.FABRIC_DEGRADED, Subsystem.FABRIC, gpu_index=0)

        def stepped() -> bool:
            seen = api.records_since(lone, since[lone])
            return any(r.incident is not None and r.incident.tried for r in seen)

        wait_for(f"{lone}'s own ladder", stepped, timeout=30)
        record = api.record(lone)
        assert record is not None and record.incident is not None
        assert record.incident.key == "fabric-degraded"
        assert all(api.state(n) == "production" for n in b[1:])
        assert "nvl-b" not in domain_status(api)

        # The fabric of nvl-a healthy again: its trays are verified before they take work.
        for name in a[:3]:
            api.set_condition(name, conditions.healthy(Subsystem.NVSWITCH))
        wait_for(
            "nvl-a verified",
            lambda: all(api.state(n) == "verifying" for n in a),
            timeout=30,
        )
        wait_for("DomainRepaired", lambda: policy_events(api, "DomainRepaired"), timeout=30)
        wait_for("nvl-a out of status", lambda: "nvl-a" not in domain_status(api), timeout=30)
