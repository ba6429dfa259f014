"""Every command has --help text with an example (the CLI's convention, docs/cli.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import COMMANDS as MAIN_COMMANDS
from gpufleet.cli.main import app, command_tree

runner = CliRunner()
GPUFLEET = Path(sys.executable).parent / "gpufleet"


def _commands(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    if getattr(cmd, "invoke_without_command", False):  # a group that also runs: its help too
        yield path, cmd
    for name, sub in subs.items():
        yield from _commands(sub, [*path, name])


COMMANDS = [path for path, _ in _commands(command_tree(), [])]


def test_every_command_is_found() -> None:
    assert ["nodes"] in COMMANDS and ["node", "return"] in COMMANDS and ["version"] in COMMANDS
    assert len(COMMANDS) > 30


def test_a_command_loads_only_its_own_module() -> None:
    """``gpufleet controller`` in a pod must not import the demo, the local cluster or
    the health checks (seconds of start-up on an emulated core)."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from gpufleet.cli.main import app\n"
        "r = CliRunner().invoke(app, ['controller', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('gpufleet.'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert "gpufleet.cli.controller_cmd" in loaded
    for heavy in ("gpufleet.demo.runner", "gpufleet.local.cluster", "gpufleet.health.checks"):
        assert heavy not in loaded, f"gpufleet controller imports {heavy}"


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(path: list[str]) -> None:
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "Example" in r.stdout, f"gpufleet {' '.join(path)} --help has no example"


def test_each_listed_summary_is_the_commands_own_first_line() -> None:
    """``gpufleet --help`` lists the summaries kept in ``COMMANDS`` (so that listing
    imports no command module); they must say what the command's own help says."""
    tree = command_tree()
    for name, entry in MAIN_COMMANDS.items():
        assert tree.commands[name].get_short_help_str(10_000) == entry.summary, name


def _loaded_after(*argv: str) -> set[str]:
    """The modules a fresh ``gpufleet argv`` process has imported when it exits."""
    code = (
        "import sys\n"
        f"sys.argv = ['gpufleet', *{list(argv)!r}]\n"
        "from gpufleet.cli.main import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stderr.split()[-2000:]) if done.stderr else set()


ADAPTERS = ("kr8s", "kopf", "httpx", "gpufleet.kubeapi", "numpy", "matplotlib", "fastapi")


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("version",), ("--version",), ("version", "-o", "json")],
    ids=" ".join,
)
def test_listing_and_version_import_no_command_and_no_client(argv: tuple[str, ...]) -> None:
    """What start-up costs most is importing the Kubernetes client and the models;
    a command that does not talk to a cluster must not pay for it (docs/cli.md)."""
    loaded = _loaded_after(*argv)
    assert "gpufleet.cli.main" in loaded
    for heavy in (*ADAPTERS, "gpufleet.domain", "gpufleet.cli.nodes_cmd", "yaml"):
        assert heavy not in loaded, f"gpufleet {' '.join(argv)} imports {heavy}"


@pytest.mark.parametrize(
    "argv",
    [("policy", "--help"), ("policy", "show"), ("sim", "--help"), ("policy", "validate", "--help")],
    ids=" ".join,
)
def test_help_of_offline_commands_builds_no_model(argv: tuple[str, ...]) -> None:
    """The policy models take a third of a second to build; the simulator pulls numpy."""
    loaded = _loaded_after(*argv)
    for heavy in (*ADAPTERS, "gpufleet.domain.policy", "gpufleet.sim"):
        assert heavy not in loaded, f"gpufleet {' '.join(argv)} imports {heavy}"


def test_slurm_render_help_imports_no_kubernetes_client() -> None:
    loaded = _loaded_after("slurm", "render", "--help")
    for heavy in ("kr8s", "kopf", "gpufleet.kubeapi.client"):
        assert heavy not in loaded, f"gpufleet slurm render --help imports {heavy}"


def test_completion_is_offered_at_the_top_and_completes_in_bash(tmp_path: Path) -> None:
    """``gpufleet --show-completion bash`` prints a script that bash runs: completing
    ``gpufleet po`` offers ``policy`` and ``gpufleet policy va`` offers ``validate``."""
    script = subprocess.run(
        [str(GPUFLEET), "--show-completion", "bash"], capture_output=True, text=True, check=True
    ).stdout
    assert "_GPUFLEET_COMPLETE" in script
    (tmp_path / "completion.bash").write_text(script)
    probe = (
        f"source {tmp_path / 'completion.bash'}\n"
        "COMP_WORDS=(gpufleet po); COMP_CWORD=1; _gpufleet_completion gpufleet\n"
        'echo "top: ${COMPREPLY[*]}"\n'
        "COMP_WORDS=(gpufleet policy va); COMP_CWORD=2; _gpufleet_completion gpufleet\n"
        'echo "sub: ${COMPREPLY[*]}"\n'
    )
    env = {**os.environ, "PATH": f"{GPUFLEET.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(
        ["bash", "--norc", "-c", probe], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    assert "top: policy" in out
    assert "sub: validate" in out


def test_completion_is_not_offered_by_each_command() -> None:
    r = runner.invoke(app, ["version", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "--install-completion" not in r.stdout
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout


REPO = Path(__file__).resolve().parents[3]
EXAMPLE_PATH = re.compile(r"(?<![\w/~.$-])((?:[\w.-]+/)+[\w.-]+\.\w+)\b")


def test_help_examples_name_files_that_exist() -> None:
    """A path in an example that starts at a directory of this repository
    (``examples/slurmcluster.yaml``, ``docs/slurm.md``) must be there: a person
    copies the example from a checkout."""
    top = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    named = []
    for path, cmd in _commands(command_tree(), []):
        for group_path, group in [(path, cmd)]:
            text = group.help or ""
            for match in EXAMPLE_PATH.findall(text[text.find("Example") :]):
                if match.split("/", 1)[0] in top:
                    named.append((" ".join(group_path), match))
    assert ("slurm render", "examples/slurmcluster.yaml") in named
    missing = [(cmd, p) for cmd, p in named if not (REPO / p).exists()]
    assert not missing, f"help examples name files that do not exist: {missing}"


def test_the_slurm_render_example_renders(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(
        json.dumps(
            {
                "items": [
                    {
                        "metadata": {
                            "name": "gpu-0",
                            "labels": {"nvidia.com/gpu.present": "true"},
                        },
                        "status": {"capacity": {"cpu": "96", "memory": "1Ti"}},
                    }
                ]
            }
        )
    )
    r = runner.invoke(
        app,
        ["slurm", "render", str(REPO / "examples" / "slurmcluster.yaml"), "--nodes", str(nodes)],
    )
    assert r.exit_code == 0, r.output
    assert "NodeName=gpu-0" in r.stdout and "PartitionName=batch" in r.stdout


@pytest.mark.parametrize(
    ("words", "first", "directive"),
    [
        (["po"], "policy", ":4"),
        (["policy", "va"], "validate", ":4"),
        (["status", "--con"], "--context", ":4"),
        (["policy", "validate", ""], None, ":0"),  # a file argument: the shell's file names
    ],
)
def test_kubectl_plugin_completion_answers_in_cobras_form(
    words: list[str], first: str | None, directive: str
) -> None:
    """What kubectl reads from kubectl_complete-gpufleet (the real kubectl runs it in
    tests/integration/test_cli_context.py)."""
    from gpufleet.cli.kubectl_complete import CobraComplete

    lines = CobraComplete(command_tree(), words).complete().splitlines()
    assert lines[-1] == directive
    if first is not None:
        assert lines[0].split("\t")[0] == first
