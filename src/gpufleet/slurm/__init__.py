"""gpufleet.slurm (see docs/architecture.md)."""
