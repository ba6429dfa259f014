"""Per-SKU health thresholds, as validated data, and how a measurement is judged.

A :class:`SkuProfile` holds what a healthy node of one hardware SKU looks
like: GPU count and NVLink links, the InfiniBand rate, the lowest acceptable
GEMM throughput, HBM bandwidth and all-reduce bus bandwidth, thermal limits,
and how far one GPU may fall behind its peers. The profiles themselves are
data (``gpufleet/health/profiles.yaml``, with the source of every number);
this module only parses and applies them, so the agent, the controllers and
the simulator judge a measurement the same way.

Pure: :func:`load_profiles` parses text that the caller read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class SkuProfile(_Model):
    """What a healthy node of one SKU measures. Throughputs are lower bounds."""

    name: str
    description: str = ""
    match: tuple[str, ...] = ()
    """Regular expressions matched (case-insensitively) against the NVML GPU name."""
    gpus_per_node: int = Field(default=8, ge=1)
    nvlinks_per_gpu: int = Field(default=0, ge=0)
    """Active NVLink links a healthy GPU has (0: not checked)."""
    ib_rate_gbps: float = Field(default=0, ge=0)
    """Expected rate of every InfiniBand port (0: not checked)."""
    gemm_bf16_tflops_min: float = Field(gt=0)
    hbm_gbps_min: float = Field(gt=0)
    allreduce_busbw_gbps_min: float = Field(gt=0)
    """Intra-node all-reduce bus bandwidth at the check's message size."""
    peer_tolerance: float = Field(default=0.15, gt=0, lt=1)
    """A GPU this fraction below the median of its peers is flagged (straggler GPU)."""
    max_temperature_c: float = Field(default=85, gt=0)
    retired_pages_max: int = Field(default=60, ge=1)
    ib_symbol_errors_max: int = Field(default=10, ge=1)
    """Symbol-error increase between two observations that counts as a fault."""
    gemm_size: int = Field(default=8192, ge=16)
    """Square matrix size of the GEMM check."""
    hbm_bytes: int = Field(default=2 << 30, ge=1 << 10)
    """Buffer size of the HBM bandwidth check."""
    allreduce_bytes: int = Field(default=256 << 20, ge=1 << 10)
    sdc_rtol: float = Field(default=2e-2, gt=0)
    """Relative tolerance when comparing a GPU's GEMM result with the reference."""


class Profiles(_Model):
    """All profiles, in match order."""

    profiles: tuple[SkuProfile, ...]

    def get(self, name: str) -> SkuProfile:
        """The profile called ``name``; KeyError lists the known names."""
        for p in self.profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"no SKU profile {name!r}; known: {known}")

    def for_gpu(self, gpu_name: str) -> SkuProfile | None:
        """The first profile whose pattern matches an NVML GPU name."""
        for p in self.profiles:
            if any(re.search(pat, gpu_name, re.IGNORECASE) for pat in p.match):
                return p
        return None


class ProfileError(ValueError):
    """A profiles file is not valid."""


def load_profiles(text: str, source: str = "<profiles>") -> Profiles:
    """Parse and validate profiles from YAML text (``profiles: [...]``)."""
    try:
        data: Any = yaml.safe_load(text)
        return Profiles.model_validate(data)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: not valid YAML: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ProfileError(f"{source}: {problems}") from None


class Verdict(StrEnum):
    """The outcome of comparing a measurement with its threshold."""

    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Judgement:
    """One measurement against one threshold."""

    verdict: Verdict
    measured: float | None
    threshold: float
    detail: str


def at_least(measured: float | None, threshold: float, what: str, unit: str) -> Judgement:
    """Pass when ``measured >= threshold``; unknown when nothing was measured."""
    if measured is None or measured != measured:  # None or NaN
        return Judgement(Verdict.UNKNOWN, None, threshold, f"{what}: not measured")
    if measured >= threshold:
        return Judgement(
            Verdict.PASS, measured, threshold, f"{what} {measured:.1f} {unit} >= {threshold:g}"
        )
    return Judgement(
        Verdict.FAIL, measured, threshold, f"{what} {measured:.1f} {unit} < {threshold:g} {unit}"
    )


def laggards(values: Mapping[int, float], tolerance: float) -> dict[int, float]:
    """Members more than ``tolerance`` below the median of all, with their ratio to it.

    With fewer than three members the median says little, so none is flagged.
    """
    if len(values) < 3:
        return {}
    ordered = sorted(values.values())
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    if median <= 0:
        return {}
    return {k: v / median for k, v in sorted(values.items()) if v < median * (1.0 - tolerance)}
