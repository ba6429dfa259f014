"""The demo's scenarios by name, in the order ``gpufleet demo --help`` lists them.

Apart from :mod:`gpufleet.demo.scenarios`, which imports the Kubernetes client, httpx and
the models, so that the help imports none of them (docs/cli.md, start-up); a unit test
keeps these the names of :data:`gpufleet.demo.scenarios.SCENARIOS`.
"""

from __future__ import annotations

NAMES = (
    "xid79",
    "ib-flap",
    "ecc-uncorrectable",
    "controller-crash-mid-remediation",
    "fault-storm",
    "sdc-found-by-active-check",
    "straggler",
    "replica-groups",
    "silent-corruption",
    "slurm-health-drain",
    "preemption-by-inference-pod",
    "shared-queue",
    "new-machine",
    "real-machine",
    "maintenance",
    "two-tenants",
)
