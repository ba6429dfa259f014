"""Kubernetes label selectors as validated data: which Nodes a policy override covers.

The shape is Kubernetes' own (``matchLabels`` and ``matchExpressions`` with ``In``,
``NotIn``, ``Exists`` and ``DoesNotExist``), so an operator writes the selector they
already write for a Deployment. Matching is pure and says *why* (which requirement
held or failed), because ``gpufleet policy explain --node`` shows it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.alias_generators import to_camel

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label key (None: it is one)."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (prefix == "" and key.startswith("/")):
        return f"label key {key!r}: at most one '/' (prefix/name)"
    if prefix and not _PREFIX.match(prefix):
        return f"label key {key!r}: the prefix must be a DNS subdomain (e.g. gpufleet.io)"
    if not _NAME.match(name):
        return (
            f"label key {key!r}: the name must be 1-63 characters, letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit"
        )
    return None


def value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value (None: it is one)."""
    if not _VALUE.match(value):
        return (
            f"label value {value!r}: at most 63 characters, letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


class Operator(StrEnum):
    """A requirement's operator, as in Kubernetes."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class Requirement(_Model):
    """One label requirement: a key, an operator and (for In and NotIn) values."""

    key: str
    """The label key, e.g. gpufleet.io/pool or node.kubernetes.io/instance-type."""
    operator: Operator
    """In, NotIn (both need values), Exists or DoesNotExist (both take none)."""
    values: tuple[str, ...] = ()
    """The label values In or NotIn compares with."""

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        problem = key_problem(key)
        if problem:
            raise ValueError(problem)
        return key

    @model_validator(mode="after")
    def _values(self) -> Self:
        takes = self.operator in (Operator.IN, Operator.NOT_IN)
        if takes and not self.values:
            raise ValueError(f"{self.key}: operator {self.operator} needs at least one value")
        if not takes and self.values:
            raise ValueError(f"{self.key}: operator {self.operator} takes no values")
        for value in self.values:
            problem = value_problem(value)
            if problem:
                raise ValueError(problem)
        return self

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` meet this requirement."""
        have = labels.get(self.key)
        if self.operator is Operator.EXISTS:
            return have is not None
        if self.operator is Operator.DOES_NOT_EXIST:
            return have is None
        inside = have is not None and have in self.values
        return inside if self.operator is Operator.IN else not inside

    def check(self, labels: Mapping[str, str]) -> tuple[bool, str]:
        """Whether ``labels`` meet this requirement, and a sentence saying why."""
        have = labels.get(self.key)
        shown = "absent" if have is None else repr(have)
        if self.operator is Operator.EXISTS:
            return have is not None, f"{self.key} exists: {shown}"
        if self.operator is Operator.DOES_NOT_EXIST:
            return have is None, f"{self.key} does not exist: {shown}"
        listed = ", ".join(self.values)
        inside = have is not None and have in self.values
        if self.operator is Operator.IN:
            return inside, f"{self.key} in ({listed}): {shown}"
        return not inside, f"{self.key} not in ({listed}): {shown}"


class LabelSelector(_Model):
    """Which Nodes: every matchLabels pair and every matchExpressions requirement must hold."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    """Labels a Node must carry with exactly these values."""
    match_expressions: tuple[Requirement, ...] = ()
    """Requirements a Node's labels must meet (In, NotIn, Exists, DoesNotExist)."""

    @model_validator(mode="after")
    def _well_formed(self) -> Self:
        problems: list[str] = []
        for key, value in self.match_labels.items():
            problems.extend(p for p in (key_problem(key), value_problem(value)) if p)
        if not self.match_labels and not self.match_expressions:
            problems.append(
                "an empty nodeSelector would cover every node: set the field fleet-wide instead"
            )
        contradiction = self.contradiction()
        if contradiction:
            problems.append(f"no node can match: {contradiction}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    _requirements: tuple[Requirement, ...] = PrivateAttr(default=())

    def model_post_init(self, context: Any, /) -> None:
        pairs = tuple(
            Requirement.model_construct(key=k, operator=Operator.IN, values=(v,))
            for k, v in sorted(self.match_labels.items())
        )
        self._requirements = (*pairs, *self.match_expressions)

    def requirements(self) -> tuple[Requirement, ...]:
        """matchLabels as ``In`` requirements, then matchExpressions (Kubernetes' order);
        built once (a node pass matches every Node against them)."""
        return self._requirements

    def check(self, labels: Mapping[str, str]) -> tuple[bool, list[str]]:
        """Whether ``labels`` match, and one line per requirement (held or failed)."""
        lines: list[str] = []
        ok = True
        for requirement in self.requirements():
            held, why = requirement.check(labels)
            ok = ok and held
            lines.append(("held: " if held else "failed: ") + why)
        return ok, lines

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a Node with ``labels`` is selected."""
        return all(r.holds(labels) for r in self._requirements)

    def contradiction(self) -> str | None:
        """Why no set of labels can match (None: some can), for one key at a time."""
        by_key: dict[str, list[Requirement]] = {}
        for r in self.requirements():
            by_key.setdefault(r.key, []).append(r)
        for key, reqs in by_key.items():
            ops = {r.operator for r in reqs}
            if Operator.DOES_NOT_EXIST in ops and ops - {Operator.DOES_NOT_EXIST, Operator.NOT_IN}:
                return f"{key} must both exist and not exist"
            allowed: set[str] | None = None
            for r in reqs:
                if r.operator is Operator.IN:
                    allowed = set(r.values) if allowed is None else allowed & set(r.values)
            if allowed is not None:
                for r in reqs:
                    if r.operator is Operator.NOT_IN:
                        allowed -= set(r.values)
                if not allowed:
                    return f"no value of {key} meets every requirement on it"
        return None

    def implied_by(self, other: LabelSelector) -> bool:
        """Whether every Node ``other`` selects is selected by this one too (a sufficient
        test: each of this selector's requirements is one of ``other``'s)."""
        theirs = {_canonical(r) for r in other.requirements()}
        return all(_canonical(r) in theirs for r in self.requirements())


def _canonical(r: Requirement) -> tuple[str, Operator, tuple[str, ...]]:
    return (r.key, r.operator, tuple(sorted(set(r.values))))
