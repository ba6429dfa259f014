"""gpufleet.local (see docs/architecture.md)."""
