"""The controller's Lease: :mod:`gpufleet.kubeapi.leadership`, logged as the controller's.

The Lease holder moved beside the port it writes through so that the pod scheduler
(``gpufleet.slurm``, which may not import ``lifecycle``) uses the same one; the
controller keeps its names here and its lines under the ``gpufleet.controller`` logger.
"""

from __future__ import annotations

from typing import Any

from gpufleet.kubeapi import leadership as _shared
from gpufleet.kubeapi.leadership import DURATION_S, RENEW_S, RETRY_S, default_identity
from gpufleet.lifecycle.core import log


class Leadership(_shared.Leadership):
    """:class:`gpufleet.kubeapi.leadership.Leadership`, logging to the controller's log."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("logger", log)
        super().__init__(*args, **kwargs)


__all__ = ["DURATION_S", "RENEW_S", "RETRY_S", "Leadership", "default_identity"]
