"""Policy fields an earlier version had: accepted, converted where they map, and said.

A FleetPolicy (or policy file) written for an earlier version must keep working after an
upgrade: refusing it would leave the controller on its last valid policy, or paused, until
someone rewrote it. So every field that was removed or renamed is listed in
:data:`REMOVED` with the field that replaces it, the version it went in and, where the old
meaning maps onto the new field, a conversion. :func:`migrate` takes such fields out of a
spec before it is validated, sets the replacement from a converted value (unless the spec
sets the replacement itself: then the replacement wins) and returns one
:class:`Deprecation` per field, which the CLI prints as a warning and the controller puts
in an Event and a condition on the FleetPolicy. The CRD keeps accepting these fields
(marked deprecated in their description): see ``gpufleet.api.fleetpolicy``.
docs/decisions/0189, docs/upgrade.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_snake

Json = dict[str, Any]


@dataclass(frozen=True)
class RemovedField:
    """One field a policy may still carry from an earlier version."""

    path: tuple[str, ...]
    """Where it was, as written in YAML (camelCase): ``("lemon", "incidents")``."""
    removed_in: str
    """The version that no longer has it."""
    replacement: tuple[str, ...]
    """The field that took its place."""
    schema: Mapping[str, Any]
    """Its OpenAPI schema as it was (the CRD still accepts the old values, no others)."""
    convert: Callable[[Any], float] | None
    """Old value -> the replacement's value (ValueError: not a value the field took);
    None: the field has no counterpart and is ignored."""
    how: str
    """How the conversion goes, in words (the warning says it)."""
    decision: str
    """The decision record that removed it."""

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def replaced_by(self) -> str:
        return ".".join(self.replacement)


@dataclass(frozen=True)
class Deprecation:
    """A removed field found in a policy, and what became of it."""

    field: RemovedField
    value: Any
    converted: float | None
    """The replacement's value taken from it; None when nothing was converted."""
    why_not: str | None = None
    """Why it was not converted (the replacement is set, or the value is not one it took)."""

    def message(self) -> str:
        f = self.field
        head = f"{f.name} was removed in {f.removed_in} ({f.decision}); use {f.replaced_by}"
        was = f"{f.name}={self.value!r}"
        if self.converted is not None:
            return f"{head}: {was} read as {f.replaced_by}={self.converted:g} ({f.how})"
        return f"{head}: {was} ignored ({self.why_not or f.how})"


def _number(value: Any, *, minimum: float, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    if not math.isfinite(value) or value < minimum or (integer and value != int(value)):
        raise ValueError(f"not a value it took (at least {minimum:g})")
    return float(value)


def _incidents(value: Any) -> float:
    return _number(value, minimum=2, integer=True) - 0.5


def _window_days(value: Any) -> float:
    return 2 * _number(value, minimum=1e-9, integer=False)


REMOVED: tuple[RemovedField, ...] = (
    RemovedField(
        path=("lemon", "incidents"),
        removed_in="0.1.0",
        replacement=("lemon", "threshold"),
        schema={"type": "integer", "minimum": 2},
        convert=_incidents,
        how="the decayed score of that many hardware incidents close together, less half a"
        " point for decay: the old default 3 is the new default 2.5",
        decision="decision 0102",
    ),
    RemovedField(
        path=("lemon", "windowDays"),
        removed_in="0.1.0",
        replacement=("lemon", "halfLifeDays"),
        schema={"type": "number", "exclusiveMinimum": True, "minimum": 0},
        convert=_window_days,
        how="a score halves in twice the old window: the old default 7 days is the new default 14",
        decision="decision 0102",
    ),
)
"""Every removed or renamed policy field, oldest first."""


def _key_in(parent: Mapping[str, Any], camel: str) -> str | None:
    """The key ``parent`` uses for a field: camelCase as in YAML, or the Python name."""
    for key in (camel, to_snake(camel)):
        if key in parent:
            return key
    return None


def _parent(data: Json, path: tuple[str, ...]) -> Json | None:
    node: Any = data
    for part in path:
        key = _key_in(node, part) if isinstance(node, dict) else None
        if key is None:
            return None
        node = node[key]
    return node if isinstance(node, dict) else None


def _parent_made(data: Json, path: tuple[str, ...]) -> Json:
    """The mapping at ``path``, made where absent (a removed field's replacement may sit
    where the policy has nothing yet)."""
    node = data
    for part in path:
        key = _key_in(node, part) or part
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    return node


def migrate(spec: Mapping[str, Any]) -> tuple[Json, list[Deprecation]]:
    """``spec`` without the fields of :data:`REMOVED` (a copy where one was found), each
    converted into its replacement where it maps and the replacement is not set."""
    data: Json = _copy(dict(spec))
    found: list[Deprecation] = []
    for field in REMOVED:
        parent = _parent(data, field.path[:-1])
        key = _key_in(parent, field.path[-1]) if parent is not None else None
        if parent is None or key is None:
            continue
        value = parent.pop(key)
        target = _parent(data, field.replacement[:-1])
        if field.convert is None:
            found.append(Deprecation(field, value, None))
            continue
        if target is not None and _key_in(target, field.replacement[-1]) is not None:
            found.append(Deprecation(field, value, None, f"{field.replaced_by} is set"))
            continue
        try:
            converted = field.convert(value)
        except ValueError as exc:
            found.append(Deprecation(field, value, None, str(exc)))
            continue
        _parent_made(data, field.replacement[:-1])[field.replacement[-1]] = converted
        found.append(Deprecation(field, value, converted))
    return data, found


def _copy(value: Any) -> Any:
    """A copy of the mappings and lists (scalars shared): popping must not change the input."""
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
