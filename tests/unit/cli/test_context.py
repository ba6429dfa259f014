"""``--context`` as kubectl's: every command that takes ``--kubeconfig`` takes it, and
the context chosen (by flag or ``GPUFLEET_CONTEXT``) is the one every reader of the
kubeconfig in the process uses. The two contexts here point at closed loopback ports,
so which one was used shows in the error's address (the real apiserver:
tests/integration/test_cli_context.py)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli import operator_cmd
from gpufleet.cli.main import app, command_tree
from gpufleet.kubeapi import contexts
from gpufleet.local import pki
from gpufleet.provision import cluster

runner = CliRunner()


def _walk(cmd: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    found = [(path, cmd)]
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        found += _walk(sub, [*path, name])
    return found


def _opts(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in getattr(p, "opts", ())}


@pytest.fixture(autouse=True)
def no_context_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """--context writes the process's environment: put it back after each test."""
    monkeypatch.setenv(contexts.ENV, "")


@pytest.fixture
def two_contexts(tmp_path: Path) -> Path:
    ca = base64.b64encode(pki.pem(pki.new_ca("test-ca")[0])).decode()
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "east",
                "clusters": [
                    {
                        "name": "east",
                        "cluster": {
                            "server": "https://127.0.0.1:1",
                            "certificate-authority-data": ca,
                        },
                    },
                    {
                        "name": "west",
                        "cluster": {
                            "server": "https://127.0.0.1:2",
                            "certificate-authority-data": ca,
                        },
                    },
                ],
                "users": [
                    {"name": "alice", "user": {"token": "a"}},
                    {"name": "bob", "user": {"token": "b"}},
                ],
                "contexts": [
                    {"name": "east", "context": {"cluster": "east", "user": "alice"}},
                    {"name": "west", "context": {"cluster": "west", "user": "bob"}},
                ],
            }
        )
    )
    return path


def test_every_command_that_takes_a_kubeconfig_takes_a_context() -> None:
    with_kubeconfig = [p for p, c in _walk(command_tree(), []) if "--kubeconfig" in _opts(c)]
    assert ["nodes"] in with_kubeconfig and ["status"] in with_kubeconfig
    assert ["controller"] in with_kubeconfig and ["agent"] in with_kubeconfig
    missing = [
        " ".join(p)
        for p, c in _walk(command_tree(), [])
        if "--kubeconfig" in _opts(c) and "--context" not in _opts(c)
    ]
    assert not missing, f"commands with --kubeconfig but no --context: {missing}"


def test_the_current_context_is_used_unless_one_is_named(two_contexts: Path) -> None:
    r = runner.invoke(app, ["nodes", "--kubeconfig", str(two_contexts)])
    assert r.exit_code == 3, r.output
    assert "127.0.0.1:1" in r.output
    r = runner.invoke(app, ["nodes", "--kubeconfig", str(two_contexts), "--context", "west"])
    assert r.exit_code == 3, r.output
    assert "context west" in r.output and "127.0.0.1:2" in r.output


def test_the_environment_names_the_context(
    two_contexts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contexts.ENV, "west")
    r = runner.invoke(app, ["maintenance", "list", "--kubeconfig", str(two_contexts)])
    assert r.exit_code == 3, r.output
    assert "127.0.0.1:2" in r.output


def test_a_context_the_kubeconfig_lacks_is_wrong_input(two_contexts: Path) -> None:
    r = runner.invoke(app, ["status", "--kubeconfig", str(two_contexts), "--context", "north"])
    assert r.exit_code == 2, r.output
    assert "north" in r.output and "hint:" in r.output


def test_status_of_a_local_cluster_and_a_kubeconfig_are_one_or_the_other(
    two_contexts: Path,
) -> None:
    r = runner.invoke(app, ["status", "--kubeconfig", str(two_contexts), "--name", "demo"])
    assert r.exit_code == 2, r.output
    assert "give one of them" in r.output


def test_other_readers_of_the_kubeconfig_follow_the_chosen_context(
    two_contexts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provisioning service's join address and the operator verbs' user name come
    from the kubeconfig too: they read the same context as the client."""
    assert cluster.endpoint_and_ca(two_contexts)[0] == "127.0.0.1:1"
    assert operator_cmd.kubeconfig_user(two_contexts) == "alice"
    monkeypatch.setenv(contexts.ENV, "west")
    assert cluster.endpoint_and_ca(two_contexts)[0] == "127.0.0.1:2"
    assert operator_cmd.kubeconfig_user(two_contexts) == "bob"
