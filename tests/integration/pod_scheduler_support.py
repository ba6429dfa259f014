"""Pods for a pod scheduler (docs/pod-scheduler.md), as its tests and bench/pod_scheduling.py
write them: one container that never runs (KWOK nodes), asking for CPU, memory and GPUs."""

from __future__ import annotations

from typing import Any

from gpufleet.domain import well_known


def pod_spec(scheduler: str, *, gpus: str = "1", memory: str = "256Mi") -> dict[str, Any]:
    """The spec of a pod for ``scheduler``."""
    return {
        "schedulerName": scheduler,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "train",
                "image": "example.invalid/train:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": memory},
                    "limits": {"nvidia.com/gpu": gpus},
                },
            }
        ],
    }


def pod(
    name: str,
    namespace: str,
    scheduler: str,
    *,
    group: str | None = None,
    size: int | None = None,
    annotations: dict[str, str] | None = None,
    gpus: str = "1",
    memory: str = "256Mi",
) -> dict[str, Any]:
    """A pod for ``scheduler``; with ``group`` and ``size``, a member of an explicit group
    (``gpufleet.io/pod-group`` and its size annotation)."""
    labels = {well_known.LABEL_POD_GROUP: group} if group else {}
    notes = dict(annotations or {})
    if size is not None:
        notes[well_known.ANNOTATION_POD_GROUP_SIZE] = str(size)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": notes},
        "spec": pod_spec(scheduler, gpus=gpus, memory=memory),
    }
