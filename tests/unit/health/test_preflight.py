"""The gang preflight: where a node stands in its job (from Slurm's prolog environment
and scontrol's real output formats), a real gloo all-reduce over loopback, and the
requeue that excludes a named node."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

from gpufleet.health import _torch, preflight

ENV = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_NODELIST": "gpu-node-[0000-0002]",
    "SLURMD_NODENAME": "gpu-node-0001",
}


def fake_scontrol(tmp_path: Path, exc: str = "(null)") -> tuple[str, Path]:
    """Prints what scontrol 22.05 prints for the commands the preflight runs; logs calls."""
    calls = tmp_path / "calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'case "$1 $2" in\n'
        '  "show hostnames") printf "gpu-node-0000\\ngpu-node-0001\\ngpu-node-0002\\n" ;;\n'
        '  "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=vm" ;;\n'
        f'  "show job") echo "JobId=$3 JobName=wrap ReqNodeList=(null) ExcNodeList={exc}" ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), calls


def test_a_node_finds_its_rank_and_the_rendezvous_on_rank_0(tmp_path: Path) -> None:
    scontrol, calls = fake_scontrol(tmp_path)
    gang = preflight.gang_from_env(ENV, base_port=29400, scontrol=scontrol)
    assert gang is not None
    assert (gang.rank, gang.world, gang.master_addr) == (1, 3, "10.0.0.7")
    assert gang.port == 29400 + 234
    assert "show node gpu-node-0000 -o" in calls.read_text()


def test_a_one_node_job_has_no_gang(tmp_path: Path) -> None:
    scontrol, calls = fake_scontrol(tmp_path)
    one = {**ENV, "SLURM_JOB_NUM_NODES": "1", "SLURM_NODELIST": "gpu-node-0001"}
    assert preflight.gang_from_env(one, base_port=29400, scontrol=scontrol) is None
    assert not calls.exists()


def test_requeue_adds_the_named_node_to_what_the_job_excludes(tmp_path: Path) -> None:
    scontrol, calls = fake_scontrol(tmp_path, exc="gpu-node-0009")
    gang = preflight.Gang(1234, "gpu-node-0000", ("gpu-node-0000", "gpu-node-0001"), "a", 1)
    done = preflight.requeue_without(gang, ["gpu-node-0001"], scontrol=scontrol)
    assert calls.read_text().splitlines()[1:] == [
        "requeue 1234",
        "update jobid=1234 ExcNodeList=gpu-node-0009,gpu-node-0001",
    ]
    assert done[-1] == "ExcNodeList=gpu-node-0009,gpu-node-0001"


def test_an_absent_node_does_not_join() -> None:
    gang = preflight.Gang(1, "b", ("a", "b"), "127.0.0.1", 1)
    found = preflight.run(gang, timeout_s=5, absent=True)
    assert not found.ok and not found.ran


def test_two_ranks_all_reduce_over_gloo_and_agree() -> None:
    # torch is part of the test environment (the gpu extra), as for the all-reduce check.
    nodes = ("a", "b")
    port = _torch._free_port()
    found: dict[int, preflight.Result] = {}

    def rank(i: int) -> None:
        gang = preflight.Gang(7, nodes[i], nodes, "127.0.0.1", port)
        found[i] = preflight.run(gang, timeout_s=60)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found[0].ok and found[0].bad == () and found[0].ran, found[0]
    assert found[1].ok, found[1]
