"""The gate against an in-memory API and BMC: each way an act must be refused, and the one way
it goes ahead. Every test breaks one thing on purpose and counts the POSTs the BMC received."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

from gpufleet.api import nodedata
from gpufleet.clock import ManualClock
from gpufleet.domain import emptiness, well_known
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, SlurmSilence, SlurmWait, default_policy
from gpufleet.domain.records import Incident, NodeRecord, StepAttempt
from gpufleet.domain.states import NodeState
from gpufleet.gate import (
    BmcFactory,
    Done,
    Failed,
    Gate,
    GateSettings,
    Held,
    Refused,
    Stale,
    StaticFence,
)
from gpufleet.gate.attempts import network_boot_may_be_starting
from gpufleet.kubeapi import NODES, SECRETS, Json, Patch, Resource
from gpufleet.kubeapi.machines import MachineStore
from gpufleet.kubeapi.secrets import encode_data
from gpufleet.remediate import machine_power, redfish, steps
from gpufleet.remediate.evidence import ActionMark, ResetEvidence
from gpufleet.remediate.identity import BmcIdentity

from ..fakes import FakeBmc
from ..lifecycle.fakes import KEY, FakeKube, node

NODE = "n1"
OPENED = 1_000.0
ATTEMPT = steps.Attempt(Step.REBOOT, 1, 1_010.0)
SETTINGS = GateSettings(probe_timeout_s=0.5, probe_poll_s=0.05, settle_s=0.2, graceful_settle_s=0.4)


def remediating(step: Step = Step.REBOOT) -> NodeRecord:
    inc = Incident(
        key="xid-79",
        description="XID 79",
        opened_at=OPENED,
        plan=step,
        current=step,
        tried=(StepAttempt(step, 1, 1_010.0),),
    )
    return NodeRecord(
        name=NODE, state=NodeState.REMEDIATING, since=1_010.0, reason="x", incident=inc
    )


def policy(slurm: SlurmWait = SlurmWait.NEVER, **update: Any) -> Policy:
    p = default_policy()
    return p.model_copy(update={"drain": p.drain.model_copy(update={"slurm": slurm}), **update})


class World(FakeKube):
    """The API with a Node in remediation, its BMC Secret, and a Slurm syncer stand-in that
    answers probes with ``slurm_answer`` (None: silent)."""

    def __init__(self, record: NodeRecord | None = None, *, signed: bool = True) -> None:
        super().__init__()
        body = node(NODE)
        ann = body["metadata"]["annotations"]
        rec = record or remediating()
        ann.update(nodedata.record_annotations(rec, KEY))
        if not signed:
            del ann[well_known.ANNOTATION_RECORD_SIGNATURE]
        ann[well_known.ANNOTATION_BMC_SECRET] = "bmc/n1"
        self.add_node(body)
        data = {"endpoint": "https://bmc-1", "username": "u", "password": "p"}
        self.secrets[("bmc", "n1")] = {"metadata": {"name": "n1"}, "data": encode_data(data)}
        self.slurm_answer: str | None = "idle+DRAIN"
        self.second_answer: str | None = None
        """From the second probe on (None: the same as the first)."""
        self.probes = 0
        self.on_mark: Any = None
        """Called when a mark is written (a test lands a pod at that moment)."""

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json:
        out = await super().patch(
            resource, name, patch, namespace=namespace, status=status, kind=kind
        )
        ann = (patch.get("metadata") or {}).get("annotations") or {}
        probe = emptiness.Probe.from_annotation(ann.get(well_known.ANNOTATION_SLURM_PROBE))
        if probe is not None:
            self.probes += 1
            if self.probes == 2 and self.second_answer is not None:
                self.slurm_answer = self.second_answer
            if self.slurm_answer is not None:
                work = emptiness.work_report(
                    self.slurm_answer, (), probe.incident, 1.0, probe=probe.id
                )
                if self.slurm_answer.startswith("allocated"):
                    work = replace(work, jobs=("42",))
                await super().patch(
                    NODES,
                    name,
                    {
                        "metadata": {
                            "annotations": {well_known.ANNOTATION_SLURM_WORK: work.to_annotation()}
                        }
                    },
                )
        if ann.get(well_known.ANNOTATION_BMC_ACTION) and self.on_mark is not None:
            self.on_mark()
        return out

    def add_pod(self, name: str = "p1", **spec: Any) -> None:
        self.pods.append(
            {
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": NODE, **spec},
                "status": {"phase": "Running"},
            }
        )


def machine_bmc() -> FakeBmc:
    """The node's BMC: it says it is ``n1`` (the identity check passes)."""
    bmc = FakeBmc()
    bmc.seen = BmcIdentity(serial="SN-1", hostname=NODE)
    return bmc


def gate(world: World, bmc: FakeBmc, *, holding: bool = True) -> Gate:
    @contextlib.asynccontextmanager
    async def open_bmc(creds: redfish.BmcCredentials, name: str) -> AsyncIterator[FakeBmc]:
        yield bmc

    return gate_with(world, open_bmc, holding=holding)


def gate_with(world: World, bmcs: BmcFactory, *, holding: bool = True) -> Gate:
    """The gate over ``world`` with the BMC drivers ``bmcs`` opens."""
    return Gate(
        world,
        bmcs,
        fence=StaticFence("replica-a", holding=holding),
        keys=lambda: [KEY],
        clock=ManualClock(2_000.0),
        settings=SETTINGS,
    )


def resets(bmc: FakeBmc) -> list[str]:
    return [c for c in bmc.calls if c.startswith("reset ")]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ----------------------------------------------------------------------- ahead


def test_slurm_asked_again_after_the_mark_stops_a_job_that_started_since_the_proof() -> None:
    # An admin resumed the node and a job started between the proof and the mark.
    world, bmc = World(), machine_bmc()
    world.second_answer = "allocated"
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy(SlurmWait.AUTO)))
    assert isinstance(out, Refused) and "asked again" in out.detail, out
    assert resets(bmc) == [] and world.probes == 2
    assert well_known.ANNOTATION_BMC_ACTION not in world.nodes[NODE]["metadata"]["annotations"]


def test_an_empty_node_is_rebooted_once_after_a_signed_mark_written_by_compare_and_swap() -> None:
    world, bmc = World(), machine_bmc()
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Done), out
    assert resets(bmc) == ["reset GracefulRestart"]
    ann = world.nodes[NODE]["metadata"]["annotations"]
    text, trust = nodedata.read_mark_text(world.nodes[NODE], [KEY])
    assert trust is nodedata.Trust.SIGNED and text == ann[well_known.ANNOTATION_BMC_ACTION]


def test_slurm_is_asked_at_the_moment_of_the_act_and_its_fresh_answer_decides() -> None:
    for answer, ok in (("idle+DRAIN", True), ("absent", True), ("allocated+DRAIN", False)):
        world, bmc = World(), machine_bmc()
        world.slurm_answer = answer
        out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy(SlurmWait.AUTO)))
        assert world.probes == (2 if ok else 1)  # asked again after the mark, before the POST
        assert isinstance(out, Done if ok else Refused), (answer, out)
        assert len(resets(bmc)) == (1 if ok else 0)
    world, bmc = World(), machine_bmc()
    world.slurm_answer = "absent"  # drain.slurm always: Slurm has no node is not "empty"
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy(SlurmWait.ALWAYS)))
    assert isinstance(out, Refused) and resets(bmc) == []


def test_a_silent_slurm_refuses_unless_the_rule_says_proceed() -> None:
    world, bmc = World(), machine_bmc()
    world.slurm_answer = None
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy(SlurmWait.AUTO)))
    assert isinstance(out, Refused) and "failing closed" in out.detail and resets(bmc) == []
    rec = remediating()
    assert rec.incident is not None
    proceed = replace(rec, incident=replace(rec.incident, if_slurm_silent=SlurmSilence.PROCEED))
    world, bmc = World(proceed), machine_bmc()
    world.slurm_answer = None
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy(SlurmWait.AUTO)))
    assert isinstance(out, Done) and len(resets(bmc)) == 1


# ----------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    "pod",
    [
        {},  # an ordinary pod
        {"tolerations": [{"operator": "Exists"}]},  # tolerates everything
    ],
)
def test_a_pod_on_the_node_at_the_moment_of_the_act_refuses_it(pod: dict[str, Any]) -> None:
    world, bmc = World(), machine_bmc()
    world.add_pod(**pod)
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Refused) and "pod" in out.detail
    assert (
        resets(bmc) == []
        and well_known.ANNOTATION_BMC_ACTION not in world.nodes[NODE]["metadata"]["annotations"]
    )


def test_a_pod_bound_between_the_proof_and_the_post_is_seen_and_the_mark_removed() -> None:
    world, bmc = World(), machine_bmc()
    world.on_mark = lambda: world.add_pod("late")
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Refused) and "landed" in out.detail
    assert resets(bmc) == []
    assert well_known.ANNOTATION_BMC_ACTION not in world.nodes[NODE]["metadata"]["annotations"]


# ----------------------------------------------------------------------- held


def test_an_unsigned_or_forged_record_is_never_acted_on() -> None:
    world, bmc = World(signed=False), machine_bmc()
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Held) and "not trusted" in out.detail and resets(bmc) == []
    world, bmc = World(), machine_bmc()
    ann = world.nodes[NODE]["metadata"]["annotations"]
    other = nodedata.record_annotations(replace(remediating(), name="n2"), KEY)
    ann[well_known.ANNOTATION_RECORD] = other[well_known.ANNOTATION_RECORD]  # copied
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Held) and resets(bmc) == []


def test_no_lease_no_act_and_pause_or_dry_run_hold_it() -> None:
    world, bmc = World(), machine_bmc()
    out = run(gate(world, bmc, holding=False).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Held) and "lease" in out.detail
    for update in ({"paused": True}, {"dry_run": True}):
        out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy(**update)))
        assert isinstance(out, Held)
    assert resets(bmc) == [] and world.probes == 0


def test_an_attempt_the_record_no_longer_asks_for_is_stale() -> None:
    world, bmc = World(), machine_bmc()
    later = steps.Attempt(Step.POWER_CYCLE, 1, 1_020.0)
    out = run(gate(world, bmc).bmc_step(NODE, later, policy=policy()))
    assert isinstance(out, Stale) and resets(bmc) == []


def test_two_replicas_racing_on_one_attempt_post_once() -> None:
    world, bmc = World(), machine_bmc()
    a, b = gate(world, bmc), gate(world, bmc)

    async def both() -> list[Any]:
        return list(
            await asyncio.gather(
                a.bmc_step(NODE, ATTEMPT, policy=policy()),
                b.bmc_step(NODE, ATTEMPT, policy=policy()),
            )
        )

    outcomes = run(both())
    assert len(resets(bmc)) == 1, (outcomes, bmc.calls)
    assert sum(isinstance(o, Done) for o in outcomes) >= 1


# ---------------------------------------------------------------------- resumed


def _marked(world: World, reset_type: str, baseline: ResetEvidence) -> None:
    mark = ActionMark(
        step=ATTEMPT.step.value,
        attempt=ATTEMPT.attempt,
        started_at=ATTEMPT.started_at,
        reset_type=reset_type,
        baseline=baseline,
        posted_at=1_999.9,
    )
    world.nodes[NODE]["metadata"]["annotations"].update(
        nodedata.mark_annotations(NODE, mark.to_json(), KEY)
    )


def test_a_resumed_attempt_whose_reset_shows_is_done_without_a_post() -> None:
    world, bmc = World(), machine_bmc()
    _marked(world, "GracefulRestart", ResetEvidence(last_reset_time="t0", power_state="On"))
    bmc.resets = 1  # the BMC shows a reset since the baseline
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Done) and resets(bmc) == []


def test_a_graceful_restart_that_does_not_show_is_never_posted_again() -> None:
    world, bmc = World(), machine_bmc()
    _marked(world, "GracefulRestart", ResetEvidence(last_reset_time="t0", power_state="On"))
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Failed) and "not posted again" in out.detail
    assert resets(bmc) == []


def test_an_immediate_reset_that_never_happened_is_posted_once_after_a_fresh_proof() -> None:
    world, bmc = World(), machine_bmc()
    _marked(world, "ForceRestart", ResetEvidence(last_reset_time="t0", power_state="On"))
    world.add_pod()
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Refused) and resets(bmc) == []  # proven again: a pod came
    world.pods.clear()
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Done) and len(resets(bmc)) == 1


def test_a_forged_mark_for_the_attempt_in_progress_fails_closed() -> None:
    world, bmc = World(), machine_bmc()
    _marked(world, "ForceRestart", ResetEvidence(last_reset_time="t0"))
    world.nodes[NODE]["metadata"]["annotations"][well_known.ANNOTATION_BMC_ACTION_SIGNATURE] = (
        "v1:forged:00"
    )
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, Failed) and "cannot be trusted" in out.detail and resets(bmc) == []


# ------------------------------------------------------------------- the agent


def test_a_gpu_reset_request_is_written_only_after_the_proof() -> None:
    world = World(remediating(Step.GPU_RESET))
    world.add_pod()
    g = gate(world, machine_bmc())

    def request() -> str | None:
        return world.nodes[NODE]["metadata"]["annotations"].get(well_known.ANNOTATION_AGENT_REQUEST)

    out = run(g.agent_request(NODE, "gpu-reset", policy=policy()))
    assert isinstance(out, Refused) and request() is None
    world.pods.clear()
    out = run(g.agent_request(NODE, "gpu-reset", policy=policy()))
    assert isinstance(out, Done) and request() is not None
    patches = world.patches
    out = run(g.agent_request(NODE, "gpu-reset", policy=policy()))
    assert isinstance(out, Done) and world.patches == patches  # already there: not rewritten
    out = run(g.agent_request(NODE, "command", policy=policy()))
    assert isinstance(out, Stale)  # not what the record asks for


# ------------------------------------------------------------------- machines


def test_a_machine_with_a_node_is_never_power_cycled_by_a_boot() -> None:
    world, bmc = World(), machine_bmc()
    world.custom[("machines", NODE)] = {"metadata": {"name": NODE}, "spec": {}, "status": {}}
    world.nodes[NODE]["metadata"]["labels"][well_known.LABEL_MACHINE] = NODE
    with pytest.raises(machine_power.PowerRefused, match="has joined as Node"):
        run(gate(world, bmc).network_boot(MachineStore(world), NODE, by="admin", now=1.0))
    assert resets(bmc) == []


def test_an_automated_boot_honours_the_lease_and_the_rails() -> None:
    world, bmc = World(), machine_bmc()
    world.custom[("machines", "m9")] = {"metadata": {"name": "m9"}, "spec": {}, "status": {}}
    for g, p, why in (
        (gate(world, bmc, holding=False), policy(), "lease"),
        (gate(world, bmc), policy(paused=True), "paused"),
    ):
        with pytest.raises(machine_power.PowerRefused, match=why):
            run(g.network_boot(MachineStore(world), "m9", by="c", now=1.0, policy=p))
    assert resets(bmc) == []


def _ended(state: NodeState, step: Step = Step.REBOOT) -> NodeRecord:
    rec = remediating(step)
    assert rec.incident is not None
    done = replace(rec.incident.tried[-1], ended_at=1_020.0)
    return replace(rec, state=state, incident=replace(rec.incident, current=None, tried=(done,)))


def test_disarm_removes_a_one_time_boot_and_the_mark_goes() -> None:
    world, bmc = World(_ended(NodeState.TRIAGE)), machine_bmc()
    g = gate(world, bmc)
    _marked(world, "PowerCycle", ResetEvidence(last_reset_time="t0"))
    assert run(g.disarm(NODE, ATTEMPT, boot_window_s=WINDOW))
    run(g.clear_mark(NODE, ATTEMPT))
    assert "boot cleared" in bmc.calls
    assert well_known.ANNOTATION_BMC_ACTION not in world.nodes[NODE]["metadata"]["annotations"]


@pytest.mark.parametrize(
    "record",
    [remediating(), _ended(NodeState.VERIFYING, Step.REIMAGE)],
    ids=["its-attempt-in-progress", "its-reimage-verifying"],
)
def test_disarm_judges_the_node_as_it_is_now_and_keeps_a_boot_in_use(record: NodeRecord) -> None:
    """A sweep that read a stale copy of the record must not cancel a network boot the
    attempt set or the machine may still read (0177): the gate reads the Node again."""
    world, bmc = World(record), machine_bmc()
    attempt = steps.Attempt(Step.REIMAGE, 1, 1_010.0) if "verifying" in record.state else ATTEMPT
    assert not run(gate(world, bmc).disarm(NODE, attempt, boot_window_s=WINDOW))
    assert "boot cleared" not in bmc.calls


REIMAGE = steps.Attempt(Step.REIMAGE, 1, 1_010.0)
WINDOW = 900.0
"""The boot window (the policy's ``provisioning.stallSeconds``)."""


def _reimage_reset_out(
    *, reset_type: str = "PowerCycle", performed: bool = True, boot: str | None = "Pxe"
) -> tuple[World, FakeBmc]:
    """A reimage that went to triage (an operator's) 0.1 s after its PowerCycle POST
    (the mark, ``posted_at`` 1,999.9; the gate's clock reads 2,000)."""
    world, bmc = World(_ended(NodeState.TRIAGE, Step.REIMAGE)), machine_bmc()
    mark = ActionMark(
        step=REIMAGE.step.value,
        attempt=REIMAGE.attempt,
        started_at=REIMAGE.started_at,
        reset_type=reset_type,
        baseline=ResetEvidence(last_reset_time="t0", power_state="On"),
        posted_at=1_999.9,
    )
    world.nodes[NODE]["metadata"]["annotations"].update(
        nodedata.mark_annotations(NODE, mark.to_json(), KEY)
    )
    bmc.resets, bmc.boot = (1 if performed else 0), boot
    bmc.power = "Off" if reset_type == "ForceOff" else "On"
    return world, bmc


def test_disarm_keeps_a_network_boot_the_machine_may_be_starting_to_read() -> None:
    """Seed 37 of the simulation: an operator's triage 1.8 s after a reimage's reset. The
    firmware reads the override minutes later; removed now, the machine boots its old
    disk (0255). Kept, and the mark with it, so a later sweep asks again."""
    world, bmc = _reimage_reset_out()
    assert not run(gate(world, bmc).disarm(NODE, REIMAGE, boot_window_s=WINDOW))
    assert "boot cleared" not in bmc.calls and bmc.boot == "Pxe"


@pytest.mark.parametrize(
    ("case", "window"),
    [
        ("used", WINDOW),  # the firmware read it: the BMC shows none armed
        ("left-off", WINDOW),  # a ForceOff + On stopped at its ForceOff: nothing starts
        ("not-performed", WINDOW),  # the BMC shows no reset: nothing is starting
        ("past-the-window", 0.05),  # the firmware had its time and did not read it
    ],
)
def test_disarm_removes_a_network_boot_nothing_will_read(case: str, window: float) -> None:
    world, bmc = _reimage_reset_out(
        reset_type="ForceOff" if case == "left-off" else "PowerCycle",
        performed=case != "not-performed",
        boot=None if case == "used" else "Pxe",
    )
    assert run(gate(world, bmc).disarm(NODE, REIMAGE, boot_window_s=window))
    assert "boot cleared" in bmc.calls and bmc.boot is None


def test_secrets_are_read_from_the_nodes_annotation_only() -> None:
    world, bmc = World(), machine_bmc()
    del world.secrets[("bmc", "n1")]
    out = run(gate(world, bmc).bmc_step(NODE, ATTEMPT, policy=policy()))
    assert isinstance(out, (Failed, Held)) and resets(bmc) == []
    assert SECRETS.plural == "secrets"


def test_a_reimage_given_up_before_its_post_leaves_no_one_time_boot_armed() -> None:
    # The reimage marks its network boot, sets it, then marks its reset: a pod landing at
    # that moment (or the attempt timing out) stops it, and the boot must not stay armed.
    reimage = steps.Attempt(Step.REIMAGE, 1, 1_010.0)
    world, bmc = World(remediating(Step.REIMAGE)), machine_bmc()
    marks: list[str] = []

    def second_mark() -> None:
        marks.append("mark")
        if len(marks) == 2:
            world.add_pod("late")

    world.on_mark = second_mark
    out = run(gate(world, bmc).bmc_step(NODE, reimage, policy=policy()))
    assert isinstance(out, Refused) and resets(bmc) == []
    assert bmc.calls.index("boot Pxe") < bmc.calls.index("boot cleared")


def test_a_reimage_marks_its_network_boot_before_setting_it() -> None:
    # Killed between the override and its reset, the attempt leaves a mark, so whoever
    # finds the attempt ended removes the override (the sweep's disarm).
    reimage = steps.Attempt(Step.REIMAGE, 1, 1_010.0)
    world, bmc = World(remediating(Step.REIMAGE)), machine_bmc()
    seen: list[tuple[str, list[str]]] = []

    def look() -> None:
        ann = world.nodes[NODE]["metadata"]["annotations"]
        mark = ActionMark.from_json(ann.get(well_known.ANNOTATION_BMC_ACTION))
        assert mark is not None
        seen.append((mark.reset_type, list(bmc.calls)))

    world.on_mark = look
    out = run(gate(world, bmc).bmc_step(NODE, reimage, policy=policy()))
    assert isinstance(out, Done)
    assert seen[0][0] == steps.NETWORK_BOOT and "boot Pxe" not in seen[0][1]
    assert "boot Pxe" in seen[1][1] and resets(bmc) == [f"reset {seen[1][0]}"]


@pytest.mark.parametrize(
    ("step", "state", "starting"),
    [
        (Step.REIMAGE, NodeState.VERIFYING, True),  # the firmware may not have read it yet
        (Step.REIMAGE, NodeState.PRODUCTION, False),  # verified: an armed one was never used
        (Step.REIMAGE, NodeState.TRIAGE, False),
        (Step.REIMAGE, NodeState.REMEDIATING, False),  # its own attempt: bound by the mark
        (Step.REBOOT, NodeState.VERIFYING, False),
    ],
)
def test_a_reimages_network_boot_is_kept_only_while_it_is_verified(
    step: Step, state: NodeState, starting: bool
) -> None:
    """Decision 0177: the sweep leaves a reimage's override while its verification runs."""
    done = replace(StepAttempt(step, 1, 1_010.0), ended_at=1_020.0)
    rec = remediating(step)
    assert rec.incident is not None
    rec = replace(rec, state=state, incident=replace(rec.incident, current=None, tried=(done,)))
    assert network_boot_may_be_starting(rec) is starting
    assert not network_boot_may_be_starting(None)
