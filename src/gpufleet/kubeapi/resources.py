"""Which objects a request is about: a resource is an API version and a plural.

The port takes a :class:`Resource` instead of a URL so that callers name the
kind of object, never a path; the client builds the path.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import well_known

Json = dict[str, Any]


class Patch(enum.Enum):
    """Patch content types (the apiserver's names)."""

    MERGE = "application/merge-patch+json"
    """RFC 7386: maps merge, lists are replaced; ``metadata.resourceVersion`` guards it."""
    STRATEGIC = "application/strategic-merge-patch+json"
    """Built-in kinds only: lists with a merge key (Node conditions by ``type``) merge."""


@dataclass(frozen=True)
class Resource:
    """A kind of object: ``version`` is ``v1`` for the core group, else ``group/version``."""

    plural: str
    version: str = "v1"

    def __str__(self) -> str:
        return self.plural if self.version == "v1" else f"{self.plural}.{self.version}"


NODES = Resource("nodes")
PODS = Resource("pods")
SECRETS = Resource("secrets")
EVENTS = Resource("events")
NAMESPACES = Resource("namespaces")
CONFIGMAPS = Resource("configmaps")
CRDS = Resource("customresourcedefinitions", "apiextensions.k8s.io/v1")
PRIORITY_CLASSES = Resource("priorityclasses", "scheduling.k8s.io/v1")
LEASES = Resource("leases", "coordination.k8s.io/v1")
RESOURCE_SLICES = Resource("resourceslices", "resource.k8s.io/v1")
RESOURCE_CLAIMS = Resource("resourceclaims", "resource.k8s.io/v1")
DEVICE_CLASSES = Resource("deviceclasses", "resource.k8s.io/v1")
DEVICE_TAINT_RULES = Resource("devicetaintrules", "resource.k8s.io/v1beta2")
"""Served as v1beta2 on Kubernetes 1.36 behind the DRADeviceTaintRules gate (decision 0237)."""


def custom(plural: str) -> Resource:
    """One of gpufleet's own custom resources (group ``gpufleet.io``)."""
    return Resource(plural, f"{well_known.GROUP}/{well_known.VERSION}")
