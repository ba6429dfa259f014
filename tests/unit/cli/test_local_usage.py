"""What ``gpufleet local up`` prints when the cluster is ready: an operator copies the
chart's values from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli import local_cmd
from gpufleet.local import cluster as local_cluster
from gpufleet.local.accounting import DatabaseEndpoint
from gpufleet.local.cluster import ClusterInfo


def info(tmp_path: Path, **extra: object) -> ClusterInfo:
    return ClusterInfo(
        run_dir=tmp_path,
        node_names=["gpu-node-0001"],
        gpus_per_node=8,
        kubeconfig=tmp_path / "kubeconfig",
        apiserver_url="https://127.0.0.1:6443",
        token="t",
        ca_file=tmp_path / "ca.crt",
        etcd_url="http://127.0.0.1:2379",
        **extra,  # type: ignore[arg-type]
    )


DB = DatabaseEndpoint(
    host="127.0.0.1", port=33061, user="slurm", password_file="/run/db.pw",
    machines_host="10.0.2.100",
)  # fmt: skip


def test_the_database_for_the_charts_slurmdbd_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_cmd._print_usage(info(tmp_path, slurm_accounting=True, accounting_db=DB), "")
    out = capsys.readouterr().out
    assert "MariaDB at 10.0.2.100:33061 from the machines (user slurm, password in /run/db.pw)" in (
        out
    )


def test_no_database_line_when_slurmdbd_runs_on_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_cmd._print_usage(
        info(tmp_path, slurm_conf=tmp_path / "slurm.conf", slurm_accounting=True, accounting_db=DB),
        "",
    )
    out = capsys.readouterr().out
    assert "with accounting (slurmdbd, MariaDB: sacct)" in out
    assert "10.0.2.100" not in out


def test_machine_pools_and_vcpus_are_parsed_and_a_bad_one_is_named() -> None:
    import typer

    assert local_cmd._machine_pools("system, machines") == ("system", "machines")
    assert local_cmd._machine_pools("") == ()
    with pytest.raises(typer.BadParameter, match="'Sys_tem' is not a pool name"):
        local_cmd._machine_pools("Sys_tem")
    assert local_cmd._machine_cpus("2,1") == (2, 1)
    with pytest.raises(typer.BadParameter, match="1 to 4"):
        local_cmd._machine_cpus("8")


def test_local_up_hands_its_machine_options_to_the_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every machine option reaches the ClusterSpec (``--machine-pools`` once was parsed and
    dropped); the cluster's start is where it stops here."""
    from typer.testing import CliRunner

    from gpufleet.cli.main import app
    from gpufleet.local.processes import ComponentError

    seen = []

    class Stop(local_cluster.LocalCluster):
        def start(self) -> ClusterInfo:
            seen.append(self.spec)
            raise ComponentError("host-node", None, "stopped by the test")

    monkeypatch.setattr(local_cluster, "LocalCluster", Stop)
    result = CliRunner().invoke(
        app,
        ["local", "up", "--run-dir", str(tmp_path), "--no-slurm", "--machines", "2",
         "--machine-pools", "system", "--machine-cpus", "2", "--images", "--host-node",
         "--no-machine-agent", "--no-image-seed"],
    )  # fmt: skip
    assert result.exit_code == 1 and "stopped by the test" in result.output, result.output
    (spec,) = seen
    assert spec.machines == 2 and spec.machine_pools == ("system",)
    assert spec.machine_cpus == (2,) and spec.images and spec.host_node
    assert not spec.machine_agent and not spec.image_seed and not spec.slurm
    seen.clear()
    result = CliRunner().invoke(
        app,
        ["local", "up", "--run-dir", str(tmp_path), "--slurm", "24.11", "--slurm-backup",
         "--slurmctld-timeout", "5"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    (spec,) = seen
    assert spec.slurm and spec.slurm_version == "24.11"
    assert spec.slurm_backup and spec.slurmctld_timeout_s == 5
    seen.clear()
    result = CliRunner().invoke(
        app,
        ["local", "up", "--run-dir", str(tmp_path), "--nvl72-domains", "2",
         "--trays-per-domain", "4"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    (spec,) = seen
    assert spec.nvl72_domains == 2 and spec.trays_per_domain == 4
    assert spec.nodes == 8  # raised from the default 4 to hold every tray


def test_the_host_node_and_where_its_logs_are_are_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_cmd._print_usage(info(tmp_path, host_node="host-node-0000"), "")
    out = capsys.readouterr().out
    assert "host node:   host-node-0000 (pool system, on this host)" in out
    assert str(tmp_path / "host-node" / "logs") in out
    local_cmd._print_usage(info(tmp_path), "")
    assert "host node" not in capsys.readouterr().out


def test_local_up_runs_the_pod_scheduler_with_slurm_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpufleet local up` starts the pod scheduler beside Slurm (a Pod with schedulerName
    gpufleet-slurm is Slurm's); a test that runs its own asks for none."""
    from typer.testing import CliRunner

    from gpufleet.cli.main import app
    from gpufleet.local.processes import ComponentError

    seen = []

    class Stop(local_cluster.LocalCluster):
        def start(self) -> ClusterInfo:
            seen.append(self.spec.pod_scheduler)
            raise ComponentError("slurmctld", None, "stopped by the test")

    monkeypatch.setattr(local_cluster, "LocalCluster", Stop)
    for extra in ([], ["--no-pod-scheduler"], ["--no-slurm"]):
        result = CliRunner().invoke(app, ["local", "up", "--run-dir", str(tmp_path), *extra])
        assert result.exit_code == 1, result.output
    assert seen == [True, False, False]
    assert not local_cluster.ClusterSpec().pod_scheduler  # the tests' and the demo's clusters
    url = "http://127.0.0.1:1/metrics"
    local_cmd._print_usage(info(tmp_path, pod_scheduler_metrics_url=url), "")
    out = capsys.readouterr().out
    assert "schedulerName gpufleet-slurm -> one Slurm job per pod group" in out
    assert str(tmp_path / "logs" / "pod-scheduler.log") in out
