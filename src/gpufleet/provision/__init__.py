"""gpufleet.provision (see docs/architecture.md)."""
