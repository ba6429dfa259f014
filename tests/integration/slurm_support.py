"""Helpers for the Slurm integration tests: a syncer in a thread, Node patches, Slurm state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from node_history import annotation_values
from waiting import wait_for

from gpufleet.domain import well_known
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.background import SlurmEndpoints, SyncerThread
from gpufleet.slurm.metrics import SyncerMetrics
from gpufleet.slurm.syncer import SyncSettings


class Kube:
    """Synchronous JSON access to the local apiserver (the tests play the controller)."""

    def __init__(self, info: ClusterInfo) -> None:
        self.http = httpx.Client(
            base_url=info.apiserver_url,
            headers={"Authorization": f"Bearer {info.token}"},
            verify=str(info.ca_file),
            timeout=10,
        )

    def get(self, path: str) -> Any:
        r = self.http.get(path)
        r.raise_for_status()
        return r.json()

    def node(self, name: str) -> dict[str, Any]:
        return self.get(f"/api/v1/nodes/{name}")  # type: ignore[no-any-return]

    def patch(self, path: str, body: Any, kind: str = "strategic-merge-patch") -> Any:
        r = self.http.patch(
            path, content=json.dumps(body), headers={"Content-Type": f"application/{kind}+json"}
        )
        assert r.status_code < 300, r.text
        return r.json()

    def patch_node(self, name: str, body: Any, status: bool = False) -> Any:
        return self.patch(f"/api/v1/nodes/{name}" + ("/status" if status else ""), body)

    def set_state(self, name: str, state: str | None) -> None:
        self.patch_node(name, {"metadata": {"labels": {well_known.LABEL_STATE: state}}})

    def set_condition(self, name: str, ctype: str, status: str, reason: str = "Xid79") -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": "test",
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        }
        self.patch_node(name, {"status": {"conditions": [cond]}}, status=True)

    def condition(self, name: str, ctype: str) -> dict[str, Any] | None:
        for c in self.node(name).get("status", {}).get("conditions", []):
            if c["type"] == ctype:
                return c  # type: ignore[no-any-return]
        return None

    def annotation(self, name: str, key: str) -> str | None:
        return (self.node(name)["metadata"].get("annotations") or {}).get(key)

    def resource_version(self, name: str) -> str:
        """The Node's resourceVersion now: where :meth:`annotations_since` starts reading."""
        return str(self.node(name)["metadata"]["resourceVersion"])

    def annotations_since(self, name: str, key: str, since: str) -> list[str]:
        """Every value annotation ``key`` took since resourceVersion ``since``, from a watch:
        one set and removed between two reads is seen too."""
        return annotation_values(self.http, name, key, since)

    def reset_node(self, name: str) -> None:
        """Remove everything gpufleet put on a Node: our conditions, taints, cordon, and
        every ``gpufleet.io/`` label and annotation. A lifecycle record left by another
        test would make the node managed by a controller these tests do not run."""
        node = self.node(name)
        conds = [
            c
            for c in node.get("status", {}).get("conditions", [])
            if c["type"] not in (*well_known.CONDITIONS.values(), well_known.CONDITION_SLURM)
        ]
        self.patch(
            f"/api/v1/nodes/{name}/status", {"status": {"conditions": conds}}, kind="merge-patch"
        )
        taints = [t for t in node["spec"].get("taints", []) if t["key"] != well_known.TAINT_SLURM]
        ann = {
            k: None
            for k in node["metadata"].get("annotations") or {}
            if k.startswith(f"{well_known.GROUP}/") and k != well_known.ANNOTATION_BMC_SECRET
        }
        self.patch(
            f"/api/v1/nodes/{name}",
            {
                "metadata": {"labels": {well_known.LABEL_STATE: None}, "annotations": ann},
                "spec": {"taints": taints or None, "unschedulable": None},
            },
            kind="merge-patch",
        )


class Slurm:
    def __init__(self, info: ClusterInfo) -> None:
        self.info = info
        self.env = info.slurm_env()

    def run(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30)
        if check:
            assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
        return r.stdout

    def nodes(self) -> dict[str, dict[str, Any]]:
        """``sinfo --json`` node records by name (empty if slurmctld is down)."""
        r = subprocess.run(
            ["sinfo", "--json"], env=self.env, capture_output=True, text=True, timeout=30
        )
        if r.returncode != 0:
            return {}
        return {n["name"]: n for n in json.loads(r.stdout)["nodes"]}

    def node(self, name: str) -> dict[str, Any]:
        return self.nodes().get(name, {})

    def drained(self, name: str) -> str | None:
        """The drain reason if the node has the DRAIN flag, else None."""
        n = self.node(name)
        if "DRAIN" in (n.get("state_flags") or []):
            return str(n.get("reason") or "")
        return None

    def drain(self, name: str, reason: str) -> None:
        self.run("scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}")

    def resume(self, name: str) -> None:
        self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)

    def undrain_all(self) -> None:
        for name in self.info.node_names:
            self.run("scontrol", "update", f"nodename={name}", "state=undrain", check=False)

    def cancel_all(self) -> None:
        self.run("scancel", "--user=root", check=False)

    def process(self, name: str) -> int | None:
        for p in self.info.processes:
            if p.name == name:
                return p.pid
        return None

    def pid_of(self, exe: str) -> int | None:
        """The live pid of a Slurm daemon of this cluster (by executable and run dir)."""
        root = str(self.info.run_dir)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.split(") ", 1)[-1].startswith("Z"):
                continue
            if argv and os.path.basename(argv[0].decode()) == exe and root.encode() in environ:
                return int(entry.name)
        return None

    def signal(self, exe: str, sig: signal.Signals) -> None:
        pid = self.pid_of(exe)
        assert pid is not None, f"{exe} not running"
        os.kill(pid, sig)

    def start_slurmctld(self) -> subprocess.Popen[bytes]:
        """A new slurmctld that recovers the saved state (no -i), swept with the run dir."""
        log = open(self.info.logs_dir / "slurmctld-restarted.log", "ab")  # noqa: SIM115
        return subprocess.Popen(
            ["slurmctld", "-D"],
            env=self.env,
            stdout=log,
            stderr=log,
            cwd=self.info.run_dir,
            start_new_session=True,
        )


class RunningSyncer(SyncerThread):
    """The real syncer on its own event loop in a thread, on the local cluster (the tests
    stay synchronous); :class:`gpufleet.slurm.background.SyncerThread` does the work."""

    def __init__(
        self, info: ClusterInfo, settings: SyncSettings, metrics: SyncerMetrics | None = None
    ) -> None:
        assert info.slurmrestd_url and info.slurm_jwt and info.slurm_conf
        # The scontrol of the cluster's release (24.11's runs in its root).
        scontrol = str(info.slurm_bin_dir / "scontrol") if info.slurm_bin_dir else "scontrol"
        endpoints = SlurmEndpoints(
            info.kubeconfig, info.slurmrestd_url, info.slurm_jwt, info.slurm_conf, scontrol=scontrol
        )
        super().__init__(endpoints, settings, metrics)
        self.info = info

    def passed(self, kube: Kube, node: str, timeout: float = 30) -> None:
        """Wait until the syncer has looked at ``node`` as it is now in Kubernetes.

        First its watch delivers the Node at the apiserver's current resourceVersion (or
        later), then two more passes of the Slurm loop finish: the second began after the
        change was seen, so it polled Slurm and reconciled every node with both views
        fresh. What a test asserts next ("nothing changed") is what the syncer decided,
        not what it had no time to do.
        """
        assert self.syncer is not None
        syncer = self.syncer
        rv = int(kube.node(node)["metadata"]["resourceVersion"])

        def seen() -> bool:
            known = syncer.nodes.get(node) or {}
            return int((known.get("metadata") or {}).get("resourceVersion") or 0) >= rv

        wait_for(f"the syncer's watch to deliver {node} at {rv}", seen, timeout, step=0.02)
        start = syncer.stats.passes
        wait_for("two syncer passes", lambda: syncer.stats.passes >= start + 2, timeout, step=0.02)
