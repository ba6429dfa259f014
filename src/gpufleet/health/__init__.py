"""gpufleet.health (see docs/architecture.md)."""
