"""Watch the real systems and turn each change into a timeline entry.

Every poll reads the Nodes (Kubernetes), the Slurm nodes and jobs
(slurmrestd), each BMC's EventLog (Redfish), the FleetPolicy status, the
demo's Pods, and the training job's own event log; :class:`Observer` compares
it with the previous poll and reports what changed. Nothing here assumes what
should happen next: that is the scenario's business.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.api import nodedata
from gpufleet.demo.kube import GV, answered, nodes
from gpufleet.domain import hostlist, node_reports, well_known
from gpufleet.kubeapi.errors import ApiError
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local.cluster import ClusterInfo

OWN_CONDITIONS = frozenset(well_known.CONDITIONS.values())


@dataclass(frozen=True)
class Entry:
    """One thing that happened, seen at ``t`` (seconds since the epoch).

    What a poll finds happened some time between two reads of its source: after
    ``after`` (the previous read began, and did not show it) and before ``before`` (this
    read ended). Two things seen in different sources can be ordered only as far as
    those windows allow: a kube read and a Slurm read of one poll are moments apart,
    and under load a Slurm change caused by a Node change can be read before it.
    """

    t: float
    kind: str
    node: str | None
    text: str
    data: dict[str, Any] = field(default_factory=dict, compare=False)
    after: float | None = field(default=None, compare=False)
    before: float | None = field(default=None, compare=False)

    @property
    def earliest(self) -> float:
        """The earliest moment it can have happened."""
        return self.t if self.after is None else min(self.after, self.t)

    @property
    def latest(self) -> float:
        """The latest moment it can have happened."""
        return self.t if self.before is None else max(self.before, self.t)


@dataclass
class _NodeState:
    state: str | None = None
    unschedulable: bool = False
    taints: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    request: str | None = None
    request_kind: dict[str, str] = field(default_factory=dict)
    lent_to: str | None = None
    ready: bool = False


def passed_through(
    body: dict[str, Any], old: str, new: str | None
) -> list[tuple[str, str | None, float | None]]:
    """The moves from ``old`` to ``new``, as the Node's record tells them.

    The observer polls: a state shorter than one poll (a burn-in that passes in a second) is
    never seen in the label, so the moves are read from the record's history, the last ones
    back to the first that left ``old``. Without a readable history that ends in ``new`` and
    reaches back to ``old``, the one move the label shows. Each move comes with the time
    the record gives it (None for the label's)."""
    record = nodedata.trusted_record(body)
    chain: list[tuple[str, str | None, float | None]] = []
    for t in reversed(record.history if record else ()):
        source, target = t.source.value, t.target.value
        if target != (chain[0][0] if chain else new):
            break
        chain.insert(0, (source, target, t.at))
        if source == old:
            return chain
    return [(old, new, None)]


def _node_state(body: dict[str, Any]) -> _NodeState:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    taints = {
        t["key"]: f"{t.get('value', '')}:{t['effect']}".lstrip(":")
        for t in (body.get("spec") or {}).get("taints") or []
        if str(t["key"]).startswith("gpufleet.io/")
    }
    problems: dict[str, str] = {}
    ready = False
    for c in (body.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            ready = c["status"] == "True"
        if c["type"] in OWN_CONDITIONS and c["status"] == "True":
            problems[c["type"]] = f"{c.get('reason', '')}: {c.get('message', '')!s}"
    answer = node_reports.answer_of(body)
    request = f"{answer.outcome.capitalize()}|{answer.id}: {answer.detail}" if answer else None
    kinds: dict[str, str] = {}
    raw = ann.get(well_known.ANNOTATION_AGENT_REQUEST)
    if raw:
        try:
            doc = json.loads(raw)
            kinds[str(doc.get("id"))] = str(doc.get("kind")) + (
                f" {doc['profile']}" if doc.get("profile") else ""
            )
        except ValueError:
            pass
    return _NodeState(
        state=labels.get(well_known.LABEL_STATE),
        unschedulable=bool((body.get("spec") or {}).get("unschedulable")),
        taints=taints,
        problems=problems,
        request=request,
        request_kind=kinds,
        lent_to=ann.get(well_known.ANNOTATION_LENT_TO),
        ready=ready,
    )


def _kind_from_id(rid: str) -> str:
    """The request kind its id names (``verify-...``, ``gpu-reset-...``), in case the
    annotation came and went between two polls."""
    for prefix, kind in (("verify-", "checks verify"), ("burn-in-", "checks burn-in")):
        if rid.startswith(prefix):
            return kind
    return "gpu-reset" if rid.startswith("gpu-reset-") else "request"


def _evidence(message: str) -> str:
    """The human part of a condition message (before ``| evidence: [...]``)."""
    return message.split("| evidence:", 1)[0].strip().rstrip(";")


class TrainingLog:
    """The example job's ``events.jsonl`` (start, step, done), read incrementally."""

    def __init__(self, ckpt_dir: Path) -> None:
        self.path = ckpt_dir / "events.jsonl"
        self._offset = 0
        self.events: list[dict[str, Any]] = []

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open() as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        complete, _, _rest = data.rpartition("\n")
        if not complete:
            return []
        self._offset += len(complete) + 1
        new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        self.events.extend(new)
        return new


class Observer:
    """Polls every source once per :meth:`poll` and returns the new entries."""

    def __init__(self, info: ClusterInfo, api: SyncKube, *, policy_name: str) -> None:
        self.info = info
        self.api = api
        self.policy_name = policy_name
        self.slurm = httpx.Client(
            base_url=str(info.slurmrestd_url),
            headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": str(info.slurm_jwt)},
            timeout=3,
        )
        self.bmc_http = httpx.Client(timeout=3)
        self.nodes: dict[str, _NodeState] = {}
        self.slurm_nodes: dict[str, tuple[str, str | None]] = {}
        self.jobs: dict[int, dict[str, Any]] = {}
        self.bmc_seen: dict[str, int] = {}
        self.breaker_open: bool | None = None
        self.pods: dict[str, str] = {}
        self.training: TrainingLog | None = None
        self.primed = False
        self.errors: dict[str, str] = {}
        self.request_kinds: dict[str, str] = {}
        self.events_seen: set[str] = set()
        self.read_began: dict[str, float] = {}
        """Per source, when its last successful read began."""

    def close(self) -> None:
        self.slurm.close()
        self.bmc_http.close()

    def watch_training(self, ckpt_dir: Path) -> None:
        self.training = TrainingLog(ckpt_dir)

    # ------------------------------------------------------------------ poll

    def poll(self) -> list[Entry]:
        """One look at everything. The first call only records the starting point."""
        out: list[Entry] = []
        now = time.time()
        for source, fn in (
            ("kube-apiserver", self._kube),
            ("slurmrestd", self._slurm),
            ("redfish-bmcs", self._bmcs),
            ("fleetpolicy", self._policy),
            ("pods", self._pods),
            ("events", self._events),
            ("training job", self._training),
        ):
            began = time.time()
            try:
                seen = fn(now)
                after = self.read_began.get(source, began)
                self.read_began[source] = began
                ended = time.time()
                out.extend(dataclasses.replace(e, after=after, before=ended) for e in seen)
                self.errors.pop(source, None)
            except (ApiError, httpx.HTTPError, OSError, ValueError, KeyError) as exc:
                self.errors[source] = str(exc)
        primed, self.primed = self.primed, True
        return out if primed else []

    def _kube(self, now: float) -> list[Entry]:
        out: list[Entry] = []
        bodies = nodes(self.api)
        present = {b["metadata"]["name"] for b in bodies}
        for name in [n for n in self.nodes if n not in present]:
            del self.nodes[name]
            out.append(Entry(now, "node-removed", name, f"{name}: Node deleted"))
        for body in bodies:
            name = body["metadata"]["name"]
            new = _node_state(body)
            if name not in self.nodes:
                labels = body["metadata"].get("labels") or {}
                machine = labels.get(well_known.LABEL_MACHINE)
                out.append(
                    Entry(
                        now,
                        "node-added",
                        name,
                        f"{name}: Node registered (state {new.state}"
                        + (f", Machine {machine}" if machine else "")
                        + ")",
                        {"state": new.state, "machine": machine},
                    )
                )
            old = self.nodes.get(name, _NodeState())
            self.nodes[name] = new
            if new.ready and not old.ready:
                out.append(Entry(now, "node-ready", name, f"{name}: Ready"))
            self.request_kinds.update(new.request_kind)
            for ctype, text in new.problems.items():
                if ctype not in old.problems:
                    out.append(
                        Entry(now, "condition", name, f"{name}: {ctype}=True ({_evidence(text)})")
                    )
            for ctype in old.problems:
                if ctype not in new.problems:
                    out.append(Entry(now, "condition-cleared", name, f"{name}: {ctype}=False"))
            if new.unschedulable and not old.unschedulable:
                taint = new.taints.get(well_known.TAINT_UNHEALTHY, "")
                out.append(
                    Entry(
                        now,
                        "cordon",
                        name,
                        f"{name}: cordoned, taint {well_known.TAINT_UNHEALTHY}={taint}",
                        {"taint": taint},
                    )
                )
            elif old.unschedulable and not new.unschedulable:
                out.append(Entry(now, "uncordon", name, f"{name}: uncordoned, taints removed"))
            if new.state != old.state and old.state is not None:
                moves = passed_through(body, old.state, new.state)
                for i, (source, target, at) in enumerate(moves):
                    # A move before the last one happened between two polls: at its
                    # recorded time (never later than this poll); the last is seen now.
                    seen = min(at, now) if at is not None and i < len(moves) - 1 else now
                    out.append(
                        Entry(
                            seen,
                            "state",
                            name,
                            f"{name}: state {source} -> {target}",
                            {"state": target, "from": source},
                        )
                    )
            if new.request != old.request and new.request:
                reason, _, message = new.request.partition("|")
                rid = message.split(" ", 1)[0].rstrip(":")
                kind = self.request_kinds.get(rid) or _kind_from_id(rid)
                passed = reason == "Passed"
                out.append(
                    Entry(
                        now,
                        "agent-result",
                        name,
                        f"{name}: agent {kind}: {'passed' if passed else 'FAILED'} ({message})",
                        {"kind": kind, "passed": passed},
                    )
                )
            if new.lent_to != old.lent_to:
                if new.lent_to:
                    out.append(Entry(now, "lent", name, f"{name}: lent to Pod {new.lent_to}"))
                elif old.lent_to:
                    out.append(Entry(now, "returned", name, f"{name}: returned to Slurm"))
        return out

    def _slurm(self, now: float) -> list[Entry]:
        out: list[Entry] = []
        base = f"/slurm/{self.info.slurm_api_version}"
        r = self.slurm.get(f"{base}/nodes")
        r.raise_for_status()
        for n in r.json().get("nodes") or []:
            name = str(n["name"])
            flags = {str(f).upper() for f in n.get("state_flags") or []}
            drained = "DRAIN" in flags
            reason = str(n.get("reason") or "") if drained else None
            old = self.slurm_nodes.get(name)
            self.slurm_nodes[name] = (str(n.get("state")), reason)
            if old is None:
                continue
            if reason is not None and old[1] != reason:
                out.append(Entry(now, "slurm-drain", name, f"{name}: DRAIN in Slurm ({reason!r})"))
            elif reason is None and old[1] is not None:
                out.append(Entry(now, "slurm-resume", name, f"{name}: resumed in Slurm"))
        r = self.slurm.get(f"{base}/jobs")
        r.raise_for_status()
        for j in r.json().get("jobs") or []:
            jid = int(j["job_id"])
            state = str(j.get("job_state", "")).upper()
            nodes = sorted(hostlist.expand(j.get("nodes") or "")) if state == "RUNNING" else []
            restarts = int(j.get("restart_cnt") or 0)
            name = str(j.get("name") or "")
            label = f"job {jid} ({name})" if name else f"job {jid}"
            was = self.jobs.get(jid)
            self.jobs[jid] = {"state": state, "nodes": nodes, "restarts": restarts}
            if was is None:
                if state == "RUNNING":
                    out.append(
                        Entry(
                            now,
                            "job-running",
                            None,
                            f"{label}: RUNNING on {', '.join(nodes)}",
                            {"job": jid, "nodes": nodes, "name": name},
                        )
                    )
                continue
            if restarts > was["restarts"]:
                out.append(
                    Entry(
                        now,
                        "job-requeued",
                        None,
                        f"{label}: requeued by Slurm (restart {restarts})",
                        {"job": jid, "name": name},
                    )
                )
            if state != was["state"] or (state == "RUNNING" and nodes != was["nodes"]):
                kind = {"RUNNING": "job-running", "COMPLETED": "job-completed"}.get(
                    state, "job-state"
                )
                where = f" on {', '.join(nodes)}" if nodes else ""
                out.append(
                    Entry(
                        now,
                        kind,
                        None,
                        f"{label}: {state}{where}",
                        {"job": jid, "nodes": nodes, "name": name},
                    )
                )
        return out

    def _bmcs(self, now: float) -> list[Entry]:
        out: list[Entry] = []
        for node, bmc in self.info.bmcs.items():
            url = f"{bmc.system_url}/LogServices/EventLog/Entries"
            r = self.bmc_http.get(url, auth=(bmc.user, bmc.password))
            r.raise_for_status()
            members = r.json().get("Members") or []
            seen = self.bmc_seen.get(node)
            self.bmc_seen[node] = len(members)
            if seen is None:
                continue
            for m in members[seen:]:
                mid = str(m.get("MessageId", ""))
                if mid.endswith("ResetRequested"):
                    reset = str(m.get("Message", "")).rsplit(" ", 1)[-1]
                    out.append(
                        Entry(
                            now,
                            "bmc-reset",
                            node,
                            f"{node}: BMC ComputerSystem.Reset {reset} (Redfish EventLog)",
                            {"reset": reset},
                        )
                    )
                elif mid.endswith("SystemBooted"):
                    out.append(Entry(now, "bmc-boot", node, f"{node}: {m.get('Message')}"))
        return out

    def _policy(self, now: float) -> list[Entry]:
        found = answered(self.api, f"{GV}/fleetpolicies/{self.policy_name}")
        if found is None:
            return []
        breaker = ((found.get("status") or {}).get("breaker")) or {}
        is_open = bool(breaker.get("open"))
        old, self.breaker_open = self.breaker_open, is_open
        if old is None or old == is_open:
            return []
        if is_open:
            text = (
                f"circuit breaker OPEN ({breaker.get('faultingNodes')} faulting nodes): "
                "automatic actions held"
            )
            return [Entry(now, "breaker-open", None, text)]
        return [Entry(now, "breaker-closed", None, "circuit breaker closed")]

    def _events(self, now: float) -> list[Entry]:
        """Node Events of the agents: faults the policy logs, or counts towards a repeat."""
        out: list[Entry] = []
        for e in self.api.get("/api/v1/namespaces/default/events").get("items") or []:
            name = e["metadata"]["name"]
            if e.get("reportingComponent") != well_known.AGENT or name in self.events_seen:
                continue
            self.events_seen.add(name)
            node = (e.get("involvedObject") or {}).get("name")
            reason = str(e.get("reason", ""))
            text = f"{node}: Event {reason}: {e.get('message', '')}"
            out.append(Entry(now, "event", node, text, {"reason": reason}))
        return out

    def _pods(self, now: float) -> list[Entry]:
        out: list[Entry] = []
        items = self.api.get("/api/v1/namespaces/default/pods").get("items") or []
        current: dict[str, str] = {}
        for p in items:
            name = p["metadata"]["name"]
            phase = str((p.get("status") or {}).get("phase", ""))
            node = (p.get("spec") or {}).get("nodeName") or ""
            current[name] = f"{phase}@{node}"
            if self.pods.get(name) != current[name]:
                where = f" on {node}" if node else " (no node yet)"
                kind = "pod-running" if phase == "Running" and node else "pod"
                out.append(
                    Entry(now, kind, node or None, f"Pod {name}: {phase}{where}", {"pod": name})
                )
        for name in self.pods:
            if name not in current:
                out.append(Entry(now, "pod-gone", None, f"Pod {name}: deleted", {"pod": name}))
        self.pods = current
        return out

    def _training(self, now: float) -> list[Entry]:
        if self.training is None:
            return []
        out: list[Entry] = []
        for e in self.training.read_new():
            if e["kind"] == "start":
                step = int(e.get("step", 0))
                what = (
                    f"resumed from its checkpoint at step {step}" if step else "started at step 0"
                )
                out.append(
                    Entry(
                        float(e["t"]),
                        "train-start",
                        str(e.get("node")),
                        f"training: {what} (rank 0 on {e.get('node')}, {e.get('backend')} "
                        f"all-reduce, world {e.get('world')})",
                        {"step": step},
                    )
                )
            elif e["kind"] == "done":
                out.append(
                    Entry(
                        float(e["t"]),
                        "train-done",
                        None,
                        f"training: done, {e.get('step')} steps, "
                        f"loss {float(e.get('loss', 0)):.5f}",
                        {"step": int(e.get("step", 0))},
                    )
                )
        return out
