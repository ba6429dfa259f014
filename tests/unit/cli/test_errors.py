"""Every user error is one line on stderr, a hint, and a documented exit code; the
traceback only with --debug.

The apiserver that is down is a real loopback port that nothing listens on (bound,
never listening, so no other process can take it during the test); the malformed
kubeconfigs are real files.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from typer.testing import CliRunner

from gpufleet.cli.errors import EXIT_INPUT, EXIT_NO, EXIT_NO_ANSWER
from gpufleet.cli.main import app
from gpufleet.local.cluster import STATE_FILE, ClusterInfo

runner = CliRunner()


@dataclass(frozen=True)
class Env:
    down: Path
    """A kubeconfig whose apiserver is a loopback port with no listener."""
    down_run_dir: Path
    """A local cluster's run directory whose apiserver is that port."""
    not_yaml: Path
    not_a_config: Path
    no_context: Path
    missing: Path
    closed_port: int
    """A loopback port nothing listens on (bound for the module, never listening)."""


def _kubeconfig(server: str) -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: not-a-secret}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"""


def _ca_file(path: Path) -> Path:
    """A real self-signed CA certificate (the local cluster's client verifies with one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("cli-errors")
    closed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    url = f"https://127.0.0.1:{closed.getsockname()[1]}"
    try:
        down = tmp / "down.kubeconfig"
        down.write_text(_kubeconfig(url))
        run_dir = tmp / "cluster"
        run_dir.mkdir()
        info = ClusterInfo(
            run_dir=run_dir,
            node_names=["gpu-node-0000"],
            gpus_per_node=8,
            kubeconfig=down,
            apiserver_url=url,
            token="not-a-secret",
            ca_file=_ca_file(tmp / "ca.crt"),
            etcd_url="http://127.0.0.1:1",
        )
        (run_dir / STATE_FILE).write_text(info.to_json())
        not_yaml = tmp / "not-yaml.kubeconfig"
        not_yaml.write_text("clusters: [unclosed\n")
        not_a_config = tmp / "list.kubeconfig"
        not_a_config.write_text("- just\n- a list\n")
        no_context = tmp / "no-context.kubeconfig"
        no_context.write_text(_kubeconfig(url).replace("current-context: x", "current-context: y"))
        yield Env(
            down,
            run_dir,
            not_yaml,
            not_a_config,
            no_context,
            tmp / "absent.kubeconfig",
            closed.getsockname()[1],
        )
    finally:
        closed.close()


@dataclass(frozen=True)
class Case:
    args: list[str]
    code: int
    says: str
    hint: str | None = "hint:"


def _cases(e: Env) -> dict[str, Case]:
    down = ["--kubeconfig", str(e.down)]
    unreachable = "cannot reach the Kubernetes apiserver"
    no_config = "no usable kubeconfig"
    return {
        "kubeconfig missing": Case(
            ["nodes", "--kubeconfig", str(e.missing)], EXIT_INPUT, no_config
        ),
        "kubeconfig not YAML": Case(
            ["nodes", "--kubeconfig", str(e.not_yaml)], EXIT_INPUT, no_config
        ),
        "kubeconfig not a mapping": Case(
            ["node", "gpu-node-0000", "--kubeconfig", str(e.not_a_config)], EXIT_INPUT, no_config
        ),
        "kubeconfig without its context": Case(
            ["machines", "--kubeconfig", str(e.no_context)], EXIT_INPUT, no_config
        ),
        "nodes, apiserver down": Case(["nodes", *down], EXIT_NO_ANSWER, unreachable),
        "node, apiserver down": Case(["node", "gpu-node-0000", *down], EXIT_NO_ANSWER, unreachable),
        "machines, apiserver down": Case(["machines", *down], EXIT_NO_ANSWER, unreachable),
        "machines rearm, apiserver down": Case(
            ["machines", "rearm", "m0", "--reason", "test", *down], EXIT_NO_ANSWER, unreachable
        ),
        "status, apiserver down": Case(
            ["status", "--run-dir", str(e.down_run_dir)], EXIT_NO_ANSWER, unreachable
        ),
        "controller, apiserver down": Case(
            ["controller", "--metrics-port", "0", *down], EXIT_NO_ANSWER, unreachable
        ),
        "node triage, apiserver down": Case(
            ["node", "triage", "gpu-node-0000", "--reason", "test", *down],
            EXIT_NO_ANSWER,
            unreachable,
        ),
        "breaker reset, apiserver down": Case(
            ["breaker", "reset", "--reason", "test", *down], EXIT_NO_ANSWER, unreachable
        ),
        "health inject, agent down": Case(
            ["health", "inject", "--url", f"http://127.0.0.1:{e.closed_port}", "xid=79,gpu=3"],
            EXIT_NO_ANSWER,
            "cannot reach the agent",
        ),
        "health check --backend bogus": Case(
            ["health", "check", "--backend", "bogus"], EXIT_INPUT, "'bogus' is not one of"
        ),
        "slurm token, key file missing": Case(
            ["slurm", "token", "--jwt-key-file", str(e.missing)],
            EXIT_INPUT,
            f"cannot read {e.missing}",
            hint=None,
        ),
        "local status, no such cluster": Case(
            ["local", "status", "--run-dir", str(e.missing)], EXIT_INPUT, "no local cluster"
        ),
        "status, no such cluster": Case(
            ["status", "--run-dir", str(e.missing)], EXIT_INPUT, "no local cluster"
        ),
        "slurm render, not YAML": Case(
            ["slurm", "render", str(e.not_yaml), "--nodes", str(e.not_yaml)],
            EXIT_INPUT,
            "not valid YAML",
            hint=None,
        ),
        "slurm render, not a SlurmCluster": Case(
            ["slurm", "render", str(e.no_context), "--nodes", str(e.no_context)],
            EXIT_INPUT,
            "invalid SlurmClusterSpec",
            hint=None,
        ),
        "goodput, apiserver down": Case(
            ["goodput", "--telemetry", str(e.down.parent), *down], EXIT_NO_ANSWER, unreachable
        ),
        "goodput, no telemetry directory": Case(
            ["goodput", "--telemetry", str(e.missing)], EXIT_INPUT, "no such directory"
        ),
        "goodput, remediations not YAML": Case(
            ["goodput", "--telemetry", str(e.down.parent), "--remediations", str(e.not_yaml)],
            EXIT_INPUT,
            "not valid YAML",
            hint=None,
        ),
        "slurm crd -o wide": Case(["slurm", "crd", "-o", "wide"], EXIT_INPUT, "yaml or json"),
        "unknown command": Case(["nodez"], EXIT_INPUT, "No such command"),
        "unknown option": Case(["nodes", "--bogus"], EXIT_INPUT, "No such option"),
        "-o and --json disagree": Case(
            ["health", "check", "--backend", "simulated", "-o", "yaml", "--json"],
            EXIT_INPUT,
            "disagree",
        ),
        "-o bogus": Case(["version", "-o", "bogus"], EXIT_INPUT, "'bogus' is not one of"),
    }


CASE_NAMES = list(_cases(Env(*(Path("/") for _ in range(6)), closed_port=0)))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_user_error_is_one_line_a_hint_and_an_exit_code(
    name: str, env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(env.missing))  # the controller sets it; restored after
    monkeypatch.delenv("GPUFLEET_DEBUG", raising=False)
    case = _cases(env)[name]
    r = runner.invoke(app, case.args)
    assert r.exit_code == case.code, r.output
    assert "Traceback" not in r.output
    lines = r.stderr.splitlines()
    assert lines and lines[0].startswith("error: ") and case.says in lines[0], r.stderr
    if case.hint is not None:
        assert len(lines) == 2 and lines[1].startswith(case.hint), r.stderr
    else:
        assert len(lines) == 1, r.stderr


def test_debug_anywhere_on_the_line_adds_the_traceback(env: Env) -> None:
    for args in (
        ["--debug", "nodes", "--kubeconfig", str(env.down)],
        ["nodes", "--kubeconfig", str(env.down), "--debug"],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == EXIT_NO_ANSWER, r.output
        assert "Traceback (most recent call last)" in r.stderr
        assert "Unreachable" in r.stderr
        assert r.stderr.splitlines()[-2].startswith("error: cannot reach")


def test_an_unexpected_error_is_one_line_and_points_to_debug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpufleet.cli import version_cmd

    def broken() -> str:
        raise RuntimeError("something nobody expected\nsecond line")

    monkeypatch.setattr(version_cmd, "package_version", broken)
    monkeypatch.delenv("GPUFLEET_DEBUG", raising=False)
    r = runner.invoke(app, ["version"])
    assert r.exit_code == EXIT_NO
    assert r.stderr.splitlines() == [
        "error: unexpected RuntimeError: something nobody expected",
        "hint: run it again with --debug for the traceback",
    ]


@pytest.mark.parametrize("command", [["agent"], ["health", "check"]])
def test_help_does_not_show_this_hosts_name_as_a_default(command: list[str]) -> None:
    r = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "--node" in r.stdout and "$NODE_NAME, else this host's name" in r.stdout
    assert f"[default: {socket.gethostname()}]" not in r.stdout


def test_an_xid_outside_the_catalogue_is_explained_with_a_warning_and_exit_1() -> None:
    r = runner.invoke(app, ["policy", "explain", "--xid", "9999"])
    assert r.exit_code == EXIT_NO, r.output
    assert "XID 9999" in r.stdout  # what the policy does with it is still shown
    lines = r.stderr.splitlines()
    assert lines[0] == (
        "warning: XID 9999 is not in gpufleet's catalogue; shown is what the policy does "
        "with an XID it does not know"
    )
    assert lines[1].startswith("hint: ") and len(lines) == 2


def test_an_xid_no_driver_can_report_is_a_usage_error() -> None:
    r = runner.invoke(app, ["policy", "explain", "--xid", "99999"])
    assert r.exit_code == EXIT_INPUT
    assert r.stderr.splitlines()[0].startswith("error: Invalid value for '--xid'")


def test_a_known_xid_has_no_warning() -> None:
    r = runner.invoke(app, ["policy", "explain", "--xid", "79"])
    assert r.exit_code == 0 and r.stderr == ""
