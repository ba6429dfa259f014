"""How the test run shares the machine's cores: pytest-xdist workers, whole modules (or named
groups of modules) as the unit of work, the longest first (decision 0150).

- A module is never split between workers: its module fixtures (a cluster of its own, a
  controller, a booted machine) are set up once.
- The modules listed in :data:`GROUPS` run together, one after another on one worker: every
  e2e module (``demo``: they share one demo fleet, a session fixture that a second worker would
  start again) and the modules that use the host's one set of machine resources, the fabric
  tap, the host node's cgroups and addresses, loop mounts (``host-ground``).
- Units are handed out longest first (the longest-processing-time rule), from
  :data:`EXPECTED_S`, so the emulated machine's group, which keeps one core busy for most of the
  run, starts at once and the many short modules fill the other worker around it.
- A worker gets its next unit only when it is idle (xdist's own scheduler queues up to two
  ahead, which near the end leaves a short module waiting behind a long one).

Groups are by path, here, and not by xdist's ``xdist_group`` mark: with pytest 9.2, xdist
3.8 adds the group to an item's node id by assigning ``item._nodeid``, which pytest no longer
reads, so ``--dist loadgroup`` silently ran a group's modules on different workers at once.

``EXPECTED_S`` holds measured seconds (``GPUFLEET_TEST_TIMES`` of a whole run, see
:mod:`suite_timing` and docs/testing.md); a unit not in it counts as :data:`DEFAULT_S` of its
directory. Only the order depends on it: a wrong figure costs time, never a test.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from xdist.scheduler.loadscope import LoadScopeScheduling

GROUPS: dict[str, str] = {
    "tests/e2e/": "demo",
    "tests/integration/test_chart_on_machines.py": "host-ground",
    "tests/integration/test_host_node.py": "host-ground",
    "tests/integration/test_image_seed.py": "host-ground",
    "tests/integration/test_local_images.py": "host-ground",
    "tests/integration/test_node_image.py": "host-ground",
}
"""Path prefix -> the group its modules run in (one worker, one after another)."""

EXPECTED_S: dict[str, float] = {
    "host-ground": 1980.0,
    "demo": 650.0,
    "tests/integration/test_safety_gate.py": 210.0,
    "tests/integration/test_slurm_health.py": 140.0,
    "tests/integration/test_scale_burst.py": 110.0,
    "tests/integration/test_reliability_bmc.py": 90.0,
    "tests/integration/test_boot_watchdog.py": 80.0,
    "tests/integration/test_controller_lifecycle.py": 70.0,
    "tests/integration/test_reliability_drain.py": 65.0,
    "tests/dst/test_runs.py": 120.0,
    "tests/dst/test_roll.py": 40.0,
}
"""Measured seconds per unit of work (a group or a module path): the whole suite from a fresh
clone, 2026-11-29, two workers on two busy cores (docs/testing.md)."""

DEFAULT_S = {"tests/unit": 5.0, "tests/dst": 5.0, "tests/integration": 45.0, "tests/e2e": 60.0}
"""A unit not in :data:`EXPECTED_S`, by its directory."""


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its group, or else its module."""
    path = nodeid.split("::", 1)[0]
    for prefix, group in GROUPS.items():
        if path.startswith(prefix):
            return group
    return path


def expected_s(unit: str) -> float:
    if unit in EXPECTED_S:
        return EXPECTED_S[unit]
    for prefix, seconds in DEFAULT_S.items():
        if unit.startswith(prefix):
            return seconds
    return 30.0


class LongestFirst(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`unit_of` as the scope, the longest units first,
    and no work queued on a busy worker."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        # A worker holds its last test until it knows the next one (or is shut down), so one
        # pending test means it is idle.
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: OrderedDict[str, dict[str, bool]] = OrderedDict()
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for scope in sorted(units, key=lambda s: -expected_s(s)):  # stable: ties keep order
            self.workqueue[scope] = units[scope]
        for _ in range(max(0, len(self.nodes) - len(self.workqueue))):
            unused, _assigned = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()
