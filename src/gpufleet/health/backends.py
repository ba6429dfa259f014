"""Choosing a hardware backend by name."""

from __future__ import annotations

from pathlib import Path

from gpufleet.health.hardware import Hardware

BACKENDS = ("real", "simulated")


def open_backend(
    name: str,
    *,
    node: str,
    kmsg_lookback_s: float | None = None,
    sim_publish_dir: Path | None = None,
    sim_ib_leaf: str | None = None,
) -> Hardware:
    """Open the ``real`` or ``simulated`` backend.

    ``kmsg_lookback_s`` (real backend): ignore kernel records older than this
    at start (None: read the whole kernel buffer, as a one-shot check does).
    ``sim_publish_dir`` (simulated backend): where the node publishes its GPUs'
    speed for the jobs that run on it.
    ``sim_ib_leaf`` (simulated backend): ``<switch GUID>[:<name>]``, the InfiniBand leaf
    switch its rail 0 is cabled to (None: no switch answers, the leaf is unknown).
    """
    if name == "simulated":
        from gpufleet.health.backend_sim import SimulatedHardware

        guid, _, name = (sim_ib_leaf or "").partition(":")
        return SimulatedHardware(
            node=node,
            publish_dir=sim_publish_dir,
            ib_leaf=guid or None,
            ib_leaf_name=name or None,
        )
    if name == "real":
        from gpufleet.health.backend_real import RealHardware

        return RealHardware(kmsg_lookback_s=kmsg_lookback_s)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
