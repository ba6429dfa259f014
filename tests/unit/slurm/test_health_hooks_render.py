"""The health hooks in the rendered Slurm config: directives, scripts and their bounds."""

from __future__ import annotations

import pytest

from gpufleet.api import slurmcluster as crd
from gpufleet.domain import slurm_hooks
from gpufleet.slurm import render

BASE = {
    "nodePools": [{"name": "h100", "nodeSelector": {"gpu": "true"}}],
    "partitions": [{"name": "batch", "pools": ["h100"], "default": True}],
}
NODES = [render.NodeInfo("n0", {"gpu": "true"}, "10.0.0.1")]


def spec(**health: object) -> crd.SlurmClusterSpec:
    return crd.SlurmClusterSpec.model_validate({**BASE, "healthChecks": health})


def test_off_by_default_nothing_is_added() -> None:
    data = render.render_all(spec(), NODES)
    assert set(data) == {"slurm.conf", "gres.conf", "cgroup.conf", "topology.conf"}
    assert "Prolog" not in data["slurm.conf"] and "HealthCheck" not in data["slurm.conf"]


def test_enabled_hooks_render_directives_and_scripts() -> None:
    data = render.render_all(spec(enabled=True, preflight=True, healthIntervalSeconds=120), NODES)
    conf = data["slurm.conf"].splitlines()
    for line in (
        "HealthCheckProgram=/etc/slurm/gpufleet-health",
        "HealthCheckInterval=120",
        "Prolog=/etc/slurm/gpufleet-prolog",
        "PrologFlags=Alloc",
        "Epilog=/etc/slurm/gpufleet-epilog",
        "SchedulerParameters=nohold_on_prolog_fail",
    ):
        assert line in conf
    # Slurm's backstop is above gpufleet's own bound: 20 + 2x5 + 30 + 5 + 3x5 = 80 s
    assert (
        slurm_hooks.bound_s(render.hook_config(spec(enabled=True, preflight=True)), "prolog") == 80
    )  # type: ignore[arg-type]
    assert "PrologEpilogTimeout=110" in conf
    assert "BatchStartTimeout=110" in conf  # Slurm's 10 s would requeue a slow prolog's job
    prolog = data["gpufleet-prolog"]
    assert prolog.startswith("#!/bin/sh\n")
    assert "exec /usr/local/bin/gpufleet health check --slurm prolog --timeout 20" in prolog
    assert "--preflight --preflight-timeout 30" in prolog
    assert "--preflight" not in data["gpufleet-epilog"]


def test_no_health_program_without_an_interval_and_bad_values_are_refused() -> None:
    conf = render.render_all(spec(enabled=True, healthIntervalSeconds=0), NODES)["slurm.conf"]
    assert "HealthCheckProgram" not in conf and "Prolog=/etc/slurm/gpufleet-prolog" in conf
    with pytest.raises(ValueError):
        spec(enabled=True, gpufleet="/bin/gpufleet\nPrologSlurmctld=/tmp/x")
    with pytest.raises(ValueError):
        spec(enabled=True, timeoutSeconds=0)


def test_slurmctld_is_reached_at_its_address_when_its_host_name_does_not_resolve() -> None:
    """A StatefulSet pod resolves as <pod>.<service>, not <pod>: slurmctld keeps checking
    its own host name, everyone else dials the address."""
    plain = crd.SlurmClusterSpec.model_validate({**BASE, "controllerHost": "s-0"})
    assert "SlurmctldHost=s-0" in render.render_all(plain, NODES)["slurm.conf"].splitlines()
    addressed = crd.SlurmClusterSpec.model_validate(
        {**BASE, "controllerHost": "s-0", "controllerAddress": "s-0.s"}
    )
    conf = render.render_all(addressed, NODES)["slurm.conf"].splitlines()
    assert "SlurmctldHost=s-0(s-0.s)" in conf
