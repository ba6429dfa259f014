"""Run a seed, replay a run, shrink a failing one, say what happened.

A run is fully described by a :class:`Spec`: the seed, the shape of the cluster, the
environment events (drawn from the seed unless given) and the scheduler's choices
(drawn unless given), and whether ready callbacks are shuffled. :func:`run` executes it
on a fresh :class:`~gpufleet.dst.world.World` and stops at the first violation;
:func:`shrink` deletes environment events and sets choices back to their default for
as long as the same invariant still fails, so the trace that is left is short enough
to read. Replaying a spec gives the same trace, byte for byte (``Result.digest``),
provided the interpreter hashes strings the same way (``PYTHONHASHSEED``, which
:func:`ensure_hash_seed` fixes for command-line use).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpufleet.dst.invariants import Invariants
from gpufleet.dst.roll_checks import RollChecks
from gpufleet.dst.scenario import Config, Env, apply, build, generate
from gpufleet.dst.slurmd import MAX_UNAVAILABLE
from gpufleet.dst.trace import Line, render
from gpufleet.dst.world import Violation, World


@dataclass(frozen=True)
class Spec:
    """Everything a run depends on."""

    seed: int
    config: Config = field(default_factory=Config)
    events: tuple[Env, ...] | None = None
    choices: tuple[int, ...] | None = None
    shuffle: bool = True

    def to_json(self) -> str:
        data = {
            "seed": self.seed,
            "config": asdict(self.config),
            "events": None
            if self.events is None
            else [[e.at, e.kind, list(e.args)] for e in self.events],
            "choices": None if self.choices is None else list(self.choices),
            "shuffle": self.shuffle,
        }
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        """A spec written by :meth:`to_json`, today's or an older harness's: fields and
        event kinds it no longer has are dropped or renamed (a ClusterKopfPeering
        deleted is now the Lease deleted), so a recorded seed stays a regression test."""
        d = json.loads(text)
        events = d.get("events")
        known = {f.name for f in dataclasses.fields(Config)}
        config = {k: v for k, v in (d.get("config") or {}).items() if k in known}
        if "weights" in config:
            kinds = Config().weights
            config["weights"] = {k: v for k, v in config["weights"].items() if k in kinds}
        return cls(
            seed=int(d["seed"]),
            config=Config(**config),
            events=None if events is None else tuple(_env(a, k, x) for a, k, x in events),
            choices=None if d.get("choices") is None else tuple(d["choices"]),
            shuffle=bool(d.get("shuffle", True)),
        )


def _env(at: float, kind: str, args: list[Any]) -> Env:
    if kind == "peering":
        return Env(at, "lease", ())
    return Env(at, kind, tuple(args))


@dataclass
class Result:
    spec: Spec
    violation: Violation | None
    digest: str
    events: tuple[Env, ...]
    choices: tuple[int, ...]
    """The choices this run made (a replay with them is the same run)."""
    steps: int
    callbacks: int
    calls: int
    """Trace lines (port calls, events, verdicts)."""
    virtual_s: float
    wall_s: float
    story: list[Line]
    lines: list[Line]

    @property
    def failed(self) -> bool:
        return self.violation is not None

    def replay_spec(self) -> Spec:
        return replace(self.spec, events=self.events, choices=self.choices)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Product logs off for the run (they cost time and the trace says what matters)."""
    loggers = [logging.getLogger(n) for n in ("gpufleet", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels, strict=True):
            lg.setLevel(lv)


def run(
    spec: Spec,
    *,
    keep_trace: bool = True,
    stop_on_violation: bool = True,
    until: float | None = None,
    inspect: Callable[[World], None] | None = None,
) -> Result:
    """Run one spec to its end or its first violation. ``until``: stop at that virtual
    time instead (no final checks); ``inspect``: called with the world before it is torn
    down, to look at the products' memory in a debugging session."""
    cfg = spec.config
    events = spec.events if spec.events is not None else tuple(generate(spec.seed, cfg))
    names = [f"n{i + 1}" for i in range(cfg.nodes)]
    world = World(
        spec.seed,
        names,
        replay=None if spec.choices is None else list(spec.choices),
        shuffle=spec.shuffle,
        keep_trace=keep_trace,
    )
    world.stop_on_violation = stop_on_violation
    loop = world.loop
    started = time.perf_counter()
    old_loop = _current_loop()
    asyncio.set_event_loop(loop)
    # No cyclic garbage collection during the run: a collection finalizes abandoned
    # coroutines and async generators (a watch stream given up) at a moment no seed
    # fixes; with reference counting alone they go when the last reference does.
    gc_was = gc.isenabled()
    gc.disable()
    try:
        with quiet():
            policy = build(world, cfg, spec.seed)
            inv = Invariants(world, policy)
            inv.attach()
            roll = None
            if world.slurmd is not None:
                roll = RollChecks(world, world.slurmd, MAX_UNAVAILABLE)
                roll.attach()
            for ev in events:
                loop.call_at(ev.at, apply, world, ev)

            def every_second() -> None:
                inv.check_armed()
                inv.check_breaker()
                if roll is not None:
                    roll.check_liveness()
                loop.call_later(1.0, every_second)

            loop.call_later(1.0, every_second)
            end = cfg.duration + cfg.calm_s
            loop.run_until(end if until is None else min(until, end))
            due = inv.armed_due() if until is None else None
            if due is not None and due > loop.time() and not world.violations:
                # Drain-out: no more environment events, the products keep running until
                # a network boot armed at the very end has had its grace (decision 0256).
                loop.run_until(due + 1.0)
            if not world.violations and loop.time() >= end:
                inv.check_end()
            if inspect is not None:
                inspect(world)
            _teardown(world)
    finally:
        asyncio.set_event_loop(old_loop)
        loop.close()
        if gc_was:
            gc.enable()
    return Result(
        spec=spec,
        violation=world.violations[0] if world.violations else None,
        digest=world.trace.digest(),
        events=tuple(events),
        choices=tuple(world.choices.drawn),
        steps=loop.steps,
        callbacks=loop.callbacks,
        calls=world.trace.count,
        virtual_s=loop.time(),
        wall_s=time.perf_counter() - started,
        story=world.trace.story(),
        lines=world.trace.lines,
    )


def _current_loop() -> asyncio.AbstractEventLoop | None:
    with contextlib.suppress(RuntimeError):
        return asyncio.get_event_loop_policy().get_event_loop()
    return None


def _teardown(world: World) -> None:
    """Every process killed for good, their tasks given a moment to unwind."""
    for name in list(world.procs):
        world.kill(name, restart_s=None, why="end of run")
    loop = world.loop
    for _ in range(200):
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not pending:
            break
        for t in pending:
            t.cancel()
        loop.call_soon(loop.stop)
        loop.run_forever()


# ------------------------------------------------------------------ shrink


def shrink(
    failing: Result,
    *,
    max_runs: int = 300,
    keeps: Callable[[Result], bool] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Result:
    """The smallest run found that still fails the same way: fewer environment events,
    more default choices, no shuffling.

    "The same way" is the same violation category (``1/after-step-timeout``), or what
    ``keeps`` says of a run (then the run need not have failed at all). Cheap cuts
    first (every choice to its default, the events of other nodes, of a kind), then
    halves, quarters... single events (delta debugging), then blocks of choices.
    """
    assert failing.violation is not None or keeps is not None
    target = failing.violation.category if failing.violation is not None else ""

    def same(r: Result) -> bool:
        if keeps is not None:
            return keeps(r)
        return r.violation is not None and r.violation.category == target

    best = failing
    spec = failing.replay_spec()
    runs = 0
    # A run that has not failed this long after the original did is taken as passing
    # (a lost fault is only judged at the very end: those run to the end).
    horizon = (
        None
        if failing.violation is None or target.startswith("3b")
        else failing.violation.at + 120.0
    )

    def attempt(spec: Spec) -> Result | None:
        nonlocal runs
        runs += 1
        r = run(spec, keep_trace=False, until=horizon)
        return r if same(r) else None

    def say(what: str) -> None:
        if progress is not None:
            progress(
                f"shrink: {what} (runs {runs}, events {len(best.events)}, "
                f"non-default choices {sum(1 for c in best.choices if c)})"
            )

    def cut(r: Result) -> Spec:
        """Events after the violation never happened; choices after it were never made."""
        at = r.violation.at if r.violation else float("inf")
        return replace(r.replay_spec(), events=tuple(e for e in r.events if e.at <= at))

    def keep_if(trial: Spec, what: str) -> bool:
        nonlocal best, spec
        r = attempt(trial)
        if r is None:
            return False
        best, spec = r, cut(r)
        say(what)
        return True

    spec = cut(best)
    if best.spec.shuffle:
        keep_if(replace(spec, shuffle=False), "no shuffling")
    keep_if(replace(spec, choices=()), "every choice the default")
    node = failing.violation.node if failing.violation is not None else ""
    if node and node != "-":
        keep_if(
            replace(
                spec,
                events=tuple(e for e in spec.events or () if node in e.args or e.kind == "job"),
            ),
            f"only the events of {node} (and jobs)",
        )
    for kind in sorted({e.kind for e in spec.events or ()}):
        if runs >= max_runs:
            break
        keep_if(
            replace(spec, events=tuple(e for e in spec.events or () if e.kind != kind)),
            f"no {kind} events",
        )
    changed = True
    while changed and runs < max_runs:
        changed = False
        size = max(1, len(spec.events or ()) // 2)
        while size >= 1 and runs < max_runs:
            i = 0
            while i < len(spec.events or ()) and runs < max_runs:
                evs = spec.events or ()
                if keep_if(
                    replace(spec, events=evs[:i] + evs[i + size :]), f"dropped {size} event(s)"
                ):
                    changed = True
                else:
                    i += size
            size //= 2
        nonzero = [i for i, c in enumerate(spec.choices or ()) if c]
        size = max(1, len(nonzero) // 2)
        while size >= 1 and runs < max_runs:
            nonzero = [i for i, c in enumerate(spec.choices or ()) if c]
            j = 0
            while j < len(nonzero) and runs < max_runs:
                block = set(nonzero[j : j + size])
                trial = tuple(0 if k in block else c for k, c in enumerate(spec.choices or ()))
                if keep_if(replace(spec, choices=trial), f"defaulted {len(block)} choice(s)"):
                    changed = True
                    nonzero = [i for i, c in enumerate(spec.choices or ()) if c]
                else:
                    j += size
            size //= 2
    final = run(spec, keep_trace=True)
    if not same(final):
        raise AssertionError(f"the shrunk run does not fail the same way: {spec.to_json()}")
    return final


# ------------------------------------------------------------------ report


def describe(r: Result, *, last: int = 25) -> str:
    """A failing (or passing) run in words: the verdict, the story's last lines, the replay."""
    head = (
        f"seed {r.spec.seed}: {'FAILED ' + r.violation.line() if r.violation else 'passed'}\n"
        f"  {r.virtual_s:.0f} virtual s, {r.steps} steps, {r.calls} trace lines, "
        f"{len(r.events)} environment events, {sum(1 for c in r.choices if c)} non-default "
        f"choices of {len(r.choices)}, {r.wall_s:.2f} s wall"
    )
    story = render(r.story[-last:]) if r.story else ""
    return head + ("\n" + story if story else "")


def ensure_hash_seed() -> None:
    """Re-execute with ``PYTHONHASHSEED=0`` unless it is set: string hashing orders sets the
    products iterate, and a replay in another process must iterate them the same way."""
    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])


__all__ = ["Config", "Result", "Spec", "describe", "ensure_hash_seed", "run", "shrink"]
