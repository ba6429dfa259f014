"""slurm.conf lines and scripts that run ``gpufleet health check`` inside Slurm (pure).

Slurm runs a program, with no arguments, as ``HealthCheckProgram``, ``Prolog``
and ``Epilog``; each is a two-line shell script that execs ``gpufleet health
check --slurm <mode>`` with the configured checks and bounds. The SlurmCluster
operator (chart) and the local cluster render the same text from here.

Every run is bounded (decision 0094): the checks by ``timeout_s``, each of
the two ``scontrol`` calls of a drain by 5 s, the gang preflight by
``preflight_timeout_s`` (+ 5 s to kill it) and its requeue by 3 x 5 s.
``PrologEpilogTimeout`` is set above that sum as Slurm's own backstop: should
gpufleet itself ever hang past its bound, slurmd kills the prolog, which
requeues the job (``nohold_on_prolog_fail``) instead of holding it forever.
``BatchStartTimeout`` (Slurm's default is 10 s, prolog included, after which the
job is requeued as if its node had failed) is raised to the same value.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MODES = ("health", "prolog", "epilog")
SCONTROL_S = 5.0
"""Bound of one scontrol call made by a hook (as in gpufleet.health.slurm_hook)."""
BACKSTOP_MARGIN_S = 30
"""How far above gpufleet's own bound Slurm's ``PrologEpilogTimeout`` is set."""
NOHOLD = "nohold_on_prolog_fail"


@dataclass(frozen=True, slots=True)
class HookConfig:
    """Which hooks run and how long they may take."""

    gpufleet: str = "gpufleet"
    """The gpufleet executable on the nodes (an absolute path in slurm.conf's world)."""
    checks: tuple[str, ...] = (
        "gpu-count",
        "gpu-xid",
        "gpu-memory",
        "nvlink",
        "pcie",
        "infiniband",
    )
    """Fast passive checks: a prolog runs before every job."""
    timeout_s: float = 20.0
    health_interval_s: int = 0
    """``HealthCheckInterval``; 0: no ``HealthCheckProgram``."""
    prolog: bool = True
    epilog: bool = True
    preflight: bool = False
    """Gang preflight of multi-node jobs in the prolog (sets ``PrologFlags=Alloc``)."""
    preflight_timeout_s: float = 20.0
    extra_args: tuple[str, ...] = ()
    """More ``gpufleet health check`` options (``--backend simulated`` locally)."""
    inject_dir: str | None = None
    """Local cluster only: ``<dir>/inject-<node>`` holds simulated faults for that node."""
    log_file: str | None = None
    """Append each run's one-line outcome here (Slurm 22.05 keeps no prolog output)."""
    slurm_conf: str | None = None
    """Exported as ``SLURM_CONF`` for the hook's ``scontrol`` calls: slurmd passes it to
    a prolog but not to ``HealthCheckProgram`` (measured on 22.05); None: the default path."""


def bound_s(cfg: HookConfig, mode: str) -> float:
    """The longest one run of the hook can take, by gpufleet's own limits."""
    total = cfg.timeout_s + 2 * SCONTROL_S
    if mode == "prolog" and cfg.preflight:
        total += cfg.preflight_timeout_s + 5 + 3 * SCONTROL_S
    return total


def script(cfg: HookConfig, mode: str) -> str:
    """The program Slurm runs for ``mode``."""
    if mode not in MODES:
        raise ValueError(f"unknown hook {mode!r}; known: {', '.join(MODES)}")
    argv = [cfg.gpufleet, "health", "check", "--slurm", mode, "--timeout", f"{cfg.timeout_s:g}"]
    argv += ["--checks", ",".join(cfg.checks), *cfg.extra_args]
    if mode == "prolog" and cfg.preflight:
        argv += ["--preflight", "--preflight-timeout", f"{cfg.preflight_timeout_s:g}"]
    command = " ".join(shlex.quote(a) for a in argv)
    lines = ["#!/bin/sh", "# gpufleet: node checks as Slurm runs them (docs/slurm.md)."]
    if cfg.slurm_conf is not None:
        lines.append(f"export SLURM_CONF={shlex.quote(cfg.slurm_conf)}")
    if cfg.inject_dir is not None:
        f = shlex.quote(cfg.inject_dir) + '/inject-"$SLURMD_NODENAME"'
        lines.append(f'inject=""; [ -f {f} ] && inject="--inject $(cat {f})"')
        command += " $inject"
    if cfg.log_file is not None:
        command += f" 2>>{shlex.quote(cfg.log_file)}"
    lines.append(f"exec {command}")
    return "\n".join(lines) + "\n"


def conf_lines(cfg: HookConfig, paths: Mapping[str, str]) -> list[str]:
    """slurm.conf directives for the hooks at ``paths`` (mode -> script path)."""
    lines: list[str] = []
    if cfg.health_interval_s > 0:
        lines += [
            f"HealthCheckProgram={paths['health']}",
            f"HealthCheckInterval={cfg.health_interval_s}",
            "HealthCheckNodeState=ANY,CYCLE",
        ]
    if cfg.prolog:
        lines.append(f"Prolog={paths['prolog']}")
        if cfg.preflight:
            lines.append("PrologFlags=Alloc")
    if cfg.epilog:
        lines.append(f"Epilog={paths['epilog']}")
    if cfg.prolog or cfg.epilog:
        backstop = math.ceil(max(bound_s(cfg, m) for m in MODES) + BACKSTOP_MARGIN_S)
        lines.append(f"PrologEpilogTimeout={backstop}")
    if cfg.prolog:
        # slurmctld gives a batch job BatchStartTimeout (default 10 s) to start, prolog
        # included, then calls it a node failure and requeues it: a prolog that may
        # take its full bound needs that much.
        lines.append(f"BatchStartTimeout={backstop}")
    return lines


def scheduler_parameters(existing: Sequence[str]) -> list[str]:
    """``SchedulerParameters`` with ``nohold_on_prolog_fail``: a job whose prolog failed
    on a bad node is requeued to run elsewhere, not held until a person releases it."""
    return [*existing, NOHOLD] if NOHOLD not in existing else list(existing)
