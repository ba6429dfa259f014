"""No SlurmCluster field and no Node value can add a directive to slurm.conf or gres.conf.

Two layers, each tested on its own: the spec model (whose patterns are the
CRD's, so the apiserver refuses the same objects; the integration test
tests/integration/test_security_rbac.py shows it does) and the renderer, which
refuses a value even when the model was bypassed (``model_construct``) or the
value comes from a Node.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpufleet.api import slurmcluster as crd
from gpufleet.slurm import render

INJECTIONS = [
    "h100\nPrologSlurmctld=/tmp/evil",
    "h100\rPrologSlurmctld=/tmp/evil",
    "h100 PrologSlurmctld=/tmp/evil",
    "h100\tx=y",
    "h100#comment",
    "h100=x",
    "h100\x00",
    "h100\x1b[31m",
    "h100\n",  # a pattern ending in '$' must not accept a trailing newline
    "",
]

BASE: dict[str, Any] = {
    "nodePools": [{"name": "gpu", "nodeSelector": {"gpu": "true"}, "gpuType": "h100"}],
    "partitions": [{"name": "batch", "pools": ["gpu"], "default": True}],
}
NODES = [render.NodeInfo("n0", {"gpu": "true"}, "10.0.0.1")]


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    spec = yaml.safe_load(yaml.safe_dump(BASE))
    target = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return spec


SPEC_FIELDS: list[tuple[tuple[str | int, ...], bool]] = [
    # (path, is the value a one-element list)
    (("nodePools", 0, "gpuType"), False),
    (("nodePools", 0, "gpuFiles"), False),
    (("nodePools", 0, "features"), True),
    (("nodePools", 0, "featureLabels"), True),
    (("partitions", 0, "maxTime"), False),
    (("controllerHost",), False),
    (("clusterName",), False),
]


@pytest.mark.parametrize("bad", INJECTIONS)
@pytest.mark.parametrize(("path", "listed"), SPEC_FIELDS)
def test_the_model_and_so_the_crd_refuse_injected_values(
    path: tuple[str | int, ...], listed: bool, bad: str
) -> None:
    with pytest.raises(ValidationError):
        crd.SlurmClusterSpec.model_validate(_with(path, [bad] if listed else bad))


@pytest.mark.parametrize("bad", ["PrologSlurmctld=/a\nEpilog=/b", "Foo=1\r", "Foo=\x00", "x\x7f"])
def test_extra_config_lines_are_single_lines(bad: str) -> None:
    with pytest.raises(ValidationError):
        crd.SlurmClusterSpec.model_validate({**BASE, "extraConfig": [bad]})


def test_ordinary_values_still_pass() -> None:
    spec = crd.SlurmClusterSpec.model_validate(
        {
            **BASE,
            "controllerHost": "slurm-controller-0.slurm.gpufleet.svc",
            "nodePools": [
                {
                    "name": "gpu",
                    "gpuType": "h100_80gb",
                    "gpuFiles": "/dev/nvidia[0-3,5]",
                    "features": ["ib", "nvlink.v4"],
                    "featureLabels": ["nvidia.com/gpu.product", "zone"],
                }
            ],
            "partitions": [{"name": "batch", "pools": ["gpu"], "maxTime": "1-00:00:00"}],
            "accounting": {"enabled": True, "host": "fd00::10"},
            "extraConfig": ["SchedulerParameters=bf_continue,bf_max_job_test=500 # tuned"],
        }
    )
    data = render.render_all(spec, NODES)
    assert "Gres=gpu:h100_80gb:8 Feature=ib,nvlink.v4" in data["slurm.conf"]
    assert "AccountingStorageHost=fd00::10" in data["slurm.conf"]
    assert data["slurm.conf"].endswith(
        "SchedulerParameters=bf_continue,bf_max_job_test=500 # tuned\n"
    )
    assert "Type=h100_80gb File=/dev/nvidia[0-3,5]" in data["gres.conf"]


def _bypassed(field: str, value: Any, *, pool: bool = True) -> crd.SlurmClusterSpec:
    """A spec holding ``value`` although the model would refuse it (as a hand-built or
    stale object could): the renderer must not trust the model."""
    spec = crd.SlurmClusterSpec.model_validate(BASE)
    if pool:
        bad_pool = spec.node_pools[0].model_copy(update={field: value})
        return spec.model_copy(update={"node_pools": [bad_pool]})
    return spec.model_copy(update={field: value})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_bypassed("gpu_type", "h100\nPrologSlurmctld=/tmp/evil"), "spec.nodePools['gpu'].gpuType"),
        (_bypassed("features", ["ib\nPrologSlurmctld=/x"]), "spec.nodePools['gpu'].features"),
        (_bypassed("gpu_files", "/dev/nvidia0 Flags=x"), "spec.nodePools['gpu'].gpuFiles"),
        (_bypassed("controller_host", "c0\nSlurmctldHost=evil", pool=False), "spec.controllerHost"),
        (
            _bypassed("backup_controller_host", "c1\nSlurmctldHost=evil", pool=False),
            "spec.backupControllerHost",
        ),
        (_bypassed("extra_config", ["A=1\nPrologSlurmctld=/x"], pool=False), "spec.extraConfig[0]"),
    ],
)
def test_renderer_refuses_unsafe_spec_values_naming_the_field(
    spec: crd.SlurmClusterSpec, field: str
) -> None:
    with pytest.raises(render.UnsafeValue) as caught:
        render.render_all(spec, NODES)
    assert caught.value.field == field
    assert str(caught.value).startswith(field + "=")


def test_renderer_says_what_the_character_would_do() -> None:
    with pytest.raises(render.UnsafeValue, match="line break, which would start a new directive"):
        render.render_all(_bypassed("gpu_type", "h100\nX=1"), NODES)
    with pytest.raises(render.UnsafeValue, match="whitespace, which would start a new key=value"):
        render.render_all(_bypassed("gpu_type", "h100 X=1"), NODES)
    with pytest.raises(render.UnsafeValue, match="'#', which starts a comment"):
        render.render_all(_bypassed("gpu_type", "h100#"), NODES)
    with pytest.raises(render.UnsafeValue, match="control character U\\+001B"):
        render.render_all(_bypassed("gpu_type", "h100\x1b"), NODES)


@pytest.mark.parametrize(
    ("node", "field"),
    [
        (
            render.NodeInfo("n0", {"gpu": "true"}, "10.0.0.1\nPrologSlurmctld=/x"),
            "Node 'n0' status.addresses InternalIP",
        ),
        (render.NodeInfo("n0 Weight=1", {"gpu": "true"}), "Node 'n0 Weight=1' name"),
    ],
)
def test_renderer_refuses_unsafe_node_values(node: render.NodeInfo, field: str) -> None:
    spec = crd.SlurmClusterSpec.model_validate(BASE)
    with pytest.raises(render.UnsafeValue) as caught:
        render.render_all(spec, [node])
    assert caught.value.field == field


def test_an_unsafe_topology_label_is_left_out_and_reported_not_rendered() -> None:
    """A topology label is read by the one codec (domain.topology): a value that is no
    switch name never reaches topology.conf, the rest of the config is rendered, and the
    node's problem says which label was refused."""
    spec = crd.SlurmClusterSpec.model_validate(BASE)
    key = "network.topology.kubernetes.io/block"
    node = render.NodeInfo("n0", {"gpu": "true", key: "l0\nSwitchName=x"})
    data = render.render_all(spec, [node])
    assert "SwitchName" not in data["topology.conf"]
    (problem,) = render.fabric_of(spec, [node]).problems
    assert problem.node == "n0" and key in problem.message


def test_feature_label_values_are_made_safe_not_refused() -> None:
    """Label values are the operator's input, not the user's: they are sanitized (as before)."""
    spec = crd.SlurmClusterSpec.model_validate(
        _with(("nodePools", 0, "featureLabels"), ["nvidia.com/gpu.product"])
    )
    node = render.NodeInfo("n0", {"gpu": "true", "nvidia.com/gpu.product": "H100 SXM"})
    assert "Feature=H100_SXM " in render.render_all(spec, [node])["slurm.conf"]


def test_every_rendered_line_is_one_directive() -> None:
    """With all fields at their richest, every line of every file parses as key=value words."""
    spec = crd.SlurmClusterSpec.model_validate(
        {**BASE, "accounting": {"enabled": True}, "extraConfig": ["MaxJobCount=100000"]}
    )
    for text in render.render_all(spec, NODES).values():
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            for word in line.split(" "):
                key, sep, _ = word.partition("=")
                assert sep and key.isalpha(), (line, word)
