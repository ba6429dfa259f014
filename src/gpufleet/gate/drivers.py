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
    ca_file: str | None = None,
) -> BmcFactory:
    """Real BMCs, over Redfish; ``ca_file``: the CA bundle for BMCs whose Secret has no
    ``ca.crt`` (read at each open, so a rotated bundle counts at once)."""

    def open_bmc(creds: redfish.BmcCredentials, name: str) -> RedfishPower:
        return RedfishPower(
            creds,
            name=name,
            timeout_s=timeout_s,
            retry_delays=retry_delays,
            default_ca_file=ca_file,
        )

    return open_bmc
