"""Kubernetes resource quantities, and what a pod asks of its node: read once, here.

A quantity is what the apiserver writes in ``resources`` (``"500m"``, ``"2"``, ``"4Gi"``,
``"1G"``, ``"1e3"``); read exactly (a :class:`~fractions.Fraction`), so that a sum of
millicores or bytes never rounds. :func:`pod_requests` counts a pod the way kube-scheduler
does, for whoever must ask another scheduler (Slurm) for the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|([a-zA-Z]*))$"
)
_SUFFIXES: Mapping[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def quantity(value: object) -> Fraction | None:
    """A Kubernetes resource quantity (``"500m"``, ``"2"``, ``"4Gi"``, ``"1G"``,
    ``"1e3"``, or a number) as an exact fraction; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    m = _QUANTITY.match(value.strip())
    if m is None:
        return None
    number = Fraction(m.group(1))
    if m.group(2):
        return number * Fraction(10) ** int(m.group(2)[1:])
    scale = _SUFFIXES.get(m.group(3) or "")
    return None if scale is None else number * scale


def _requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    """A container's requests; a resource given only as a limit is requested at the limit
    (the apiserver's default)."""
    resources = container.get("resources") or {}
    out: dict[str, Fraction] = {}
    for source in (resources.get("limits") or {}, resources.get("requests") or {}):
        for name, raw in source.items():
            q = quantity(raw)
            if q is not None:
                out[str(name)] = q
    return out


def _add(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, Fraction(0)) + v


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """What a pod asks of its node, as kube-scheduler counts it: the containers' requests
    summed with the sidecars (init containers that keep running), at least each init
    container's (with the sidecars started before it), plus the pod's overhead."""
    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        _add(total, _requests(c))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or []:
        own = _requests(c)
        if c.get("restartPolicy") == "Always":
            _add(sidecars, own)
            continue
        for k, v in own.items():
            init_peak[k] = max(init_peak.get(k, Fraction(0)), v + sidecars.get(k, Fraction(0)))
    _add(total, sidecars)
    for k, v in init_peak.items():
        total[k] = max(total.get(k, Fraction(0)), v)
    overhead = {
        str(k): q for k, raw in (spec.get("overhead") or {}).items() if (q := quantity(raw))
    }
    _add(total, overhead)
    return total
