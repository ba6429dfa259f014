"""Validate YAML documents against pydantic models and say where each problem is.

Shared by every file gpufleet reads (policies, simulator models), so that all
of them report problems the same way: ``line N: path.to[2].field: message``,
every problem at once. Pure: it parses text the caller has read.

Input is bounded (:class:`Limits`): a policy reaches the controller from anyone
who may edit a FleetPolicy, and ``gpufleet policy validate`` is pointed at
files of unknown origin. Without bounds a 10 MB file took minutes and a gigabyte
to parse, deep nesting ended in a RecursionError, and a few aliases can expand
into billions of nodes. The size is checked before any parsing; depth and
node count (aliases counted at their expanded size) while the YAML is composed,
so the parse stops at the first node over a limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class Limits:
    """How much YAML a document may hold; far above any real policy or model file."""

    max_bytes: int = 1024 * 1024
    """UTF-8 bytes of the whole text."""
    max_depth: int = 32
    """Nested mappings and sequences (a policy needs about 5)."""
    max_nodes: int = 100_000
    """Scalars, mappings and sequences, with every alias expanded."""


LIMITS = Limits()


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


def _file_error(line: int | None, message: str) -> DocumentError:
    return DocumentError([Issue("(file)", line, message)])


def _too_large(limits: Limits) -> DocumentError:
    mib = limits.max_bytes / (1024 * 1024)
    return _file_error(None, f"too large: more than {limits.max_bytes} bytes ({mib:g} MiB)")


def decode(data: bytes, limits: Limits = LIMITS) -> str:
    """UTF-8 text from a file's bytes, within ``limits.max_bytes``.

    Callers read at most ``max_bytes + 1`` bytes, so an oversized file is refused
    without reading it whole. Raises :class:`DocumentError`.
    """
    if len(data) > limits.max_bytes:
        raise _too_large(limits)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _file_error(
            line, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"
        ) from None


def _check_size(text: str, limits: Limits) -> None:
    # Characters never outnumber bytes: encode only when the count alone cannot decide.
    if len(text) > limits.max_bytes or (
        len(text) * 4 > limits.max_bytes
        and len(text.encode("utf-8", "surrogatepass")) > limits.max_bytes
    ):
        raise _too_large(limits)


class _OverLimit(Exception):
    def __init__(self, mark: Any, message: str) -> None:
        super().__init__(message)
        self.line = mark.line + 1 if mark is not None else None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting depth and nodes as it composes."""

    def __init__(self, text: str, limits: Limits) -> None:
        super().__init__(text)
        self._limits = limits
        self._depth = 0
        self._nodes = 0
        self._measured: dict[int, tuple[int, int]] = {}
        """id(node) -> (nodes, depth) of the node with its aliases expanded."""

    def _count(self, nodes: int, depth: int, mark: Any) -> None:
        self._nodes += nodes
        if depth > self._limits.max_depth:
            raise _OverLimit(mark, f"too deep: nested more than {self._limits.max_depth} levels")
        if self._nodes > self._limits.max_nodes:
            raise _OverLimit(
                mark,
                f"too large: more than {self._limits.max_nodes} values (aliases counted expanded)",
            )

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(str(event.anchor))
            if target is not None:  # an undefined alias is PyYAML's error
                measured = self._measured.get(id(target))
                if measured is None:
                    raise _OverLimit(
                        event.start_mark, "recursive alias: it refers to its own ancestor"
                    )
                self._count(measured[0], self._depth + measured[1], event.start_mark)
            return super().compose_node(parent, index)
        nested = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        self._depth += nested
        try:
            self._count(1, self._depth, event.start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= nested
        if node is not None:
            self._measured[id(node)] = self._measure(node)
        return node

    def _measure(self, node: yaml.Node) -> tuple[int, int]:
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            return 1, 0
        sizes = [self._measured.get(id(c), (1, 0)) for c in children]
        return 1 + sum(n for n, _ in sizes), 1 + max((d for _, d in sizes), default=0)


def parse_mapping(
    text: str, what: str, limits: Limits = LIMITS
) -> tuple[yaml.Node | None, dict[str, Any]]:
    """Parse YAML text that must hold a mapping; returns (node tree, data).

    An empty document is an empty mapping. The text is parsed once, within
    ``limits``. Raises :class:`DocumentError`.
    """
    _check_size(text, limits)
    loader = _BoundedLoader(text, limits)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _OverLimit as exc:
        raise _file_error(exc.line, str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise _file_error(line, f"not valid YAML: {exc}") from exc
    finally:
        loader.dispose()
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
