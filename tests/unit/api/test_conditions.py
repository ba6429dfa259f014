"""metav1.Condition semantics, in the one place every CR status writer takes them from."""

from __future__ import annotations

import pytest

from gpufleet.api import conditions
from gpufleet.domain.enrollment import rfc3339


def test_setting_one_type_keeps_the_others_and_their_order() -> None:
    conds = conditions.set_condition(None, "Valid", "True", "Valid", "in use", now=100.0)
    conds = conditions.set_condition(conds, "BreakerOpen", "False", "Closed", "0 nodes", now=200.0)
    conds = conditions.set_condition(conds, "Valid", "False", "Invalid", "bad", now=300.0)
    assert [(c["type"], c["status"]) for c in conds] == [
        ("Valid", "False"),
        ("BreakerOpen", "False"),
    ]


def test_last_transition_time_moves_only_when_the_status_changes() -> None:
    conds = conditions.set_condition(None, "Ready", "True", "Reconciled", "3 nodes", now=100.0)
    again = conditions.set_condition(conds, "Ready", "True", "Reconciled", "4 nodes", now=200.0)
    assert again[0]["lastTransitionTime"] == rfc3339(100.0)
    assert again[0]["message"] == "4 nodes"  # reason and message follow the truth
    flipped = conditions.set_condition(again, "Ready", "False", "SlurmUnavailable", "x", now=300.0)
    assert flipped[0]["lastTransitionTime"] == rfc3339(300.0)


def test_observed_generation_is_carried_and_reasons_are_camel_case() -> None:
    [c] = conditions.set_condition(
        None, "Valid", "True", "Valid", "m" * 5000, now=1.0, observed_generation=7
    )
    assert c["observedGeneration"] == 7 and len(c["message"]) == conditions.MAX_MESSAGE
    with pytest.raises(ValueError, match="CamelCase"):
        conditions.condition("Valid", "True", "not camel", "", since=1.0)
    assert conditions.find([c], "Valid") is c and conditions.find([c], "Other") is None
