"""The drivers that can act on a BMC, opened by the gate only.

A :data:`BmcFactory` opens a driver (``remediate.steps.Bmc``) for a node's BMC
credentials. The real one speaks Redfish (:class:`~gpufleet.remediate.power.RedfishPower`);
the deterministic simulation passes its model. Whoever builds a
:class:`~gpufleet.gate.Gate` gives it a factory; nothing else is given one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from gpufleet.remediate import redfish
from gpufleet.remediate.power import RedfishPower
from gpufleet.remediate.steps import Bmc

BmcFactory = Callable[[redfish.BmcCredentials, str], AbstractAsyncContextManager[Bmc]]
"""Opens a driver for ``(credentials, name in words)``; closed by leaving the context."""


def redfish_bmcs(
    *,
    timeout_s: float = redfish.REQUEST_TIMEOUT_S,
    retry_delays: tuple[float, ...] = redfish.RETRY_DELAYS,
) -> BmcFactory:
    """Real BMCs, over Redfish."""

    def open_bmc(creds: redfish.BmcCredentials, name: str) -> RedfishPower:
        return RedfishPower(creds, name=name, timeout_s=timeout_s, retry_delays=retry_delays)

    return open_bmc
