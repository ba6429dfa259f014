"""Named variants of the default model and policy, for comparisons.

A variant is the default model with some fields changed (dotted snake_case
paths, re-validated like a file) and a policy text. They exist so the
comparison in docs/sim-comparison.md can be rerun (``bench/sim_compare.py``)
and so a reader can see exactly what each row switches off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.domain.bounds import MAX_SCORE
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.policy import Policy, load_policy
from gpufleet.sim.model import Model, default_model


def with_overrides(model: Model, overrides: Mapping[str, Any]) -> Model:
    """The model with dotted fields replaced, e.g. ``{"job.restart_seconds": 120}``.

    A failure category is addressed by its name:
    ``{"failures.categories.sdc.symptom_mean_seconds": 3600}``. The result is
    validated again, so a bad value raises pydantic's error naming the field.
    """
    data = model.model_dump()
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = node.get(key)
            if isinstance(child, (list, tuple)):
                child = {c.get("name"): c for c in child if isinstance(c, dict)}
            if not isinstance(child, dict):
                raise KeyError(f"{dotted}: no such model field")
            node = child
        if leaf not in node:
            raise KeyError(f"{dotted}: no such model field")
        node[leaf] = value
    return Model.model_validate(data)


_LEMON_THRESHOLDS = "lemon:\n  threshold: 2.5\n  gpuThreshold: 2.0\n"


def lemon_policy_yaml(threshold: float, gpu_threshold: float, half_life_days: float) -> str:
    """The default policy with other lemon thresholds and half-life."""
    text = DEFAULT_POLICY_YAML.replace(
        _LEMON_THRESHOLDS,
        f"lemon:\n  threshold: {threshold:g}\n  gpuThreshold: {gpu_threshold:g}\n",
    ).replace("  halfLifeDays: 14\n", f"  halfLifeDays: {half_life_days:g}\n")
    if text.count(f"  halfLifeDays: {half_life_days:g}\n") != 1 or (
        _LEMON_THRESHOLDS not in DEFAULT_POLICY_YAML
    ):
        raise AssertionError("the default policy's lemon block changed: update sim.scenarios")
    return text


NO_LEMON_POLICY_YAML = lemon_policy_yaml(MAX_SCORE, MAX_SCORE, 14)
"""The default policy with lemon detection switched off (thresholds at the bound, which
no score reaches: domain.bounds.MAX_SCORE)."""

_SPARES = "spares:\n  percent: 1 "
if _SPARES not in DEFAULT_POLICY_YAML:
    raise AssertionError("the default policy's spares block changed: update sim.scenarios")
NO_LEMON_NO_SPARES_POLICY_YAML = NO_LEMON_POLICY_YAML.replace(_SPARES, "spares:\n  percent: 0 ")
"""No lemon detection and no hot spares (the baselines without spares)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """A model variant and a policy, with a one-line description."""

    name: str
    description: str
    overrides: Mapping[str, Any]
    policy_yaml: str = DEFAULT_POLICY_YAML

    def model(self, base: Model | None = None) -> Model:
        """The scenario's model."""
        return with_overrides(base or default_model(), self.overrides)

    def policy(self) -> Policy:
        """The scenario's policy."""
        return load_policy(self.policy_yaml, f"<{self.name} policy>")


_NO_AUTOMATION = {
    "detection.passive": False,
    "detection.performance_monitoring": False,
    "detection.active_checks.enabled": False,
    "fleet.spare_percent": 0.0,
}

REACTIVE = Scenario(
    "reactive",
    "no monitors: a job failure sends a person to find and repair the node; no spares",
    _NO_AUTOMATION,
    NO_LEMON_NO_SPARES_POLICY_YAML,
)
PASSIVE = Scenario(
    "passive+auto",
    "passive monitors (30 s) and the default remediation ladder; no active checks, "
    "no performance monitoring, no lemon detection, no spares",
    {
        "detection.performance_monitoring": False,
        "detection.active_checks.enabled": False,
        "fleet.spare_percent": 0.0,
    },
    NO_LEMON_NO_SPARES_POLICY_YAML,
)
FULL = Scenario(
    "full",
    "passive + active checks + performance monitoring + lemon detection + 1% spares "
    "(the default model and policy)",
    {},
)
FAST = Scenario(
    "full+fast-recovery",
    "full, with 1 s in-memory checkpoints, 10 s detection and a 2-minute restart",
    {
        "job.checkpoint.blocking_seconds": 1.0,
        "job.restart_seconds": 105.0,
        "job.requeue_seconds": 15.0,
        "detection.passive_seconds": 10.0,
    },
)


@dataclass(frozen=True, slots=True)
class Measured:
    """A number the replica-group scenario takes from a measurement, and where it came from."""

    value: float
    source: str


PLACEHOLDER = "placeholder, not yet measured"
"""The source of a value nobody has measured yet (docs/sim-comparison.md)."""

_DEMO = "gpufleet demo --scenario replica-groups (docs/recovery.md)"

REPLICA_GROUP_FIGURES: dict[str, Measured] = {
    "job.replica_groups.nodes_per_group": Measured(
        8.0, "assumed: 64 GPUs per replica group (the model's shards inside a group)"
    ),
    "job.replica_groups.step_seconds": Measured(
        5.0,
        "assumed: a step of a large training, the most the other groups lose; measured: 0 "
        "steps lost and a longest stall of 1.24-1.36 s (0.2-s steps, 1-s heartbeat timeout; "
        f"{_DEMO} and tests/integration/test_torchft_replicas.py)",
    ),
    "job.replica_groups.depart_seconds": Measured(
        2.7, f"measured: the drain's notice to the group's job completed, 2.7 s ({_DEMO})"
    ),
    "job.replica_groups.rejoin_seconds": Measured(
        17.4,
        "measured: requeue to the replacement group training in the quorum, 16.1-17.4 s "
        f"(Slurm 6 s, start and weight copy from a peer 11 s; {_DEMO}); a large model's "
        "weight copy takes longer",
    ),
    "job.checkpoint.blocking_seconds": Measured(
        1.0,
        "assumed: the asynchronous save's blocking copy for a large model; measured: a "
        f"median of 0.24-0.45 ms for the example's small model, the write in a thread ({_DEMO})",
    ),
    "failures.categories.sdc.symptom_mean_seconds": Measured(
        35.0,
        f"{PLACEHOLDER}: a fingerprint every 5 steps (25 s) and the agent's telemetry pass "
        "(10 s) until the vote names the node",
    ),
}
"""Every number of ``full+replica-groups`` that is not the default model's, with its source."""

REPLICA_GROUPS = Scenario(
    "full+replica-groups",
    "full, with the job as torchft replica groups: a node fault costs the other groups at "
    "most one step, the group is replaced from a spare while the others train, SDC is "
    "found by the fingerprint vote (no rollback), asynchronous checkpoints",
    {
        "job.replica_groups.enabled": True,
        **{
            k: int(m.value) if k.endswith("per_group") else m.value
            for k, m in REPLICA_GROUP_FIGURES.items()
        },
    },
)

SCENARIOS: tuple[Scenario, ...] = (REACTIVE, PASSIVE, FULL, FAST, REPLICA_GROUPS)
