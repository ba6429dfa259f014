"""gpufleet.sim (see docs/architecture.md)."""
