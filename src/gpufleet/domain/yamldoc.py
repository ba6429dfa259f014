"""Validate YAML documents against pydantic models and say where each problem is.

Shared by every file gpufleet reads (policies, simulator models), so that all
of them report problems the same way: ``line N: path.to[2].field: message``,
every problem at once. Pure: it parses text the caller has read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem in a document: where (path and line) and what."""

    location: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.location}: {self.message}"


class DocumentError(ValueError):
    """The text is not a YAML mapping; ``issues`` has one entry saying why."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__("; ".join(str(i) for i in issues))
        self.issues = issues


def parse_mapping(text: str, what: str) -> tuple[yaml.Node | None, dict[str, Any]]:
    """Parse YAML text that must hold a mapping; returns (node tree, data).

    An empty document is an empty mapping. Raises :class:`DocumentError`.
    """
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise DocumentError([Issue("(file)", line, f"not valid YAML: {exc}")]) from exc
    if data is None:
        return node, {}
    if not isinstance(data, Mapping):
        raise DocumentError([Issue("(file)", 1, f"{what} must be a YAML mapping")])
    return node, dict(data)


def issues_of(exc: ValidationError, node: yaml.Node | None, *, root: str) -> list[Issue]:
    """Every error of a validation, located in the document (``root`` names the top)."""
    return [
        Issue(path(err["loc"], root=root), line(node, err["loc"]), _message(err))
        for err in exc.errors()
    ]


def _message(err: Mapping[str, Any]) -> str:
    return str(err["msg"]).removeprefix("Value error, ")


def path(loc: tuple[Any, ...], *, root: str) -> str:
    """``('rules', 3, 'match', 'xid')`` -> ``rules[3].match.xid``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "tagged-union")):
            out += ("." if out else "") + str(part)
    return out or root


def child(node: yaml.Node | None, key: str | int) -> yaml.Node | None:
    """The value node under a mapping key or a sequence index."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                found: yaml.Node = v
                return found
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
        item: yaml.Node = node.value[key]
        return item
    return None


def line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The line of the deepest node of ``loc`` that exists in the document."""
    best = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        node = child(node, part)
        if node is None:
            break
        best = node.start_mark.line + 1
    return best
