"""Policy files: the default is valid; bad files are rejected with every problem located."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.faults import FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Breaker, Budget, PolicyError, default_policy, load_policy


def _with(overrides: str) -> str:
    """The default policy with top-level keys replaced by ``overrides``."""
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data.update(yaml.safe_load(textwrap.dedent(overrides)))
    return yaml.safe_dump(data, sort_keys=False)


def _issues(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_policy(text, "bad.yaml")
    return [str(i) for i in err.value.issues]


def test_default_policy_is_valid_and_walks_to_triage() -> None:
    p = load_policy(DEFAULT_POLICY_YAML)
    path = p.walk(Step.GPU_RESET)
    assert [getattr(x, "step", x) for x in path] == [
        Step.GPU_RESET, Step.REBOOT, Step.POWER_CYCLE, Step.REIMAGE, Step.TRIAGE,
    ]  # fmt: skip


def test_fleetpolicy_object_is_accepted() -> None:
    spec = textwrap.indent(DEFAULT_POLICY_YAML, "  ")
    text = (
        f"apiVersion: gpufleet.io/v1alpha1\nkind: FleetPolicy\nmetadata: {{name: x}}\nspec:\n{spec}"
    )
    assert load_policy(text).lemon.threshold == 2.5


def test_wrong_type_is_reported_with_path_and_line() -> None:
    text = DEFAULT_POLICY_YAML.replace("threshold: 2.5", "threshold: high")
    issues = _issues(text)
    assert len(issues) == 1
    line = DEFAULT_POLICY_YAML.splitlines().index("  threshold: 2.5") + 1
    assert issues[0].startswith(f"line {line}: lemon.threshold:")
    assert "number" in issues[0]


def test_unknown_xid_is_valid_with_a_warning_and_its_rule_applies() -> None:
    text = DEFAULT_POLICY_YAML.replace("  - match: {xid: 92}", "  - match: {xid: 999}")
    policy = load_policy(text)
    (warning,) = policy.warnings()
    assert "XID 999 is not in gpufleet's catalogue" in warning and "rules[" in warning
    fault = FaultEvent(FaultKind.XID, "n", at=0, xid=999)
    assert policy.rule_for(fault).match.xid == 999
    assert default_policy().warnings() == []


@pytest.mark.parametrize("xid", [0, -1, -79, 10_000_000])
def test_zero_negative_and_absurd_xids_are_rejected(xid: int) -> None:
    text = DEFAULT_POLICY_YAML.replace("  - match: {xid: 92}", f"  - match: {{xid: {xid}}}")
    (issue,) = _issues(text)
    assert "xid" in issue and "rules[" in issue


def test_nvlink5_xids_can_be_named_in_a_rule() -> None:
    text = DEFAULT_POLICY_YAML.replace("  - match: {xid: 92}", "  - match: {xid: 149}")
    policy = load_policy(text)
    assert policy.warnings() == []
    assert policy.rule_for(FaultEvent(FaultKind.XID, "n", at=0, xid=149)).match.xid == 149


def test_negative_window_is_rejected() -> None:
    text = DEFAULT_POLICY_YAML.replace("windowSeconds: 600, scope", "windowSeconds: -5, scope")
    (issue,) = _issues(text)
    assert "repeat.windowSeconds" in issue
    assert "greater than 0" in issue


def test_every_problem_is_reported_at_once() -> None:
    text = _with(
        """
        lemon: {threshold: 0, halfLifeDays: -1}
        drain: {mode: yank}
        """
    )
    issues = _issues(text)
    assert len(issues) == 3
    joined = "\n".join(issues)
    assert "lemon.threshold" in joined and "lemon.halfLifeDays" in joined
    assert "drain.mode" in joined and "'wait', 'evict' or 'delete-after-timeout'" in joined


def test_cycle_in_the_ladder_is_rejected() -> None:
    text = _with(
        """
        ladder:
          - {step: gpu-reset, onFailure: reboot}
          - {step: reboot, onFailure: gpu-reset}
        """
    )
    joined = "\n".join(_issues(text))
    assert "escalation cycles" in joined
    assert "gpu-reset -> reboot -> gpu-reset" in joined


def test_repeated_ladder_step_is_a_cycle() -> None:
    text = _with("ladder: [{step: reboot}, {step: reboot}]")
    joined = "\n".join(_issues(text))
    assert "reboot appears twice" in joined


def test_rule_pointing_at_a_missing_rung_is_rejected() -> None:
    text = _with("ladder: [{step: reboot}]")
    joined = "\n".join(_issues(text))
    assert "gpu-reset is not a step of the ladder" in joined


def test_unknown_field_is_rejected() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data["colour"] = "blue"
    (issue,) = _issues(yaml.safe_dump(data))
    assert "colour" in issue and "Extra inputs" in issue


def test_every_fault_kind_must_have_a_rule() -> None:
    # Cross-field checks run once every field is well-formed.
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data["rules"] = [r for r in data["rules"] if r["match"] != {"fault": "straggler"}]
    (issue,) = _issues(yaml.safe_dump(data))
    assert "no rule for straggler" in issue
    assert "'action: ignore' is fine" in issue


def test_duplicate_rule_is_rejected() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data["rules"].append({"match": {"xid": 79}, "action": "log"})
    joined = "\n".join(_issues(yaml.safe_dump(data)))
    assert "a second rule for xid-79" in joined


def test_repeat_must_escalate() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data["rules"].append(
        {"match": {"xid": 121}, "action": "reboot",
         "repeat": {"count": 2, "windowSeconds": 60, "then": "log"}}
    )  # fmt: skip
    joined = "\n".join(_issues(yaml.safe_dump(data)))
    assert "must be stronger than action" in joined


def test_not_yaml_and_not_a_mapping() -> None:
    assert "not valid YAML" in _issues("rules: [")[0]
    assert "must be a YAML mapping" in _issues("- 1\n- 2\n")[0]


def test_match_needs_exactly_one_selector() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data["rules"][0]["match"] = {"xid": 8, "fault": "straggler"}
    joined = "\n".join(_issues(yaml.safe_dump(data)))
    assert "exactly one of 'fault' or 'xid'" in joined


@pytest.mark.parametrize(
    ("size", "expected"),
    [(0, 0), (1, 1), (4, 1), (10, 1), (20, 2), (438, 43), (2000, 50)],
)
def test_budget_allowed(size: int, expected: int) -> None:
    assert Budget(max_nodes=50, max_percent=10, min_nodes=1).allowed(size) == expected


def test_budget_zero_max_nodes_allows_nothing() -> None:
    assert Budget(max_nodes=0, max_percent=50, min_nodes=1).allowed(100) == 0


@pytest.mark.parametrize(("size", "expected"), [(1, 2), (8, 2), (100, 10), (1000, 20)])
def test_breaker_threshold(size: int, expected: int) -> None:
    assert Breaker(max_nodes=20, max_percent=10, min_nodes=2).threshold(size) == expected
