"""The one Kubernetes adapter: typed errors, the async port and its kr8s client.

Every product reaches the apiserver through :class:`KubePort` (``KubeApi`` in
production, a typed fake in unit tests); only this package imports kr8s.

``KubeApi`` and ``SERVICE_IN_FLIGHT`` are imported from :mod:`~gpufleet.kubeapi.client`
on first use: the errors, resources and port are plain classes that a command's module
may name at the top, and its ``--help`` then imports neither kr8s nor httpx (docs/cli.md,
start-up).
"""

from typing import TYPE_CHECKING

from gpufleet.kubeapi.errors import (
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeconfigError,
    NotFound,
    TooManyRequests,
    Unauthorized,
    Unreachable,
)
from gpufleet.kubeapi.port import KubePort, ObjectList, WatchEvent, get_or_none
from gpufleet.kubeapi.resources import (
    EVENTS,
    LEASES,
    NODES,
    PODS,
    SECRETS,
    Json,
    Patch,
    Resource,
    custom,
)

if TYPE_CHECKING:
    from gpufleet.kubeapi.client import SERVICE_IN_FLIGHT, KubeApi


def __getattr__(name: str) -> object:
    if name in ("KubeApi", "SERVICE_IN_FLIGHT"):
        from gpufleet.kubeapi import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EVENTS",
    "LEASES",
    "NODES",
    "PODS",
    "SECRETS",
    "SERVICE_IN_FLIGHT",
    "ApiError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "Json",
    "KubeApi",
    "KubePort",
    "KubeconfigError",
    "NotFound",
    "ObjectList",
    "Patch",
    "Resource",
    "TooManyRequests",
    "Unauthorized",
    "Unreachable",
    "WatchEvent",
    "custom",
    "get_or_none",
]
