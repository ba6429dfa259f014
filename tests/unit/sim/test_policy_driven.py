"""The simulator runs the policy it is given: decisions come from domain.decide."""

from __future__ import annotations

from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.policy import default_policy, load_policy
from gpufleet.sim import simulate
from gpufleet.sim.model import Model, default_model
from gpufleet.sim.scenarios import NO_LEMON_POLICY_YAML, REACTIVE, lemon_policy_yaml, with_overrides


def test_a_paused_policy_repairs_nothing_and_people_step_in() -> None:
    paused = load_policy(DEFAULT_POLICY_YAML.replace("paused: false", "paused: true"))
    r = simulate(default_model(), paused, gpus=3504, days=30, seed=4)
    auto = simulate(default_model(), default_policy(), gpus=3504, days=30, seed=4)
    ladder = {"gpu-reset", "reboot", "power-cycle", "reimage"}
    assert r.held > 0
    assert not any(ladder & h.keys() for h in r.handled.values())
    assert any(ladder & h.keys() for h in auto.handled.values())
    assert r.ettr < auto.ettr


def test_a_rule_change_changes_what_happens() -> None:
    """XID 48 sent straight to RMA: every HBM fault ends at the vendor, none at a reset."""
    text = DEFAULT_POLICY_YAML.replace(
        "  - match: {xid: 48}\n    action: gpu-reset", "  - match: {xid: 48}\n    action: rma"
    )
    assert text != DEFAULT_POLICY_YAML
    r = simulate(default_model(), load_policy(text), gpus=3504, days=30, seed=5)
    hbm = r.handled["gpu-hbm"]
    assert hbm.get("rma", 0) > 0
    assert "gpu-reset" not in hbm


def test_lemon_detection_sends_lemons_to_rma() -> None:
    """Strong lemons (30x) and a strict lemon score (1.5, half-life 28 d): lemons get replaced."""
    model = with_overrides(
        default_model(), {"failures.lemons.fraction": 0.05, "failures.lemons.multiplier": 30.0}
    )
    rule = lemon_policy_yaml(1.5, 1.5, 28)
    assert rule != DEFAULT_POLICY_YAML
    on = [simulate(model, load_policy(rule), gpus=3504, days=30, seed=s) for s in (1, 2)]
    off = [
        simulate(model, load_policy(NO_LEMON_POLICY_YAML), gpus=3504, days=30, seed=s)
        for s in (1, 2)
    ]
    # Lemons found sooner are replaced sooner. Their effect on ETTR over 30 days is
    # within the seed-to-seed spread (docs/simulator.md, "Lemon scores"): not asserted.
    assert sum(r.lemons_replaced for r in on) > sum(r.lemons_replaced for r in off)


def test_without_monitors_a_person_finds_every_bad_node() -> None:
    r = simulate(REACTIVE.model(), REACTIVE.policy(), gpus=3504, days=30, seed=1)
    assert r.human_actions > 0
    assert r.buckets["detection"] > 3600.0  # people take hours, monitors seconds
    assert not any({"gpu-reset", "reboot"} & h.keys() for h in r.handled.values())


def test_silent_faults_are_found_sooner_with_active_checks() -> None:
    """Frequent SDC: checks at each restart find it in hours; the job's loss curve in ~12 h.

    The work trained on a corrupting GPU is discarded either way; checks discard less.
    """
    data = default_model().model_dump()
    for c in data["failures"]["categories"]:
        if c["name"] == "sdc":
            c["rate"] = 2.0
    sdc = Model.model_validate(data)
    no_checks = with_overrides(sdc, {"detection.active_checks.enabled": False})
    with_ = [simulate(sdc, default_policy(), gpus=2048, days=20, seed=s) for s in (1, 2)]
    without = [simulate(no_checks, default_policy(), gpus=2048, days=20, seed=s) for s in (1, 2)]
    back_with = sum(r.sdc_rollback_hours for r in with_)
    back_without = sum(r.sdc_rollback_hours for r in without)
    assert back_without > 0
    assert back_with < 0.6 * back_without


def test_a_step_slower_than_its_policy_timeout_escalates() -> None:
    """GPU resets that take 20+ minutes time out (policy: 600 s), so the ladder reboots."""
    slow = with_overrides(
        default_model(),
        {"remediation.steps.gpu-reset": {"seconds": 1500.0, "success": 1.0}},
    )
    r = simulate(slow, default_policy(), gpus=3504, days=30, seed=5)
    hbm = r.handled["gpu-hbm"]
    assert "gpu-reset" not in hbm
    assert hbm.get("reboot", 0) > 0


def test_hot_spares_come_from_the_policy_and_step_in_when_nodes_leave() -> None:
    """The policy's pool (1% of 443 nodes: 4) is kept out of the job and promoted through
    decide(); promotion is immediate, so the pool's mark alone changes no outcome."""
    model = default_model()
    with_pool = simulate(model, default_policy(), gpus=3504, days=30, seed=3)
    no_pool = default_policy().model_copy(
        update={"spares": default_policy().spares.model_copy(update={"percent": 0.0})}
    )
    without = simulate(model, no_pool, gpus=3504, days=30, seed=3)
    assert with_pool.spare_promotions > 0 and 0 < with_pool.hot_spares <= 4
    assert without.spare_promotions == 0 and without.hot_spares == 0
    assert with_pool.ettr == without.ettr
