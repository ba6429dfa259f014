"""The live timeline: entries printed as they happen, relative to the start.

:meth:`Timeline.wait` is how a scenario says what must happen next: it keeps
polling the :class:`~gpufleet.demo.observe.Observer` (printing everything it
sees) until an entry matches, and raises :class:`StepMissed` -- naming the
component whose log to read -- when the deadline passes first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from gpufleet.demo.observe import Entry, Observer

POLL_S = 0.2
STYLES = {
    "fault": "bold red",
    "condition": "red",
    "event": "dim red",
    "cordon": "yellow",
    "slurm-drain": "yellow",
    "job-requeued": "magenta",
    "train-start": "magenta",
    "bmc-reset": "cyan",
    "agent-result": "cyan",
    "state": "blue",
    "slurm-resume": "green",
    "uncordon": "green",
    "train-done": "bold green",
    "job-completed": "bold green",
    "breaker-open": "bold red",
    "demo": "bold",
    "power-on": "bold cyan",
    "ipxe": "cyan",
    "user-data": "cyan",
    "token-accepted": "cyan",
    "token-refused": "green",
    "node-added": "green",
    "node-ready": "green",
}


class StepMissed(RuntimeError):
    """An expected step did not happen within its deadline."""

    def __init__(self, what: str, timeout: float, component: str, log: Path | None) -> None:
        self.component = component
        self.log = log
        where = f"\n  look at {component}'s log: {log}" if log else ""
        super().__init__(f"{what}: did not happen within {timeout:.0f} s ({component}){where}")


@dataclass
class Mark:
    """A scenario's own action (fault injected, controller killed) on the timeline."""

    t: float
    text: str


class Timeline:
    def __init__(
        self,
        observer: Observer,
        console: Console | None = None,
        *,
        health: Callable[[], None] = lambda: None,
    ) -> None:
        self.observer = observer
        self.console = console or Console(highlight=False)
        self.t0 = time.time()
        self.entries: list[Entry] = []
        self.health = health
        """Called every poll; raises when a component died."""

    def rel(self, t: float) -> float:
        return t - self.t0

    def show(self, entry: Entry) -> None:
        style = STYLES.get(entry.kind, "")
        stamp = f"[dim]{self.rel(entry.t):7.2f}s[/dim]"
        body = escape(entry.text)
        text = f"[{style}]{body}[/{style}]" if style else body
        self.console.print(f"{stamp}  {text}", soft_wrap=True)

    def note(self, kind: str, text: str, node: str | None = None) -> Entry:
        """Record and print something the demo itself did."""
        entry = Entry(time.time(), kind, node, text)
        self.entries.append(entry)
        self.show(entry)
        return entry

    def poll(self) -> list[Entry]:
        self.health()
        new = sorted(self.observer.poll(), key=lambda e: e.t)
        for e in new:
            self.entries.append(e)
            self.show(e)
        return new

    def prime(self) -> None:
        """Record where every source starts, so only changes are reported."""
        self.observer.poll()

    def find(
        self,
        kind: str,
        node: str | None = None,
        match: Callable[[Entry], bool] | None = None,
        after: float = 0.0,
    ) -> Entry | None:
        for e in self.entries:
            if e.kind != kind or e.t < after:
                continue
            if node is not None and e.node != node:
                continue
            if match is not None and not match(e):
                continue
            return e
        return None

    def wait(
        self,
        kind: str,
        *,
        what: str,
        timeout: float,
        component: str,
        log: Path | None = None,
        node: str | None = None,
        match: Callable[[Entry], bool] | None = None,
        after: float = 0.0,
    ) -> Entry:
        deadline = time.monotonic() + timeout
        while True:
            found = self.find(kind, node, match, after)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise StepMissed(what, timeout, component, log)
            self.poll()
            time.sleep(POLL_S)

    def idle(self, seconds: float) -> None:
        """Keep printing what happens for ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll()
            time.sleep(POLL_S)

    def count(self, kind: str, node: str | None = None) -> int:
        return sum(1 for e in self.entries if e.kind == kind and (node is None or e.node == node))
