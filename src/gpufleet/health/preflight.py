"""Gang preflight: a short all-reduce across a multi-node job's nodes before it starts.

A multi-node job on a node with a broken NIC dies at its first all-reduce,
after it has waited in the queue and loaded its data. The prolog (with
``PrologFlags=Alloc`` Slurm runs it on every node of the job at once) runs a
few all-reduces over ``torch.distributed`` (NCCL on GPUs, gloo otherwise)
first, bounded in time (decision 0095):

1. every node finds its rank in ``SLURM_NODELIST`` (``scontrol show hostnames``);
   rank 0's node holds the rendezvous (a ``TCPStore`` on its ``NodeAddr``, port
   ``base_port + job_id % 1000``);
2. each rank says it arrived, joins the process group, all-reduces a tensor
   whose correct sum it knows, and says whether the sum was right;
3. rank 0 waits for every rank's answer until the deadline. A rank that never
   arrived, never answered or computed a wrong sum is named: rank 0 requeues
   the job (``scontrol requeue``) and excludes the named nodes
   (``ExcNodeList``), so the job starts again elsewhere.

No prolog exits non-zero for a preflight failure (Slurm would drain the node
the prolog ran on, which is usually a healthy one) and nothing is drained: the
preflight names a node for one job; whether the node is broken is for the node
checks and the agent to decide. If the check itself cannot run (torch missing,
the port taken), the job runs as if there were no preflight.

Rank 0 names the ranks that did not arrive or answer; if rank 0's node
cannot be reached at all, rank 1 names it. Only those two act, so a job is
requeued once or twice, never per rank. When two nodes cannot see each other
both may be named: a wrong name costs that job a node it could have used,
never a drain.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.health.slurm_hook import run_scontrol

PORT_SPAN = 1000


@dataclass(frozen=True, slots=True)
class Gang:
    """This node's place in a job."""

    job_id: int
    node: str
    nodes: tuple[str, ...]
    master_addr: str
    port: int

    @property
    def rank(self) -> int:
        return self.nodes.index(self.node)

    @property
    def world(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True, slots=True)
class Result:
    """What one rank saw (rank 0 also what every other rank answered)."""

    ok: bool
    seconds: float
    bad: tuple[str, ...] = ()
    """Nodes named by rank 0: never arrived, never answered, or summed wrong."""
    detail: str = ""
    ran: bool = True
    """False when the preflight could not run at all (no verdict)."""
    actions: list[str] = field(default_factory=list)


def _scontrol(args: Sequence[str], scontrol: str) -> str:
    done = run_scontrol(args, scontrol)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"scontrol {' '.join(args)}: {last}")
    return done.stdout


def gang_from_env(
    env: Mapping[str, str], *, base_port: int, scontrol: str = "scontrol"
) -> Gang | None:
    """This node's place in the job Slurm's prolog environment describes; None for one node."""
    if int(env.get("SLURM_JOB_NUM_NODES") or "1") < 2:
        return None
    job_id = int(env["SLURM_JOB_ID"])
    nodes = hostnames(env["SLURM_NODELIST"], scontrol)
    addr = node_addr(nodes[0], scontrol)
    return Gang(job_id, env["SLURMD_NODENAME"], nodes, addr, port_of(base_port, job_id))


def hostnames(nodelist: str, scontrol: str = "scontrol") -> tuple[str, ...]:
    """A Slurm hostlist expanded, in Slurm's order (``scontrol show hostnames``)."""
    return tuple(_scontrol(["show", "hostnames", nodelist], scontrol).split())


def node_addr(node: str, scontrol: str = "scontrol") -> str:
    """The node's ``NodeAddr`` (its name when Slurm has none): where its rank listens."""
    shown = _scontrol(["show", "node", node, "-o"], scontrol)
    addr = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("NodeAddr=")), "")
    return addr or node


def port_of(base_port: int, job_id: int) -> int:
    return base_port + job_id % PORT_SPAN


def run(gang: Gang, *, timeout_s: float, absent: bool = False) -> Result:
    """This rank's part, in a child process killed at ``timeout_s`` + 5 s.

    ``absent``: do not join (the simulated backend's ``nic-down``: a node whose
    network is broken never arrives).
    """
    if absent:
        return Result(False, 0.0, detail="simulated: this node's network is down", ran=False)
    started = time.monotonic()
    argv = [sys.executable, "-m", "gpufleet.health._torch", json.dumps(_args(gang, timeout_s))]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s + 5, stdin=subprocess.DEVNULL
        )
        doc = json.loads(done.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        spent = time.monotonic() - started
        return Result(False, spent, detail=f"no answer within {timeout_s:g}s", ran=False)
    except (ValueError, IndexError, OSError) as exc:
        return Result(False, time.monotonic() - started, detail=f"no verdict: {exc}", ran=False)
    return Result(
        ok=bool(doc["ok"]),
        seconds=float(doc["seconds"]),
        bad=tuple(doc.get("bad") or ()),
        detail=str(doc.get("detail") or ""),
        ran=bool(doc.get("ran", True)),
    )


def _args(gang: Gang, timeout_s: float) -> dict[str, object]:
    return {
        "rank": gang.rank,
        "world": gang.world,
        "nodes": list(gang.nodes),
        "addr": gang.master_addr,
        "port": gang.port,
        "deadline": time.time() + timeout_s,
    }


def requeue_without(gang: Gang, bad: Sequence[str], *, scontrol: str = "scontrol") -> list[str]:
    """Requeue the job and exclude ``bad`` (added to what it already excludes)."""
    done: list[str] = []
    shown = _scontrol(["show", "job", str(gang.job_id), "-o"], scontrol)
    old = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("ExcNodeList=")), "")
    excluded = ",".join([*([old] if old and old != "(null)" else []), *bad])
    _scontrol(["requeue", str(gang.job_id)], scontrol)
    done.append(f"job {gang.job_id} requeued")
    _scontrol(["update", f"jobid={gang.job_id}", f"ExcNodeList={excluded}"], scontrol)
    done.append(f"ExcNodeList={excluded}")
    return done
