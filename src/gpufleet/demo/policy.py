"""The demo's FleetPolicy: the default policy with timeouts cut to demo length.

Only times change, never a decision: XID 79 still means "reboot, NoExecute
taint, evict, requeue now", so what the demo shows is what the default policy
does on a real fleet, only faster. (The straggler window is a number of
steps, cut with the job's length: the demo's job runs 40 steps.)
"""

from __future__ import annotations

from typing import Any

POLICY_NAME = "demo"

DEMO_TIMES = {
    "ladder.*.timeoutSeconds": 60,
    "checks.verificationTimeoutSeconds": 60,
    "drain.timeoutSeconds": 20,
    "detection.clearAfterSeconds": 3,
    "detection.stragglers.reportEverySeconds": 2,
}
"""What the demo shortens (the default policy's values are minutes)."""
DEMO_STRAGGLER_WINDOW_STEPS = 4
"""Steps a straggler comparison looks at: the demo's job has 40 (a real one, thousands)."""


def demo_policy_spec(**rule_actions: str) -> dict[str, Any]:
    """The default policy as a FleetPolicy spec with :data:`DEMO_TIMES` applied.

    ``rule_actions`` changes the action of XID rules, e.g. ``xid79="power-cycle"``.
    """
    # Here: `gpufleet demo --help` reads DEMO_TIMES and builds no policy model.
    from gpufleet.domain.policy import default_policy

    spec: dict[str, Any] = default_policy().model_dump(by_alias=True, mode="json")
    for entry in spec["ladder"]:
        entry["timeoutSeconds"] = DEMO_TIMES["ladder.*.timeoutSeconds"]
    spec["checks"]["verificationTimeoutSeconds"] = DEMO_TIMES["checks.verificationTimeoutSeconds"]
    spec["drain"]["timeoutSeconds"] = DEMO_TIMES["drain.timeoutSeconds"]
    spec["detection"]["clearAfterSeconds"] = DEMO_TIMES["detection.clearAfterSeconds"]
    stragglers = spec["detection"]["stragglers"]
    stragglers["reportEverySeconds"] = DEMO_TIMES["detection.stragglers.reportEverySeconds"]
    stragglers["windowSteps"] = DEMO_STRAGGLER_WINDOW_STEPS
    for key, action in rule_actions.items():
        number = int(key.removeprefix("xid"))
        for rule in spec["rules"]:
            if rule["match"].get("xid") == number:
                rule["action"] = action
    return spec


def policy_yaml(spec: dict[str, Any]) -> str:
    """The spec as a policy file (``gpufleet policy validate``, ``gpufleet agent --policy``)."""
    import yaml

    return yaml.safe_dump(spec, sort_keys=False)


def fleet_policy(spec: dict[str, Any], name: str = POLICY_NAME) -> dict[str, Any]:
    """The FleetPolicy object the controller obeys."""
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "FleetPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }
