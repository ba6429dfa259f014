"""The requests that act on a machine through its BMC: Reset and the one-time boot.

Only :mod:`gpufleet.gate` may import this module (an import-linter contract):
every act that can disrupt a node asks the gate, which demands a fresh proof
that the node is empty, the rails' consent and a compare-and-swap mark before it
hands a step one of these drivers (docs/decisions/0139). Everything else reads
BMCs with :class:`gpufleet.remediate.redfish.RedfishClient`, which has no way to
change one.
"""

from __future__ import annotations

from gpufleet.remediate.redfish import BmcRejected, RedfishClient


class RedfishPower(RedfishClient):
    """A BMC that can be acted on: a Reset, a one-time boot and its removal."""

    async def reset(self, reset_type: str) -> None:
        """POST ComputerSystem.Reset once; refuses types the BMC does not list.

        Raises :class:`~gpufleet.remediate.redfish.BmcOutcomeUnknown` when the answer
        is lost or a 5xx: the caller must read the BMC (:meth:`evidence`) before
        doing anything else.
        """
        info = await self.system()
        if not self.allows(reset_type):
            raise BmcRejected(
                self.name,
                f"ResetType {reset_type} is not allowed (allowed: {', '.join(info.reset_types)})",
            )
        await self._request("POST", info.reset_target, {"ResetType": reset_type})

    async def set_one_time_boot(self, target: str = "Pxe") -> None:
        """Boot once from ``target``; the next boot consumes the override."""
        info = await self.system()
        await self._request(
            "PATCH",
            info.path,
            {"Boot": {"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once"}},
        )

    async def clear_one_time_boot(self) -> None:
        """Remove a one-time boot override that was never used (idempotent).

        A reimage that did not happen must not leave the machine set to network-boot
        at whatever power action comes next, by anyone (docs/decisions/0143).

        Read first, written only when a network boot is armed: every reboot and power
        cycle asks this before its reset (decision 0177), and a write a BMC logs would
        stand beside the reset's own entry in the evidence its reset is judged by. A
        ``Continuous`` one is cleared too: some BMCs read a ``Once`` back as that.
        """
        info, system = await self._system_now()
        boot = system.get("Boot") or {}
        enabled = boot.get("BootSourceOverrideEnabled")
        if enabled == "Disabled" or boot.get("BootSourceOverrideTarget") not in (None, "Pxe"):
            return  # nothing armed, or not a network boot (not ours to remove)
        await self._request("PATCH", info.path, {"Boot": {"BootSourceOverrideEnabled": "Disabled"}})

    async def one_time_boot(self) -> str | None:
        """The network boot armed now, or None (none armed, or the firmware used it: the
        BMC sets a ``Once`` override back to ``Disabled`` when the machine boots with it)."""
        _, system = await self._system_now()
        boot = system.get("Boot") or {}
        if boot.get("BootSourceOverrideEnabled") == "Disabled":
            return None
        # Read as :meth:`clear_one_time_boot` does: what it would remove is what is armed.
        return "Pxe" if boot.get("BootSourceOverrideTarget") in (None, "Pxe") else None
