"""Which policy a node follows: the fleet's, or the first override its labels match.

One function, :func:`policy_for`, answers it for the lifecycle controller, the
simulator, the deterministic simulation and ``gpufleet policy explain --node``, so
they cannot disagree about a node's ladder, rules or group budget
(docs/decisions/0224). First match wins: overrides are read in order and the first
whose nodeSelector matches the node's labels applies, alone (no layering of two
overrides: what a node follows is always one override plus the fleet's fields).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.domain import topology
from gpufleet.domain.policy import DomainBudget, Policy


@dataclass(frozen=True, slots=True)
class Resolution:
    """The policy a node follows, which override gave it, and why."""

    policy: Policy
    """The resolved policy (:meth:`Policy.for_override`, or the fleet's policy itself)."""
    override: str | None = None
    """The override's name; None: no override matched, the fleet-wide fields apply."""
    index: int | None = None
    """The override's place in ``spec.overrides``."""
    why: list[str] = field(default_factory=list)
    """One line per override looked at (in order) and per requirement checked."""

    @property
    def group(self) -> str:
        """The node group ("" for none): the key the group's budget is counted under."""
        return self.override or ""


def policy_for(policy: Policy, labels: Mapping[str, str]) -> Resolution:
    """The policy a node with ``labels`` follows under ``policy`` (pure)."""
    why: list[str] = []
    for i, override in enumerate(policy.overrides):
        matched, lines = override.node_selector.check(labels)
        verdict = "matches" if matched else "does not match"
        why.append(f"overrides[{i}] ({override.name}) {verdict}")
        why.extend(f"  {line}" for line in lines)
        if matched:
            why.append(f"overrides[{i}] ({override.name}) applies: the first override that matches")
            return Resolution(resolved(policy, i), override.name, i, why)
    why.append(
        "no override matches: the fleet-wide policy applies"
        if policy.overrides
        else "the policy has no overrides: the fleet-wide policy applies"
    )
    return Resolution(policy, None, None, why)


_RESOLVED: dict[int, tuple[Policy, dict[int, Policy]]] = {}
"""id(policy) -> (that very policy, its resolved overrides). The entry holds the policy, so
its id is not reused while the entry lives; a copy (the controller's forced dry-run) is
another object with entries of its own."""
_KEEP = 8


def resolved(policy: Policy, index: int) -> Policy:
    """``policy.for_override(index)``, built once per policy object and override: a node
    pass resolves a Node on every event, and a policy is frozen, so a result never goes
    stale. Pure as far as callers can tell (the cache only saves work)."""
    entry = _RESOLVED.get(id(policy))
    if entry is None or entry[0] is not policy:
        while len(_RESOLVED) >= _KEEP:
            del _RESOLVED[next(iter(_RESOLVED))]
        entry = _RESOLVED[id(policy)] = (policy, {})
    found = entry[1].get(index)
    if found is None:
        found = entry[1][index] = policy.for_override(index)
    return found


def for_group(policy: Policy, group: str) -> Policy:
    """The policy of the node group ``group`` (a record's ``group``); the fleet's for ""
    or a group the policy no longer has."""
    for i, override in enumerate(policy.overrides):
        if override.name == group:
            return resolved(policy, i)
    return policy


def group_of(policy: Policy, labels: Mapping[str, str]) -> str:
    """The node group of a node with ``labels`` ("" for none), without resolving its policy."""
    for override in policy.overrides:
        if override.node_selector.matches(labels):
            return override.name
    return ""


def domain_of(policy: Policy, name: str, labels: Mapping[str, str]) -> str:
    """The NVLink domain a per-domain budget or the domain-scale judgement of fabric faults
    counts node ``name`` under ("" when the policy sets neither, or the labels place the
    node in no domain): the one reading the controller, the simulator and the
    deterministic simulation share (domain.topology's codec, docs/decisions/0232, 0240).
    The label is the per-domain budget's, else its default (Topograph's key)."""
    per_domain = policy.safety.budget.per_domain
    if per_domain is None and not policy.domain_faults.enabled:
        return ""
    label = (per_domain or DomainBudget()).label
    return topology.nvlink_domain_of(name, labels, label)


def domain_k(policy: Policy, group: str) -> int | None:
    """How many nodes of one NVLink domain the nodes of ``group`` ("" none) may have out at
    once: the group's own k where its override sets one, else the fleet's (None: no
    per-domain budget). A domain whose trays follow two groups is held, for each node, by
    that node's group's k (docs/decisions/0243)."""
    budget = for_group(policy, group).domain_budget
    return None if budget is None else budget.max_nodes


def domain_limits(policy: Policy, members: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Each NVLink domain's k from ``(domain, group)`` pairs of its nodes: the smallest k
    of the groups of its nodes (the strictest one any of them is held to); empty when no
    override sets a k of its own (then every domain has the fleet's)."""
    if not any(o.budget is not None and o.budget.per_domain for o in policy.overrides):
        return {}
    out: dict[str, int] = {}
    for domain, group in members:
        k = domain_k(policy, group)
        if domain and k is not None:
            out[domain] = min(out.get(domain, k), k)
    return out
