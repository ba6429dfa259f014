"""gpufleet.lifecycle (see docs/architecture.md)."""
