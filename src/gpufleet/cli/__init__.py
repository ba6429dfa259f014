"""The ``gpufleet`` command line. May import every other package."""
