"""Slurm hostlist expressions (``gpu-node-[0000-0003,0007]``) to names and back."""

from __future__ import annotations

import re
from collections.abc import Iterable

_BRACKET = re.compile(r"^(?P<prefix>[^\[]*)\[(?P<ranges>[^\]]+)\](?P<rest>.*)$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    out, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def expand(expr: str | None) -> list[str]:
    """All host names of a hostlist expression, in order. Empty for None or ""."""
    if not expr:
        return []
    names: list[str] = []
    for part in _split_top(expr.strip()):
        m = _BRACKET.match(part)
        if not m:
            names.append(part)
            continue
        for rng in m["ranges"].split(","):
            lo, _, hi = rng.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.extend(expand(f"{m['prefix']}{i:0{width}d}{m['rest']}"))
    return names


def compress(names: Iterable[str]) -> str:
    """A compact hostlist for names that share a prefix and a numeric suffix."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in names:
        m = re.match(r"^(.*?)(\d+)$", name)
        if not m:
            plain.append(name)
            continue
        groups.setdefault((m[1], len(m[2])), []).append(int(m[2]))
    parts = list(plain)
    for (prefix, width), nums in sorted(groups.items()):
        nums = sorted(set(nums))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)
