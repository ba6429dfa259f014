"""gpufleet.remediate (see docs/architecture.md)."""
