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
) -> Hardware:
    """Open the ``real`` or ``simulated`` backend.

    ``kmsg_lookback_s`` (real backend): ignore kernel records older than this
    at start (None: read the whole kernel buffer, as a one-shot check does).
    ``sim_publish_dir`` (simulated backend): where the node publishes its GPUs'
    speed for the jobs that run on it.
    """
    if name == "simulated":
        from gpufleet.health.backend_sim import SimulatedHardware

        return SimulatedHardware(node=node, publish_dir=sim_publish_dir)
    if name == "real":
        from gpufleet.health.backend_real import RealHardware

        return RealHardware(kmsg_lookback_s=kmsg_lookback_s)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
