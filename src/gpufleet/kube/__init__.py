"""gpufleet.kube (see docs/architecture.md)."""
