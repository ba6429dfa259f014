"""The largest value each kind of policy number may take (docs/policy.md, "Bounds").

A policy is written by people and read by the controller, the agent and the
simulator; a number that is infinite, not a number, or absurdly large is a typo
or an attack, never an intention. ``.inf`` for a step's timeout would keep a node
out for ever without a word; ``maxNodes: 1e30`` turns the budget off while reading
as if it were on. Every numeric field of the policy is finite (pydantic's
``allow_inf_nan=False``) and at most one of these, in the model and therefore in
the FleetPolicy CRD's schema (``maximum``), so the apiserver refuses what
``gpufleet policy validate`` refuses, with the field's path.
"""

from __future__ import annotations

DAY = 86400.0

MAX_NODES = 100_000
"""Node counts (budget, breaker, spares): eight times the largest fleet measured here
(12,500 nodes, docs/controller.md); a larger number means "no limit", which the
rails never mean."""

MAX_GPUS_PER_NODE = 64
"""GPUs of one node (the local cluster's --gpus-per-node bound; the largest servers hold 16)."""

MAX_TIMEOUT_SECONDS = 7 * DAY
"""How long one thing may take or be waited for: a ladder step, a drain, a check
profile, a boot stage, Slurm's silence, the raise and clear debounce, the
stragglers' report interval. A week: a reimage or a burn-in takes hours; a node
left longer than a week by automation has been forgotten."""

MAX_WINDOW_SECONDS = 30 * DAY
"""How far back automation counts: repeat windows, the breaker's window and
cooldown, the rate limit's window. Every occurrence in a repeat window is kept
on the node's record, so the window bounds the record too; trouble older than
a month is the lemon score's (its half-life) to weigh."""

MAX_HALF_LIFE_DAYS = 365.0
"""The lemon score's half-life: a year (a score that never decays is a count)."""

MAX_SCORE = 1000.0
"""Lemon thresholds and class weights: a threshold above this is never reached."""

MAX_REPEAT_COUNT = 1000
"""Occurrences counted by a repeat rule (each one kept on the record within its window)."""

MAX_ATTEMPTS = 100
"""Attempts of one ladder rung."""

MAX_ACTIONS = 100_000
"""Disruptive actions the rate limit lets through in its window."""

MAX_SLOWER_THAN = 100.0
"""A straggler's slowdown factor (how many times its peers' median)."""

MAX_WINDOW_STEPS = 100_000
"""Job steps the straggler comparison looks at."""
