"""Reading one gpufleet workload out of the rendered chart, for the modules that check a
component's objects (test_chart_pod_scheduler.py, test_chart_tenants.py): its objects, a
container, the rules its ClusterRole grants, the flags its container passes (and whether the
command takes them), and the hardening every gpufleet workload has."""

from __future__ import annotations

from typing import Any

from test_chart_quality import containers, key

from gpufleet.cli.main import command_tree


def objects_of(docs: list[dict[str, Any]], word: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The objects whose kind, namespace or name holds ``word``, by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in docs if word in str(key(d))}


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(deployment) if c["name"] == name)


def granted(cluster_role: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """Every (apiGroup, resource, verb, resourceNames joined) the role grants."""
    return {
        (group, resource, verb, ",".join(rule.get("resourceNames", [])))
        for rule in cluster_role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` (or ``--name``: "") of a container's args after the command."""
    out: dict[str, str] = {}
    for a in args[1:]:
        name, _, value = a.partition("=")
        out[name] = value
    return out


def unknown_flags(command: str, passed: set[str]) -> set[str]:
    """The flags of ``passed`` that `gpufleet <command>` does not take."""
    params = command_tree().commands[command].params
    known = {o for p in params for o in (*getattr(p, "opts", ()), *p.secondary_opts)}
    return passed - known


def assert_hardened(c: dict[str, Any], port: int) -> None:
    """Non-root, read-only root, no privilege, every probe on /metrics, its metrics port."""
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert c["resources"]["limits"]["memory"]
    assert c["ports"] == [{"name": "metrics", "containerPort": port}]
