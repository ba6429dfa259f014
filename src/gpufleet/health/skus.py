"""The bundled SKU profiles (``profiles.yaml``) and how a node's SKU is found."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from gpufleet.domain.profiles import Profiles, SkuProfile, load_profiles

DEFAULT_SKU = "h100-sxm"
"""Used when the GPU name matches no profile (and for the simulated backend)."""


@functools.lru_cache(maxsize=1)
def bundled() -> Profiles:
    """The profiles shipped with gpufleet."""
    text = resources.files("gpufleet.health").joinpath("profiles.yaml").read_text()
    return load_profiles(text, "gpufleet/health/profiles.yaml")


def load(path: Path | None) -> Profiles:
    """Profiles from a file, or the bundled ones."""
    if path is None:
        return bundled()
    return load_profiles(path.read_text(), str(path))


def choose(profiles: Profiles, *, sku: str | None, gpu_names: list[str]) -> SkuProfile:
    """The profile named ``sku``, else the one matching the first GPU, else the default."""
    if sku:
        return profiles.get(sku)
    for name in gpu_names:
        found = profiles.for_gpu(name)
        if found is not None:
            return found
    return profiles.get(DEFAULT_SKU)
