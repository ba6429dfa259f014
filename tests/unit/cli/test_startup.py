"""What a command that does not talk to a cluster imports: the cause of a slow start,
checked instead of the time (the figures are in docs/cli.md, from bench/cli_startup.py).

Every command's ``--help`` (walked from the command tree, so a new command is checked
too), ``version`` and ``--version`` run each in a process of their own, forked from one
that has imported only ``gpufleet.cli.main``; none may import what the profile
(``python -X importtime``) showed costs most: the Kubernetes client, the HTTP clients,
Prometheus, numpy, yaml, pydantic and the models built with it, or asyncio.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpufleet.cli import agent_cmd, controller_cmd
from gpufleet.cli.main import command_tree

HEAVY = (
    "kr8s",
    "kopf",
    "httpx",
    "prometheus_client",
    "numpy",
    "yaml",
    "pydantic",
    "fastapi",
    "uvicorn",
    "cryptography",
    "asyncio",
    "gpufleet.domain.policy",
    "gpufleet.kubeapi.client",
)
"""Packages (and their submodules) no listed run may import (the CRD models of
gpufleet.api are pydantic's)."""

FORKED = """
import io, json, os, sys
from contextlib import redirect_stdout
from gpufleet.cli.main import main

runs = json.loads(sys.argv[1])
heavy = tuple(json.loads(sys.argv[2]))
def hit_any(h):
    return any(m == h or m.startswith(h + ".") for m in sys.modules)
print(json.dumps({"": sorted(h for h in heavy if hit_any(h))}), flush=True)
for argv in runs:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        sys.argv = ["gpufleet", *argv]
        code = 0
        try:
            with redirect_stdout(io.StringIO()):
                main()
        except SystemExit as exc:
            code = exc.code or 0
        found = sorted(h for h in heavy if hit_any(h))
        os.write(write, json.dumps([code, found]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    print(json.dumps({" ".join(argv): json.loads(answer)}), flush=True)
"""


def _paths(cmd: Any, path: list[str]) -> list[list[str]]:
    found = [path]
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        found += _paths(sub, [*path, name])
    return found


def _imported(runs: list[list[str]]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", FORKED, json.dumps(runs), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    answers: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        answers.update(json.loads(line))
    return answers


def test_no_help_and_no_version_imports_what_is_slow_to_import() -> None:
    runs = [[*path, "--help"] for path in _paths(command_tree(), [])]
    runs += [["version"], ["version", "-o", "json"], ["--version"]]
    assert len(runs) > 60
    answers = _imported(runs)
    assert answers[""] == [], "importing gpufleet.cli.main imports " + ", ".join(answers[""])
    slow = {}
    for argv in runs:
        code, found = answers[" ".join(argv)]
        assert code == 0, f"gpufleet {' '.join(argv)} exited {code}"
        if found:
            slow[" ".join(argv)] = found
    assert not slow, "these import what makes a start slow (docs/cli.md, start-up):\n" + "\n".join(
        f"  gpufleet {argv}: {', '.join(found)}" for argv, found in slow.items()
    )


def test_the_check_sees_a_heavy_import() -> None:
    """The forked runs report what they import: the agent's own run imports the client."""
    answers = _imported([["agent", "--no-kube", "--backend", "simulated", "--help"]])
    assert answers["agent --no-kube --backend simulated --help"] == [0, []]
    answers = _imported([["slurm", "crd"]])
    code, found = answers["slurm crd"]
    assert code == 0 and "pydantic" in found


def test_defaults_named_in_the_help_are_those_of_the_modules_that_use_them() -> None:
    """Commands name a few defaults themselves, so that their help imports nothing heavy."""
    from gpufleet.demo.scenario_names import NAMES
    from gpufleet.demo.scenarios import SCENARIOS
    from gpufleet.health import checks, maintenance_commands
    from gpufleet.health.check_names import ALL
    from gpufleet.health.metrics import DEFAULT_PORT as AGENT_PORT
    from gpufleet.lifecycle.metrics import DEFAULT_PORT as CONTROLLER_PORT

    assert tuple(SCENARIOS) == NAMES
    assert ALL == checks.ALL
    assert agent_cmd.DEFAULT_METRICS_PORT == AGENT_PORT
    assert agent_cmd.DEFAULT_MAINTENANCE_COMMANDS == maintenance_commands.DEFAULT_DIR
    port = next(p for p in command_tree().commands["controller"].params if p.name == "metrics_port")
    assert port.default == CONTROLLER_PORT
    assert Path(controller_cmd.__file__).name == "controller_cmd.py"
