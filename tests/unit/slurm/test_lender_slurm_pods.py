"""The lender leaves alone the Pods that Slurm schedules itself (decision 0257): a Pod whose
``spec.schedulerName`` is ``gpufleet-slurm`` waits in Slurm's queue, so taking a node from
Slurm for it would preempt Slurm's jobs behind that queue's back."""

from __future__ import annotations

import asyncio

from gpufleet.domain import well_known
from gpufleet.kubeapi import Json
from gpufleet.slurm import nodes as kn
from gpufleet.slurm.lender import bind_refusal, slurm_schedules

from .test_guarded_writes import (
    LENT_IN_SLURM,
    THRESHOLD,
    VersionedKube,
    locked,
    node,
    pod,
    syncer,
)


def slurm_pod(name: str = "infer") -> Json:
    """A pod the lender would take a node for, but for its scheduler's name."""
    p = pod(name)
    p["spec"]["schedulerName"] = well_known.POD_SCHEDULER_NAME
    return p


def test_a_pod_slurm_schedules_is_never_lent_a_node() -> None:
    kube = VersionedKube({"n1": node("n1"), "n2": node("n2")})
    s = syncer(kube, hold_taint=True, preempt_priority=THRESHOLD)
    assert s.lender is not None
    assert slurm_schedules(slurm_pod()) and not slurm_schedules(pod())
    assert not s.lender.wants_node(slurm_pod())
    asyncio.run(s.lender.consider(slurm_pod()))
    assert not any(kn.lent_to(n) for n in kube.stored.values())
    assert kube.reviews == 0  # not even asked whether it may bind there
    # The same pod under kube-scheduler's name is lent one (the rule is the name only).
    asyncio.run(s.lender.consider(pod()))
    assert [kn.lent_to(n) for n in kube.stored.values()].count("ml/infer") == 1


def test_a_node_locked_for_a_pod_slurm_schedules_binds_nobody_and_goes_back() -> None:
    """A lock written before the pod's scheduler was changed (or forged) is refused at the
    bind and the node returned to Slurm."""
    assert "Slurm's work" in str(bind_refusal(slurm_pod(), locked(), key="ml/infer", threshold=1))
    kube = VersionedKube({"n1": locked("ml/infer")})
    s = syncer(kube, hold_taint=True, preempt_priority=THRESHOLD)
    s.slurm = {"n1": LENT_IN_SLURM}
    assert s.lender is not None
    s.lender.pods["ml/infer"] = slurm_pod()
    asyncio.run(s.lender.tick())
    assert kube.binds == []
    stored = kube.stored["n1"]
    assert well_known.ANNOTATION_LENT_TO not in stored["metadata"]["annotations"]
    assert kn.slurm_taint_value(stored) == kn.HELD
