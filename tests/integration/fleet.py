"""The shared cluster as a module that drives the lifecycle controller finds it and leaves it:
the ``fleet`` fixture's value and teardown (tests/integration/conftest.py, docs/testing.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller_harness import (
    SYSTEM_NS,
    WELL_BEHAVED_BMC,
    Api,
    bmc_control,
    reset_node,
)

from gpufleet.domain import well_known


@dataclass(frozen=True)
class Fleet:
    """The shared cluster, prepared for a module that drives the controller on its nodes."""

    info: Any
    api: Api
    logs: Path
    """Where the module's controllers write their logs (a failure names the file)."""


def restore_fleet(api: Api, info: Any) -> None:
    """Every node of the shared cluster as the next module expects to find it: no gpufleet
    mark, cordon, taint or condition, a BMC that does what it is asked, its own BMC Secret
    (the ``fleet`` fixture's teardown, tests/integration/conftest.py)."""
    for node in info.node_names:
        bmc_control(info, node, **WELL_BEHAVED_BMC)
        reset_node(api, node)
        api.patch(
            f"/api/v1/nodes/{node}",
            {
                "metadata": {
                    "annotations": {well_known.ANNOTATION_BMC_SECRET: f"{SYSTEM_NS}/bmc-{node}"}
                }
            },
        )
