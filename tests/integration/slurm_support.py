"""Helpers for the Slurm integration tests: a syncer in a thread, Node patches, Slurm state."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from waiting import wait_for

from gpufleet.domain import well_known
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.kubeapi import KubeApi
from gpufleet.slurm.metrics import SyncerMetrics
from gpufleet.slurm.restapi import RestConfig, SlurmRest
from gpufleet.slurm.scontrol import Scontrol, ScontrolConfig
from gpufleet.slurm.syncer import Syncer, SyncSettings


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


class RunningSyncer:
    """The real syncer on its own event loop in a thread (the tests stay synchronous)."""

    def __init__(
        self, info: ClusterInfo, settings: SyncSettings, metrics: SyncerMetrics | None = None
    ) -> None:
        self.info, self.settings, self.metrics = info, settings, metrics
        self.loop = asyncio.new_event_loop()
        self.syncer: Syncer | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="syncer")
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._run())
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # surfaced by stop()
            self.error = e
            self._ready.set()

    async def _run(self) -> None:
        assert self.info.slurmrestd_url and self.info.slurm_jwt and self.info.slurm_conf
        kube = await KubeApi.connect(str(self.info.kubeconfig))
        rest = SlurmRest(RestConfig(self.info.slurmrestd_url, "root", self.info.slurm_jwt))
        scontrol = Scontrol(ScontrolConfig(env={"SLURM_CONF": str(self.info.slurm_conf)}))
        self.syncer = Syncer(
            kube=kube, rest=rest, scontrol=scontrol, settings=self.settings, metrics=self.metrics
        )
        self._task = asyncio.ensure_future(self.syncer.run())

        async def mark_ready() -> None:
            assert self.syncer is not None
            await self.syncer.synced.wait()
            self._ready.set()

        ready = asyncio.ensure_future(mark_ready())
        try:
            await self._task
        finally:
            ready.cancel()
            await rest.aclose()

    def start(self, timeout: float = 30) -> RunningSyncer:
        self._thread.start()
        assert self._ready.wait(timeout), "syncer did not complete a first pass"
        if self.error:
            raise self.error
        return self

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

    def stop(self) -> None:
        if self._task is not None:
            self.loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
        if self.error:
            raise self.error
