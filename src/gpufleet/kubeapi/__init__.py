"""The one Kubernetes adapter: typed errors, the async port and its kr8s client.

Every product reaches the apiserver through :class:`KubePort` (``KubeApi`` in
production, a typed fake in unit tests); only this package imports kr8s.
"""

from gpufleet.kubeapi.client import SERVICE_IN_FLIGHT, KubeApi
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
