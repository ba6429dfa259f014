"""gpufleet: a control plane for GPU training clusters on Kubernetes.

Packages (see docs/architecture.md): ``domain`` holds every decision as pure
functions; ``health``, ``lifecycle``, ``slurm``, ``provision``, ``remediate``,
``sim`` and ``local`` are the products that act on those decisions; ``cli``
is the ``gpufleet`` command.
"""

__version__ = "0.1.0"
"""The one source of gpufleet's version: the package's (pyproject.toml reads it), the Helm
chart's ``appVersion`` and the release images' tags (tests/unit/test_version.py checks
they agree; decision 0183)."""
