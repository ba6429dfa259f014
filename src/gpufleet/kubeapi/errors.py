"""gpufleet's Kubernetes API errors, one class per answer a caller acts on.

The client translates every kr8s/httpx failure into these at the port, so no
product catches a library's exception: a 409 means re-read and decide again,
a 404 that the object is gone, a 410 that a watch must list again, a 429 that
an eviction was refused by a PodDisruptionBudget.
"""

from __future__ import annotations


class ApiError(Exception):
    """A Kubernetes API request failed (``status`` is None when no answer came)."""

    def __init__(self, what: str, status: int | None, message: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {message}" if status else f"{what}: {message}")
        self.what = what
        self.status = status
        self.message = message


class Unreachable(ApiError):
    """No answer: connection refused, a timeout, a TLS failure (the request may not
    have reached the apiserver)."""


class KubeconfigError(ApiError):
    """No usable credentials: the kubeconfig is missing, unreadable or malformed, and
    this is not a Pod with a service account. Nothing was sent."""


class Unauthorized(ApiError):
    """401: the credentials were not accepted."""


class Forbidden(ApiError):
    """403: RBAC said no."""


class NotFound(ApiError):
    """404: no such object."""


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists."""


class Gone(ApiError):
    """410: the resourceVersion a watch started from is too old; list again."""


class Invalid(ApiError):
    """422: the object failed validation (schema, immutable field)."""


class TooManyRequests(ApiError):
    """429: for an eviction, a PodDisruptionBudget said no (retry later)."""


_BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_for(status: int | None) -> type[ApiError]:
    """The class of the error an HTTP status means."""
    return _BY_STATUS.get(status or 0, ApiError)
