"""The agent runs a MaintenancePlan's command: only an installed one, only the one the
node's record names, bounded by its timeout, its output in the answer (decision 0120).
Real programs in a temporary commands directory."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from gpufleet.domain import maintenance as mt
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.health import maintenance_commands as mc

from .test_agent_requests import _passed, _serve, agent_for, issue


def in_maintenance(command: str, since: float = 3000.25) -> NodeRecord:
    inc = Incident(
        key=mt.incident_key("fw"),
        description=mt.reason("fw", mt.Action.COMMAND, None, command),
        opened_at=2000.5,
        plan=None,
        drained=True,
        command_timeout_s=30,
    )
    record = NodeRecord.new("n1", at=since, state=NodeState.MAINTENANCE)
    return replace(record, incident=inc)


def install(directory: Path, name: str, body: str, mode: int = 0o755) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def test_a_named_command_runs_with_the_node_s_name_and_its_output_is_the_answer(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    install(tmp_path, "flash-fw", f'echo "flashing $NODE_NAME"; echo "$NODE_NAME" > {marker}')
    record = in_maintenance("flash-fw")
    agent, _, rep = agent_for(record)
    agent.settings.maintenance_commands = tmp_path
    _serve(agent, issue(record, "command", timeout_s=30))
    result = _passed(rep)
    assert result is not None and result.passed, result
    assert "flash-fw exited 0" in result.detail and "flashing n1" in result.detail
    assert marker.read_text().strip() == "n1"


def test_a_failing_command_answers_failed_with_its_exit_status_and_output(
    tmp_path: Path,
) -> None:
    install(tmp_path, "flash-fw", 'echo "image checksum mismatch" >&2; exit 3')
    record = in_maintenance("flash-fw")
    agent, _, rep = agent_for(record)
    agent.settings.maintenance_commands = tmp_path
    _serve(agent, issue(record, "command", timeout_s=30))
    result = _passed(rep)
    assert result is not None and not result.passed
    assert "exited 3" in result.detail and "image checksum mismatch" in result.detail


def test_a_missing_command_fails_naming_what_is_installed(tmp_path: Path) -> None:
    install(tmp_path, "other-tool", "exit 0")
    record = in_maintenance("flash-fw")
    agent, _, rep = agent_for(record)
    agent.settings.maintenance_commands = tmp_path
    _serve(agent, issue(record, "command", timeout_s=30))
    result = _passed(rep)
    assert result is not None and not result.passed
    assert "no maintenance command 'flash-fw'" in result.detail and "other-tool" in result.detail


def test_a_command_others_may_edit_or_not_executable_is_refused_and_not_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    install(tmp_path, "open-fw", f"touch {marker}", mode=0o757)
    install(tmp_path, "plain-fw", f"touch {marker}", mode=0o644)
    (tmp_path / "dir-fw").mkdir()
    assert "writable by group or others" in str(mc.find(tmp_path, "open-fw"))
    assert "not executable" in str(mc.find(tmp_path, "plain-fw"))
    assert "not a regular file" in str(mc.find(tmp_path, "dir-fw"))
    assert "not a command name" in str(mc.find(tmp_path, "../open-fw"))
    assert not marker.exists()


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The command starts a child that ignores SIGTERM; both must be gone afterwards.
    path = install(
        tmp_path,
        "hang",
        f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 1; done' &\nwait",
    )
    start = time.monotonic()
    found = mc.find(path.parent, path.name)
    assert isinstance(found, mc.Command), found
    with found:
        outcome = mc.run(found, timeout_s=1, env={})
    assert not outcome.passed and "killed after 1 s" in outcome.detail
    assert time.monotonic() - start < 30
    child = int(pidfile.read_text())
    # SIGKILL is delivered at once, but a loaded machine may take a moment to end it.
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(child) is False, f"the command's child {child} outlived its timeout"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_agent_refuses_a_command_other_than_the_record_s(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    install(tmp_path, "wipe", f"touch {marker}")
    install(tmp_path, "flash-fw", "exit 0")
    record = in_maintenance("flash-fw")
    agent, _, rep = agent_for(record)
    agent.settings.maintenance_commands = tmp_path
    from gpufleet.domain import agent_requests

    req = agent_requests.issue(record, "command", timeout_s=30)
    assert req is not None
    _serve(agent, replace(req, command="wipe").encode())
    assert _passed(rep) is None  # refused, not answered
    assert not marker.exists()
    assert any("'wipe'" in message for _, message in rep.node_events)
