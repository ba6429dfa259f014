"""The CLI against a real apiserver chosen by kubeconfig context, as kubectl chooses it,
and the kubectl plugin form.

The kubeconfig has two contexts: ``wrong`` (the current one, a closed loopback port)
and ``local`` (this session's cluster). The commands run as a user runs them (the
installed console scripts, in subprocesses); kubectl is the cluster's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.kubeapi import contexts
from gpufleet.lifecycle.operator import context_login

BIN = Path(sys.executable).parent
GPUFLEET = BIN / "gpufleet"


@pytest.fixture(scope="module")
def kubeconfig(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local cluster's kubeconfig with a second, wrong context made current."""
    config = yaml.safe_load(Path(local_cluster.kubeconfig).read_text())
    current = config["current-context"]
    local = next(c["context"] for c in config["contexts"] if c["name"] == current)
    good = next(c["cluster"] for c in config["clusters"] if c["name"] == local["cluster"])
    config["clusters"].append(
        {"name": "wrong", "cluster": {**good, "server": "https://127.0.0.1:1"}}
    )
    config["contexts"] = [
        {"name": "local", "context": local},
        {"name": "wrong", "context": {**local, "cluster": "wrong"}},
    ]
    config["current-context"] = "wrong"
    path = tmp_path_factory.mktemp("cli-context") / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", contexts.ENV)}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def run(*argv: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=60, env=_env(**env)
    )


def test_the_current_context_is_the_wrong_one(kubeconfig: Path) -> None:
    r = run(GPUFLEET, "nodes", "--kubeconfig", kubeconfig)
    assert r.returncode == 3, r.stderr
    assert "127.0.0.1:1" in r.stderr and "--context" in r.stderr


def test_context_by_flag_reads_the_cluster(kubeconfig: Path, local_cluster: Any) -> None:
    r = run(GPUFLEET, "nodes", "--kubeconfig", kubeconfig, "--context", "local", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert set(local_cluster.node_names) <= {n["name"] for n in json.loads(r.stdout)["nodes"]}


def test_status_of_any_cluster_by_kubeconfig_environment(
    kubeconfig: Path, local_cluster: Any
) -> None:
    """KUBECONFIG and GPUFLEET_CONTEXT alone; the same counts as the local cluster's
    own status screen (read by its admin token)."""
    r = run(GPUFLEET, "status", "-o", "json", KUBECONFIG=str(kubeconfig), GPUFLEET_CONTEXT="local")
    assert r.returncode == 0, r.stderr
    remote = json.loads(r.stdout)
    assert sum(remote["nodesByState"].values()) >= len(local_cluster.node_names)
    r = run(GPUFLEET, "status", "--run-dir", local_cluster.run_dir, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert sum(json.loads(r.stdout)["nodesByState"].values()) == sum(
        remote["nodesByState"].values()
    )


def test_the_controllers_login_follows_the_context(
    kubeconfig: Path, local_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf's own kubeconfig login would read the current (wrong) context."""
    monkeypatch.setenv(contexts.ENV, "local")
    info = asyncio.run(context_login(str(kubeconfig)))
    assert info.server == local_cluster.apiserver_url
    assert info.token == local_cluster.token or info.certificate_path is not None


def test_kubectl_finds_and_runs_the_plugin(kubeconfig: Path, local_cluster: Any) -> None:
    kubectl = local_cluster.kubectl
    listed = run(kubectl, "plugin", "list")
    assert str(BIN / "kubectl-gpufleet") in listed.stdout, listed.stdout + listed.stderr
    version = run(kubectl, "gpufleet", "version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("gpufleet ")
    usage = run(kubectl, "gpufleet", "--help")
    assert "Usage: kubectl gpufleet" in usage.stdout
    nodes = run(
        kubectl, "gpufleet", "nodes", "--kubeconfig", kubeconfig, "--context", "local", "-o", "json"
    )
    assert nodes.returncode == 0, nodes.stderr
    assert set(local_cluster.node_names) <= {n["name"] for n in json.loads(nodes.stdout)["nodes"]}


def test_kubectl_completes_the_plugins_commands(local_cluster: Any) -> None:
    """kubectl (1.26+) asks kubectl_complete-gpufleet for ``kubectl gpufleet <TAB>``."""
    r = run(local_cluster.kubectl, "__complete", "gpufleet", "po")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split("\t")[0] == "policy"
    assert r.stdout.splitlines()[-1] == ":4"  # no file names
    r = run(local_cluster.kubectl, "__complete", "gpufleet", "nodes", "--con")
    assert "--context" in r.stdout
