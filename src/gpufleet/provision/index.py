"""An in-memory index of Machines by MAC, fed by a watch.

A boot storm asks for the same few hundred Machines many times a second;
answering each request with a label-selector list costs the apiserver (and
the two cores it may share with everything else) more than the request is
worth. The index lists Machines once, then follows a watch, so iPXE and
meta-data need no apiserver request and user-data one fewer.

What the index may and may not decide:

* a MAC it knows is answered from it (iPXE and meta-data carry no secret; a
  Machine deleted a moment ago may still be answered until the watch delivers
  the deletion, usually milliseconds);
* a MAC it does not know, or any lookup while it is not synced (starting,
  or the watch broke and is being re-listed), falls through to a direct
  apiserver read: a Machine created after the service started is served;
* a token is never issued *because of* the index: the claim is the same
  ``resourceVersion``-guarded status write as without it, so a stale entry
  makes the write fail and the issuer reads the Machine again
  (:meth:`gpufleet.provision.issuer.Provisioner.user_data`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from gpufleet.kubeapi import ApiError, Gone, KubePort, custom
from gpufleet.provision import machines

log = logging.getLogger("gpufleet.provision.index")
Json = dict[str, Any]
MACHINES = custom(machines.PLURAL)


def _macs_of(body: Json) -> list[str]:
    out = []
    for mac in (body.get("spec") or {}).get("macs") or []:
        with contextlib.suppress(ValueError):
            out.append(machines.normalize_mac(str(mac)))
    return out


class MachineIndex:
    """Machines by name and by MAC, kept current by a list + watch loop (:meth:`run`)."""

    def __init__(self, api: KubePort, *, retry_s: float = 1.0) -> None:
        self.api = api
        self.retry_s = retry_s
        self._by_name: dict[str, Json] = {}
        self._by_mac: dict[str, str] = {}
        self._synced = False
        self.ready = asyncio.Event()
        """Set after the first complete list (for start-up and tests)."""
        self.resource_version = ""

    @property
    def synced(self) -> bool:
        """True while the index follows a live watch started from a complete list."""
        return self._synced

    def __len__(self) -> int:
        return len(self._by_name)

    def lookup(self, mac: str) -> Json | None:
        """The Machine listing ``mac`` (normalized), or None: unknown here *or* not synced.

        None never means "no such Machine": the caller reads the apiserver.
        """
        if not self._synced:
            return None
        name = self._by_mac.get(mac)
        return None if name is None else self._by_name.get(name)

    # ---------------------------------------------------------------- updates

    def _put(self, body: Json) -> None:
        name = str((body.get("metadata") or {}).get("name") or "")
        if not name:
            return
        self._drop(name)
        self._by_name[name] = body
        for mac in _macs_of(body):
            self._by_mac[mac] = name

    def _drop(self, name: str) -> None:
        old = self._by_name.pop(name, None)
        if old is None:
            return
        for mac in _macs_of(old):
            if self._by_mac.get(mac) == name:
                del self._by_mac[mac]

    def replace(self, items: list[Json], resource_version: str) -> None:
        """A complete list: the index becomes exactly these Machines."""
        self._by_name.clear()
        self._by_mac.clear()
        for body in items:
            self._put(body)
        self.resource_version = resource_version
        self._synced = True
        self.ready.set()

    def apply(self, kind: str, body: Json) -> None:
        """One watch event (ADDED, MODIFIED, DELETED, BOOKMARK)."""
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        if kind in ("ADDED", "MODIFIED"):
            self._put(body)
        elif kind == "DELETED":
            self._drop(str((body.get("metadata") or {}).get("name") or ""))
        if rv:
            self.resource_version = rv

    # ------------------------------------------------------------------- loop

    async def run(self) -> None:
        """List, then watch, forever; any failure unsyncs the index and lists again."""
        while True:
            try:
                listing = await self.api.list(MACHINES)
                self.replace(listing.items, listing.resource_version)
                log.info(
                    "machine index synced: %d machines at %s",
                    len(listing.items),
                    listing.resource_version,
                )
                while True:  # a watch ends every few minutes; resume where it stopped
                    async for event in self.api.watch(
                        MACHINES, self.resource_version, bookmarks=True
                    ):
                        self.apply(event.type, event.object)
            except asyncio.CancelledError:
                self._synced = False
                raise
            except Gone:
                self._synced = False
                log.info("machine watch expired; listing again")
            except (ApiError, ValueError) as exc:
                self._synced = False
                log.warning("machine index not synced (%s); direct reads until it is", exc)
                await asyncio.sleep(self.retry_s)
