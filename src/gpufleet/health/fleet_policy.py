"""The agent judges with the FleetPolicy the lifecycle controller obeys, read from the API.

Whether a fault raises a problem condition at all is the policy's call (the
rule's response takes the node out, or the repeat count is reached, after
``detection.raiseAfterSeconds``). An agent that judged with the built-in policy
while the controller obeys a FleetPolicy could stay silent about a fault the
operator's policy acts on. So the agent reads the same object, by the name the
controller is given (``--policy-name``, default ``default``):

- a list and a watch of that one FleetPolicy (field selector on its name), the
  watch ended by the server every ``resync_s`` and opened again from a fresh
  list, so a lost event is a bounded delay, never a stale policy; a broken
  connection is retried after ``backoff_s``;
- a valid spec (validated as the controller validates it: ``load_policy`` with
  the same bounds) is used at once;
- an invalid spec, or a deleted object, keeps the last valid one (as the
  controller does), and says so in the log and ``gpufleet_agent_policy_valid``;
- until a valid one was ever read, the agent **fails closed**
  (:func:`fail_closed_detection`, :meth:`gpufleet.health.agent.Agent._judge`):
  every fault occurrence raises its subsystem's condition at once, whatever the
  built-in rules say, and is an Event. The controller still decides with its
  own policy what a raised condition does (it may only log it), so failing
  closed can cost a condition that says more than the policy acts on, never a
  fault hidden because the policy could not be read (decision 0162).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import yaml

from gpufleet.api import fleetpolicy
from gpufleet.domain.policy import Detection, Policy, PolicyError, default_policy, load_policy
from gpufleet.kubeapi import KubePort, custom

log = logging.getLogger(__name__)

FLEET_POLICIES = custom(fleetpolicy.PLURAL)


def fail_closed_detection() -> Detection:
    """Debounce while no FleetPolicy was read: raise at once (no ``raiseAfterSeconds`` to
    hide a short fault behind), clear after the built-in quiet time (and, as always, only
    once the controller recorded the condition)."""
    built_in = default_policy().detection
    return Detection(
        raise_after_seconds=0,
        clear_after_seconds=built_in.clear_after_seconds,
        stragglers=built_in.stragglers,
    )


def policy_of(body: Mapping[str, Any], name: str) -> Policy:
    """A FleetPolicy object's spec as the controller validates it; raises PolicyError."""
    spec = body.get("spec") or {}
    return load_policy(yaml.safe_dump(dict(spec)), f"FleetPolicy {name}")


class FleetPolicyFollower:
    """Follows one FleetPolicy; hands each new valid spec to ``use``."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[KubePort]],
        name: str,
        *,
        resync_s: float = 60.0,
        backoff_s: float = 5.0,
    ) -> None:
        self.connect = connect
        self.name = name
        self.resync_s = resync_s
        self.backoff_s = backoff_s
        self.policy: Policy | None = None
        """The last valid spec read (None: none yet, the agent fails closed)."""
        self.valid: bool | None = None
        """Whether the object as last read was valid (None: not read yet, or absent)."""
        self.problem = ""
        """Why the object in the apiserver is not in use, when it is not."""
        self._said = ""

    def apply(self, body: Mapping[str, Any] | None) -> Policy | None:
        """Take in the object as read (None: absent or deleted); the policy to use now,
        if it changed."""
        if body is None:
            self.valid = None
            self._say(
                f"FleetPolicy {self.name} not found: "
                + ("keeping the last valid one" if self.policy else "failing closed")
            )
            return None
        try:
            policy = policy_of(body, self.name)
        except PolicyError as exc:
            self.valid = False
            problems = "; ".join(str(i) for i in exc.issues)
            self._say(
                f"FleetPolicy {self.name} is invalid, "
                + ("keeping the last valid one" if self.policy else "failing closed")
                + f": {problems}"
            )
            return None
        self.valid = True
        self.problem = ""
        if policy == self.policy:
            return None
        self.policy = policy
        self._said = ""
        log.info("agent uses FleetPolicy %s (generation %s)", self.name, _generation(body))
        return policy

    def _say(self, problem: str) -> None:
        self.problem = problem
        if problem != self._said:
            self._said = problem
            log.warning("%s", problem)

    async def run(self, use: Callable[[Policy], None]) -> None:
        """List and watch the FleetPolicy until cancelled; ``use`` gets every new valid spec."""
        selector = f"metadata.name={self.name}"
        timeout = max(1, int(self.resync_s))
        while True:
            try:
                api = await self.connect()
                listing = await api.list(FLEET_POLICIES, field_selector=selector)
                self._deliver(use, listing.items[0] if listing.items else None)
                async for event in api.watch(
                    FLEET_POLICIES,
                    listing.resource_version,
                    field_selector=selector,
                    timeout_s=timeout,
                ):
                    if event.type == "BOOKMARK":
                        continue
                    self._deliver(use, None if event.type == "DELETED" else event.object)
                continue  # the server ended the watch: list again (bounded staleness)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # unreadable: keep what we have (or stay closed)
                self._say(
                    f"FleetPolicy {self.name} not read ({exc}): "
                    + ("keeping the last valid one" if self.policy else "failing closed")
                )
            await asyncio.sleep(self.backoff_s)

    def _deliver(self, use: Callable[[Policy], None], body: Mapping[str, Any] | None) -> None:
        policy = self.apply(body)
        if policy is not None:
            use(policy)


def _generation(body: Mapping[str, Any]) -> object:
    return (body.get("metadata") or {}).get("generation")
