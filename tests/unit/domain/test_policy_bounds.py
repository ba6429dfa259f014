"""Every number of a policy is finite and bounded (domain.bounds), with a located error."""

from __future__ import annotations

import math

import pytest
import yaml

from gpufleet.domain import bounds
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.policy import Policy, PolicyError, load_policy


def _with(path: str, value: str) -> str:
    """The default policy with ``path`` (dotted; ``ladder.0.timeoutSeconds``) set to the
    YAML scalar ``value`` (``.inf``, ``.nan``, ``1e30``...), as a person would write it."""
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    node = data
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    marker = "__VALUE__"
    node[int(last) if last.isdigit() else last] = marker
    return yaml.safe_dump(data).replace(f"'{marker}'", value).replace(marker, value)


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_policy(text, "p.yaml")
    return [str(i) for i in err.value.issues]


@pytest.mark.parametrize(
    "path",
    [
        "ladder.0.timeoutSeconds",
        "drain.timeoutSeconds",
        "drain.slurmSilentSeconds",
        "checks.verificationTimeoutSeconds",
        "checks.burnInTimeoutSeconds",
        "safety.breaker.windowSeconds",
        "safety.breaker.cooldownSeconds",
        "safety.rateLimit.windowSeconds",
        "detection.clearAfterSeconds",
        "provisioning.stallSeconds",
        "lemon.halfLifeDays",
        "lemon.weights.hardware",
        "safety.budget.maxPercent",
    ],
)
@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_infinite_and_nan_numbers_are_refused_with_their_field(path: str, value: str) -> None:
    problems = _problems(_with(path, value))
    assert len(problems) == 1, problems
    assert path.replace(".0.", "[0].") in problems[0]
    assert problems[0].startswith("line "), problems[0]  # located in the file


@pytest.mark.parametrize(
    ("path", "value", "maximum"),
    [
        ("safety.budget.maxNodes", "1000000000000000000000000000000", bounds.MAX_NODES),
        ("safety.budget.minNodes", "100001", bounds.MAX_NODES),
        ("safety.budget.fleetMaxNodes", "100001", bounds.MAX_NODES),
        ("safety.breaker.maxNodes", "200000", bounds.MAX_NODES),
        ("spares.maxNodes", "100001", bounds.MAX_NODES),
        ("safety.rateLimit.maxActions", "1.0e+12", bounds.MAX_ACTIONS),
        ("ladder.0.timeoutSeconds", "604801", bounds.MAX_TIMEOUT_SECONDS),
        ("ladder.0.attempts", "101", bounds.MAX_ATTEMPTS),
        ("safety.breaker.windowSeconds", "1.0e+9", bounds.MAX_WINDOW_SECONDS),
        ("lemon.threshold", "1.0e+6", bounds.MAX_SCORE),
        ("detection.stragglers.windowSteps", "1000000", bounds.MAX_WINDOW_STEPS),
    ],
)
def test_absurdly_large_numbers_are_refused_naming_the_maximum(
    path: str, value: str, maximum: float
) -> None:
    problems = _problems(_with(path, value))
    assert len(problems) == 1, problems
    where = path.replace(".0.", "[0].")
    assert where in problems[0]
    assert f"{maximum:g}" in problems[0] or f"{int(maximum)}" in problems[0], problems[0]


def test_a_repeat_window_and_count_are_bounded() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    rule = next(i for i, r in enumerate(data["rules"]) if r.get("repeat"))
    data["rules"][rule]["repeat"]["windowSeconds"] = float("inf")
    data["rules"][rule]["repeat"]["count"] = 10**6
    problems = _problems(yaml.safe_dump(data))
    assert any(f"rules[{rule}].repeat.windowSeconds" in p for p in problems), problems
    assert any(f"rules[{rule}].repeat.count" in p for p in problems), problems


def test_the_maxima_themselves_are_accepted() -> None:
    text = _with("safety.budget.maxNodes", str(bounds.MAX_NODES))
    assert load_policy(_with("ladder.0.timeoutSeconds", "604800")).ladder[0].timeout_seconds == (
        bounds.MAX_TIMEOUT_SECONDS
    )
    policy = load_policy(_with("safety.breaker.windowSeconds", str(bounds.MAX_WINDOW_SECONDS)))
    assert policy.safety.breaker.window_seconds == bounds.MAX_WINDOW_SECONDS
    assert load_policy(text).safety.budget.max_nodes == bounds.MAX_NODES


def test_every_number_of_the_model_has_a_finite_maximum() -> None:
    """No numeric field is left unbounded above: a new one must say its maximum."""
    schema = Policy.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})
    unbounded: list[str] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                walk(defs[node["$ref"].rsplit("/", 1)[1]], where)
                return
            types = {node.get("type")} | {v.get("type") for v in node.get("anyOf", [])}
            if types & {"number", "integer"}:
                top = node.get("maximum", node.get("exclusiveMaximum"))
                for v in node.get("anyOf", []):
                    top = v.get("maximum", v.get("exclusiveMaximum", top))
                if top is None or not math.isfinite(top):
                    unbounded.append(where)
            for key, value in node.get("properties", {}).items():
                walk(value, f"{where}.{key}")
            for key in ("items", "additionalProperties"):
                if isinstance(node.get(key), dict):
                    walk(node[key], f"{where}[]")
            for v in node.get("anyOf", []):
                walk(v, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    walk(schema, "(policy)")
    assert not unbounded, unbounded
