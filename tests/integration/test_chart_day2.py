"""The chart's day-2 objects: alerts (a PrometheusRule, checked and unit-tested with
promtool), the Grafana dashboard as a sidecar ConfigMap, PodDisruptionBudgets, spreading of
the controller replicas, the agent on the NVIDIA container runtime, and the log format.

Rendering needs helm (scripts/build-helm.sh), the alert tests promtool
(scripts/build-promtool.sh); one strict server-side dry run uses the session's apiserver.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart_quality import NS, containers, helm, key, render
from test_slurm_chart import CHART, run

from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ALERT_TESTS = ROOT / "tests" / "fixtures" / "alerts" / "gpufleet.test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpufleet-dashboard.json"
RULES_ON = ("--set", "metrics.prometheusRule.enabled=true")


def promtool() -> str:
    cache = Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet")) / "bin"
    found = sorted(cache.glob("promtool-*/promtool"), reverse=True)
    path = str(found[0]) if found else shutil.which("promtool")
    assert path, "promtool is not built: run scripts/build-promtool.sh (scripts/test does)"
    return path


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def alert_rules(*extra: str, release: str = "gpufleet") -> list[dict[str, Any]]:
    (rule,) = of_kind(render(release, *RULES_ON, *extra), "PrometheusRule").values()
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


# -- alerts ----------------------------------------------------------------------------


def test_alerts_pass_promtool_check_and_fire_only_when_they_should(tmp_path: Path) -> None:
    """`promtool check rules` on the rendered groups (PromQL, durations, annotation
    templates), then `promtool test rules` on tests/fixtures/alerts: each alert fires on the
    series that call for it, and not on a standby replica's, another release's or a
    healthy component's."""
    selector = ("--set-string", 'metrics.prometheusRule.selector=namespace="gpufleet"')
    (rule,) = of_kind(render("gpufleet", *RULES_ON, *selector), "PrometheusRule").values()
    groups = rule["spec"]["groups"]
    checked = tmp_path / "checked.yaml"
    checked.write_text(yaml.safe_dump({"groups": groups}))
    out = run(promtool(), "check", "rules", str(checked))
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in out, out
    # The unit tests compare every annotation: they get the summaries, which carry the
    # alert's labels; descriptions and runbooks are checked below.
    for g in groups:
        for r in g["rules"]:
            r["annotations"] = {"summary": r["annotations"]["summary"]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    r = subprocess.run(
        [promtool(), "test", "rules", ALERT_TESTS.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def _anchors(markdown: str) -> set[str]:
    """The anchors of the page's headings (GitHub's and mkdocs' slugs agree on these)."""
    return {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,4} (.+)$", markdown, flags=re.M)
    }


def test_every_alert_has_a_severity_a_text_a_runbook_and_promtool_cases() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    anchors = _anchors(OPERATIONS.read_text())
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired = {c["alertname"] for t in cases for c in t["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for t in cases for c in t["alert_rule_test"] if not c["exp_alerts"]}
    page = "https://github.com/gpufleet/gpufleet/blob/main/docs/operations.md"
    for r in rules:
        name, notes = r["alert"], r["annotations"]
        assert r["labels"]["severity"] in ("critical", "warning"), name
        assert notes["summary"] and len(notes["description"]) > len(notes["summary"]), name
        assert notes["runbook_url"] == f"{page}#{name.lower()}", name
        assert name.lower() in anchors, f"docs/operations.md has no section {name}"
        assert name in fired and name in quiet, f"{name}: no promtool case firing and quiet"
    # What operators page on: the breaker, held faults, a controller that does not act,
    # silent agents, Slurm out of step.
    assert {
        "GpufleetBreakerOpen", "GpufleetFaultsWaiting", "GpufleetControllerNotActing",
        "GpufleetControllerNotTicking", "GpufleetAgentDown", "GpufleetAgentsMissing",
        "GpufleetSlurmUnreachable", "GpufleetSlurmSyncLag",
    } <= set(names)  # fmt: skip


def test_alerts_select_series_labels_and_components_from_values() -> None:
    rules = alert_rules(
        "--set-string", 'metrics.prometheusRule.selector=cluster="a"',
        "--set", "metrics.prometheusRule.alertLabels.team=gpu-platform",
        "--set", "metrics.prometheusRule.runbookUrl=https://runbooks.example/gpufleet",
    )  # fmt: skip
    for r in rules:
        assert 'cluster="a"' in r["expr"] and "namespace=" not in r["expr"], r["alert"]
        assert r["labels"]["team"] == "gpu-platform", r["alert"]
        assert r["annotations"]["runbook_url"].startswith("https://runbooks.example/gpufleet#")
    # By default a release's alerts read its own namespace's series, and its agents' job:
    # the name of the Service the agents' ServiceMonitor scrapes (no jobLabel is set).
    by_name = {r["alert"]: r for r in alert_rules(release="beta")}
    assert f'namespace="{NS}"' in by_name["GpufleetBreakerOpen"]["expr"]
    docs = render("beta", "--set", "metrics.serviceMonitor.enabled=true")
    monitor = of_kind(docs, "ServiceMonitor")["beta-gpufleet-agent"]
    assert "jobLabel" not in monitor["spec"]
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    (service,) = [
        s for s in of_kind(docs, "Service").values() if wanted <= s["metadata"]["labels"].items()
    ]
    assert f'job="{service["metadata"]["name"]}"' in by_name["GpufleetAgentDown"]["expr"]
    # Alerts only for the components the release runs.
    names = {r["alert"] for r in alert_rules("--set", "syncer.enabled=false")}
    assert "GpufleetBreakerOpen" in names
    assert not {n for n in names if "Slurm" in n or "Syncer" in n}
    no_controller = (
        *("--set", "controller.enabled=false"),
        *("--set", "slurm.munge.secretRef=m", "--set", "slurm.jwt.secretRef=j"),
    )
    names = {r["alert"] for r in alert_rules(*no_controller)}
    assert "GpufleetAgentDown" in names
    assert not {"GpufleetBreakerOpen", "GpufleetAgentsMissing", "GpufleetControllerDown"} & names
    labelled = render("gpufleet", *RULES_ON, "--set", "metrics.prometheusRule.labels.release=prom")
    (rule,) = of_kind(labelled, "PrometheusRule").values()
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert not of_kind(render("gpufleet"), "PrometheusRule")


# -- the dashboard -----------------------------------------------------------------------


def test_dashboard_configmap_for_the_grafana_sidecar() -> None:
    assert not of_kind(render("gpufleet"), "ConfigMap").get("gpufleet-dashboard")
    cm = of_kind(render("gpufleet", "--set", "metrics.grafanaDashboard.enabled=true"), "ConfigMap")[
        "gpufleet-dashboard"
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NS and "annotations" not in cm["metadata"]
    # The file an operator imports by hand and the one the chart ships are one.
    assert json.loads(cm["data"]["gpufleet.json"]) == json.loads(DASHBOARD.read_text())
    cm = of_kind(
        render(
            "gpufleet", "--set", "metrics.grafanaDashboard.enabled=true",
            "--set", "metrics.grafanaDashboard.namespace=monitoring",
            "--set", "metrics.grafanaDashboard.label=dashboards",
            "--set-string", "metrics.grafanaDashboard.labelValue=gpufleet",
            "--set", "metrics.grafanaDashboard.folder=GPU fleet",
        ),
        "ConfigMap",
    )["gpufleet-dashboard"]  # fmt: skip
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["dashboards"] == "gpufleet"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU fleet"}


# -- disruptions and spreading ------------------------------------------------------------


def test_disruption_budgets_hold_replicated_and_singleton_control_pods() -> None:
    docs = render("gpufleet")
    pdbs = of_kind(docs, "PodDisruptionBudget")
    assert set(pdbs) == {"gpufleet-controller"}  # login and slurmrestd: one replica each
    ctl = of_kind(docs, "Deployment")["gpufleet-controller"]
    assert pdbs["gpufleet-controller"]["spec"]["selector"] == ctl["spec"]["selector"]
    assert pdbs["gpufleet-controller"]["spec"]["maxUnavailable"] == 1
    assert pdbs["gpufleet-controller"]["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # A budget that would let every replica go says nothing.
    assert not of_kind(render("gpufleet", "--set", "controller.replicas=1"), "PodDisruptionBudget")
    docs = render(
        "gpufleet", "--set", "slurm.login.replicas=3", "--set", "slurm.restd.replicas=2",
        "--set", "slurm.controller.podDisruptionBudget.enabled=true",
        "--set", "controller.podDisruptionBudget.enabled=false",
    )  # fmt: skip
    pdbs = of_kind(docs, "PodDisruptionBudget")
    assert set(pdbs) == {"gpufleet-slurm-login", "gpufleet-slurm-rest", "gpufleet-slurm-controller"}
    workloads = {**of_kind(docs, "Deployment"), **of_kind(docs, "StatefulSet")}
    for name, pdb in pdbs.items():
        assert pdb["spec"]["selector"] == workloads[name]["spec"]["selector"], name
    assert pdbs["gpufleet-slurm-controller"]["spec"]["maxUnavailable"] == 0
    # slurmctld is kept from autoscalers' consolidation by default, and can be let go.
    sts = of_kind(render("gpufleet"), "StatefulSet")["gpufleet-slurm-controller"]
    assert sts["spec"]["template"]["metadata"]["annotations"] == {
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
        "karpenter.sh/do-not-disrupt": "true",
    }
    sts = of_kind(render("gpufleet", "--set", "slurm.controller.doNotDisrupt=false"), "StatefulSet")
    assert "annotations" not in sts["gpufleet-slurm-controller"]["spec"]["template"]["metadata"]


def _spread(*extra: str) -> list[dict[str, Any]]:
    ctl = of_kind(render("gpufleet", *extra), "Deployment")["gpufleet-controller"]
    spread: list[dict[str, Any]] = ctl["spec"]["template"]["spec"].get(
        "topologySpreadConstraints", []
    )
    return spread


def test_controller_replicas_spread_soft_by_default_hard_or_not_at_all() -> None:
    soft = _spread()
    assert [(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"]) for c in soft] == [
        ("kubernetes.io/hostname", "ScheduleAnyway", 1),
        ("topology.kubernetes.io/zone", "ScheduleAnyway", 1),
    ]
    ctl = of_kind(render("gpufleet"), "Deployment")["gpufleet-controller"]
    assert soft[0]["labelSelector"]["matchLabels"] == ctl["spec"]["selector"]["matchLabels"]
    hard = _spread(
        "--set", "controller.spread.whenUnsatisfiable=DoNotSchedule",
        "--set", "controller.spread.topologyKeys={kubernetes.io/hostname}",
    )  # fmt: skip
    assert [(c["topologyKey"], c["whenUnsatisfiable"]) for c in hard] == [
        ("kubernetes.io/hostname", "DoNotSchedule")
    ]
    assert _spread("--set-json", "controller.spread.topologyKeys=[]") == []


# -- the agent on a GPU node, the log format ---------------------------------------------------


def _agent(*extra: str) -> dict[str, Any]:
    ds: dict[str, Any] = of_kind(render("gpufleet", *extra), "DaemonSet")["gpufleet-agent"]
    return ds


def test_agent_gets_the_nvidia_runtime_and_every_gpu() -> None:
    spec = _agent()["spec"]["template"]["spec"]
    assert "runtimeClassName" not in spec
    env = {e["name"]: e.get("value") for e in containers(_agent())[0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # It asks the scheduler for no GPU: it watches them, jobs use them.
    assert "nvidia.com/gpu" not in json.dumps(containers(_agent())[0]["resources"])
    ds = _agent("--set", "agent.runtimeClassName=nvidia")
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    env = {e["name"] for e in containers(_agent("--set", "agent.backend=simulated"))[0]["env"]}
    assert not {n for n in env if n.startswith("NVIDIA_")}
    # Its own image (the GPU variant), the tag following image.tag; the others keep image.
    assert containers(_agent())[0]["image"] == "ghcr.io/gpufleet/gpufleet:" + _app_version()
    gpu = ("--set", "agent.image.repository=r.example/gpufleet-gpu", "--set", "image.tag=1.2.3")
    docs = render("gpufleet", *gpu)
    assert containers(of_kind(docs, "DaemonSet")["gpufleet-agent"])[0]["image"] == (
        "r.example/gpufleet-gpu:1.2.3"
    )
    ctl = of_kind(docs, "Deployment")["gpufleet-controller"]
    assert containers(ctl)[0]["image"] == "ghcr.io/gpufleet/gpufleet:1.2.3"


def _app_version() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return str(chart["appVersion"])


GPUFLEET_PROCESSES = {"controller", "agent", "syncer", "operator", "cleanup"}


def test_log_format_reaches_every_gpufleet_process() -> None:
    for fmt in ("text", "json"):
        docs = render("gpufleet", "--set", f"logFormat={fmt}")
        seen = set()
        for d in docs:
            if d["kind"] not in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
                continue
            for c in containers(d):
                if c["name"] in GPUFLEET_PROCESSES:
                    env = {e["name"]: e.get("value") for e in c.get("env", [])}
                    assert env.get("GPUFLEET_LOG_FORMAT") == fmt, (key(d), c["name"])
                    seen.add(c["name"])
        assert seen == GPUFLEET_PROCESSES
    assert "values don't meet" in subprocess.run(
        [helm(), "template", "g", str(CHART), "--set", "logFormat=xml"],
        capture_output=True, text=True, timeout=120,
    ).stderr  # fmt: skip


# -- all of it, as Kubernetes takes it -------------------------------------------------------

DAY2 = (
    *("--set", "metrics.prometheusRule.enabled=true"),
    *("--set", "metrics.grafanaDashboard.enabled=true"),
    *("--set", "slurm.controller.podDisruptionBudget.enabled=true"),
    *("--set", "slurm.login.replicas=2", "--set", "slurm.restd.replicas=2"),
    *("--set", "controller.spread.whenUnsatisfiable=DoNotSchedule"),
    *("--set", "agent.runtimeClassName=nvidia", "--set", "logFormat=json"),
)


def test_day2_objects_pass_lint_strict_and_a_strict_server_dry_run(
    local_cluster: ClusterInfo,
) -> None:
    run(helm(), "lint", str(CHART), "--strict", *DAY2)
    docs = render("gpufleet", *DAY2)
    wanted = {"PodDisruptionBudget", "ConfigMap", "Deployment", "DaemonSet", "StatefulSet"}
    objs = [d for d in docs if d["kind"] in wanted]
    assert len(of_kind(objs, "PodDisruptionBudget")) == 4
    kubectl, env = str(local_cluster.kubectl), local_cluster.kube_env()
    ns = f"{NS}-day2"
    for d in objs:
        d["metadata"]["namespace"] = ns
    subprocess.run([kubectl, "create", "namespace", ns], env=env, capture_output=True)
    try:
        out = run(
            kubectl, "apply", "--dry-run=server", "--validate=strict", "-f", "-",
            env=env, stdin=yaml.safe_dump_all(objs),
        )  # fmt: skip
    finally:
        subprocess.run(
            [kubectl, "delete", "namespace", ns, "--wait=false"], env=env, capture_output=True
        )
    assert out.count("(server dry run)") == len(objs), out
