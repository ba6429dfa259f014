"""A policy written for an earlier version loads: each removed field is converted where it
maps (or ignored) and named with its replacement (docs/decisions/0189)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from gpufleet.api import fleetpolicy
from gpufleet.domain import policy_compat
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.policy import Policy, PolicyError, default_policy, load_policy


def _spec(**lemon: Any) -> dict[str, Any]:
    spec = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec.pop("lemon", None)
    if lemon:
        spec["lemon"] = lemon
    return dict(spec)


def _load(spec: dict[str, Any]) -> Policy:
    return load_policy(yaml.safe_dump(spec), "test")


def test_every_removed_field_names_its_replacement_version_and_decision() -> None:
    assert {f.name for f in policy_compat.REMOVED} == {"lemon.incidents", "lemon.windowDays"}
    for f in policy_compat.REMOVED:
        assert (
            f.replacement[-1]
            in Policy.model_json_schema(by_alias=True)["$defs"]["Lemon"]["properties"]
        ), f.name
        assert f.removed_in and f.decision.startswith("decision ")


@pytest.mark.parametrize(
    ("old", "value", "field", "converted"),
    [
        ("incidents", 3, "threshold", 2.5),  # the old default is the new default
        ("incidents", 5, "threshold", 4.5),
        ("windowDays", 7, "half_life_days", 14.0),
        ("windowDays", 2.5, "half_life_days", 5.0),
    ],
)
def test_a_removed_lemon_field_is_converted(
    old: str, value: float, field: str, converted: float
) -> None:
    policy = _load(_spec(**{old: value}))
    assert getattr(policy.lemon, field) == converted
    (d,) = policy.deprecations
    assert d.field.name == f"lemon.{old}" and d.converted == converted
    message = policy.warnings()[0]
    assert f"lemon.{old} was removed in 0.1.0" in message
    assert f"use {d.field.replaced_by}" in message and "read as" in message


def test_the_lemon_rule_of_the_previous_version_loads_whole() -> None:
    """The shape the policy had before decision 0102: 3 incidents in 7 days."""
    policy = _load(_spec(incidents=3, windowDays=7, then="rma"))
    assert (policy.lemon.threshold, policy.lemon.half_life_days) == (2.5, 14.0)
    assert policy.lemon.then.value == "rma"
    assert [d.field.name for d in policy.deprecations] == ["lemon.incidents", "lemon.windowDays"]


def test_the_replacement_wins_when_both_are_set() -> None:
    policy = _load(_spec(incidents=6, threshold=2.0, windowDays=3, halfLifeDays=20))
    assert (policy.lemon.threshold, policy.lemon.half_life_days) == (2.0, 20)
    assert all(d.converted is None for d in policy.deprecations)
    assert all("is set" in w and "ignored" in w for w in policy.warnings())


@pytest.mark.parametrize("value", [1, 2.5, "three", None, True])
def test_a_value_the_old_field_never_took_is_ignored_and_said(value: Any) -> None:
    policy = _load(_spec(incidents=value))
    assert policy.lemon.threshold == 2.5  # the default
    (d,) = policy.deprecations
    assert d.converted is None and "ignored" in d.message()


def test_python_names_are_accepted_too_and_the_input_is_not_changed() -> None:
    spec = _spec(window_days=4)
    before = copy.deepcopy(spec)
    policy = Policy.model_validate(spec)
    assert policy.lemon.half_life_days == 8.0 and spec == before


def test_a_fleetpolicy_object_and_a_current_policy() -> None:
    body = {"apiVersion": "gpufleet.io/v1alpha1", "kind": "FleetPolicy", "spec": _spec(incidents=4)}
    assert _load(body).lemon.threshold == 3.5
    assert default_policy().deprecations == () and not default_policy().warnings()


def test_other_unknown_fields_are_still_refused() -> None:
    with pytest.raises(PolicyError, match="incidentz"):
        _load(_spec(incidentz=3))


def test_the_crd_schema_accepts_the_removed_fields_marked_deprecated() -> None:
    lemon = fleetpolicy.spec_schema()["properties"]["lemon"]["properties"]
    assert lemon["incidents"]["type"] == "integer" and lemon["incidents"]["minimum"] == 2
    assert lemon["windowDays"]["type"] == "number"
    for old, new in (("incidents", "lemon.threshold"), ("windowDays", "lemon.halfLifeDays")):
        text = lemon[old]["description"]
        assert text.startswith("Deprecated: removed in 0.1.0") and f"use {new}" in text
