"""The chart's backup slurmctld (``slurm.controller.backup``), as ``helm template`` renders it.

Two pods never on one node, one ReadWriteMany claim for the state, and the SlurmCluster the
chart renders turned into two ``SlurmctldHost`` lines by the operator's own renderer.
Slurm's failover itself runs on real daemons in ``test_slurm_failover.py``.
"""

from __future__ import annotations

import pytest
from test_chart_day2 import of_kind
from test_chart_quality import containers, render, render_fails

from gpufleet.api import slurmcluster as crd
from gpufleet.slurm import render as slurm_render

pytestmark = pytest.mark.integration


def test_the_chart_runs_a_backup_on_another_node_on_one_shared_state() -> None:
    docs = render("gpufleet", "--set", "slurm.controller.backup.enabled=true")
    name = "gpufleet-slurm-controller"
    sts = of_kind(docs, "StatefulSet")[name]
    pod = sts["spec"]["template"]["spec"]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == name
    # Never both on one node.
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    # One ReadWriteMany claim both pods mount as StateSaveLocation, no claim per pod.
    assert "volumeClaimTemplates" not in sts["spec"]
    (state,) = [v for v in pod["volumes"] if v["name"] == "state"]
    pvc = of_kind(docs, "PersistentVolumeClaim")[state["persistentVolumeClaim"]["claimName"]]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    mounts = {m["name"]: m["mountPath"] for m in containers(sts)[-2]["volumeMounts"]}
    assert mounts["state"] == "/var/spool/slurmctld"
    # The operator renders both pods as SlurmctldHost lines, in failover order.
    cluster = of_kind(docs, "SlurmCluster")["gpufleet"]
    spec = crd.SlurmClusterSpec.model_validate(cluster["spec"])
    node = slurm_render.NodeInfo("n0", {}, "10.0.0.1")
    pools = {p.name: [node] for p in spec.node_pools}
    conf = slurm_render.render_slurm_conf(spec, pools).splitlines()
    assert [line for line in conf if line.startswith("SlurmctldHost=")] == [
        f"SlurmctldHost={name}-0({name}-0.{name})",
        f"SlurmctldHost={name}-1({name}-1.{name})",
    ]
    assert "SlurmctldTimeout=120" in conf
    # Two replicas: a budget may now let one go at a time.
    docs = render(
        "gpufleet", "--set", "slurm.controller.backup.enabled=true",
        "--set", "slurm.controller.podDisruptionBudget.enabled=true",
        "--set", "slurm.controller.podDisruptionBudget.maxUnavailable=1",
    )  # fmt: skip
    assert of_kind(docs, "PodDisruptionBudget")[name]["spec"]["maxUnavailable"] == 1


def test_the_chart_keeps_one_controller_by_default_and_refuses_a_backup_without_a_pvc() -> None:
    docs = render("gpufleet")
    sts = of_kind(docs, "StatefulSet")["gpufleet-slurm-controller"]
    assert sts["spec"]["replicas"] == 1 and "affinity" not in sts["spec"]["template"]["spec"]
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["state"]
    assert "backupControllerHost" not in of_kind(docs, "SlurmCluster")["gpufleet"]["spec"]
    assert not of_kind(docs, "PersistentVolumeClaim")
    # An affinity of one's own is kept, and gains the anti-affinity.
    docs = render(
        "gpufleet", "--set", "slurm.controller.backup.enabled=true",
        "--set-json", 'slurm.controller.affinity={"nodeAffinity": {"x": 1}}',
    )  # fmt: skip
    affinity = of_kind(docs, "StatefulSet")["gpufleet-slurm-controller"]["spec"]["template"][
        "spec"
    ]["affinity"]
    assert set(affinity) == {"nodeAffinity", "podAntiAffinity"}
    err = render_fails(
        "--set", "slurm.controller.backup.enabled=true",
        "--set", "slurm.controller.persistence.enabled=false",
    )  # fmt: skip
    assert "needs slurm.controller.persistence.enabled" in err
