"""gpufleet.sim: a discrete-event simulator of a GPU fleet under a policy.

It answers what a policy is worth in goodput (ETTR) before it is deployed:
the failure model (:mod:`model`) says what breaks and how often, the policy
(the same file the controller uses) says what gpufleet does about it, and
every decision goes through :func:`gpufleet.domain.decide`. Imports only
``gpufleet.domain``; no I/O beyond reading packaged model files.
"""

from gpufleet.sim.engine import Simulator, simulate
from gpufleet.sim.model import Model, ModelError, default_model, load_model
from gpufleet.sim.result import Estimate, RunResult, summarize

__all__ = [
    "Estimate",
    "Model",
    "ModelError",
    "RunResult",
    "Simulator",
    "default_model",
    "load_model",
    "simulate",
    "summarize",
]
