"""Every version of one Node since a resourceVersion, replayed by the apiserver's watch.

A value that lives less than one poll (a verification passed at once, a departure notice
recorded and cleared within one syncer pass) is missed by reading the Node now and then;
the watch replays each change, so a test that took the resourceVersion before it acted
sees them all, however late it looks. Used by ``controller_harness`` and ``slurm_support``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


def node_versions(http: httpx.Client, name: str, since: str) -> Iterator[dict[str, Any]]:
    """Each version of Node ``name`` after resourceVersion ``since``, oldest first; ends
    one second after the newest (the watch's ``timeoutSeconds``). Fails if the apiserver
    no longer holds that history (compacted: take the resourceVersion later)."""
    params = {
        "watch": "1",
        "fieldSelector": f"metadata.name={name}",
        "resourceVersion": since,
        "timeoutSeconds": "1",
    }
    with http.stream("GET", "/api/v1/nodes", params=params) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            event = json.loads(line)
            assert event["type"] != "ERROR", event  # history compacted: read sooner
            yield event["object"]


def annotation_values(http: httpx.Client, name: str, key: str, since: str) -> list[str]:
    """The values annotation ``key`` of Node ``name`` took since ``since``, in order, each
    change once (absent is not a value)."""
    values: list[str] = []
    for node in node_versions(http, name, since):
        text = (node["metadata"].get("annotations") or {}).get(key)
        if text and (not values or text != values[-1]):
            values.append(text)
    return values
