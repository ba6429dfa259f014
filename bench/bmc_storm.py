"""BMCs with realistic timings for bench/reaction.py's ``--bmc``: the repository's Redfish
emulator (:mod:`gpufleet.local.redfish`, one child process, one endpoint per node on
127.0.0.1) serving the nodes a storm will fault, each BMC given its Secret and its Node
the ``gpufleet.io/bmc-secret`` annotation, as production does.

Real BMCs are slow and uneven: a graceful reset waits minutes for the OS to shut down, a
boot (POST of an 8-GPU server, then the OS) takes minutes, some BMCs answer a reset only
after seconds, and now and then one refuses a reset or fails it. Every BMC here draws
its own timings and misbehaviour from one seeded generator (:class:`Timings`), so a
storm's ladder work is spread out in time as it is on a real fleet, not every rung
failing (or succeeding) at once, and a run can be repeated with its seed.

What the bench reads back: the Reset POSTs the emulator received, counted from its log
(one line per request: cheap, no request to 3,000 BMCs in the middle of a round), its
CPU, and at the end every BMC's counters (``Oem.Gpufleet``) read over Redfish; and from
the controller's ``/metrics`` the BMC steps it ran and how they ended
(``gpufleet_actions_total``, ``gpufleet_remediation_step_seconds``).

Imported by bench/reaction.py after it put ``tests`` and ``tests/integration`` on the path.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import statistics
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.local import processes
from gpufleet.local.cluster import LocalCluster
from integration.controller_harness import Api, add_bmc_secret
from procstat import process_cpu_seconds

USER = "bench"
POLL_INTERVAL_S = 5.0
"""How often each BMC's server thread wakes to look for a shutdown request (the
emulator's default is 0.5 s). The emulator is never shut down that way here (it exits on
SIGTERM), and 3,000 threads waking twice a second cost CPU the bench would measure."""
_RESET_LINE = re.compile(
    rb'"POST /redfish/v1/Systems/1/Actions/ComputerSystem\.Reset [^"]*" (\d{3})'
)


@dataclass(frozen=True)
class Timings:
    """How the BMCs' timings and misbehaviour are drawn (uniformly in each range)."""

    seed: int
    boot_s: tuple[float, float] = (90.0, 300.0)
    """PowerState reads Off after a reset until the machine has booted."""
    shutdown_s: tuple[float, float] = (20.0, 90.0)
    """A graceful reset waits this long for the OS to shut down."""
    slow_share: float = 0.15
    """BMCs that answer every Reset POST only after :attr:`slow_s` (the reset performed)."""
    slow_s: tuple[float, float] = (2.0, 8.0)
    refuse_share: float = 0.05
    """BMCs that refuse their first Reset POST (503, not performed)."""
    fail_share: float = 0.05
    """BMCs that perform their first reset and answer it 500 (the answer is lost)."""

    def describe(self) -> str:
        return (
            f"seed {self.seed}; boot {self.boot_s[0]:g}-{self.boot_s[1]:g} s, OS shutdown"
            f" {self.shutdown_s[0]:g}-{self.shutdown_s[1]:g} s; {self.slow_share:.0%} answer"
            f" resets after {self.slow_s[0]:g}-{self.slow_s[1]:g} s, {self.refuse_share:.0%}"
            f" refuse the first reset (503), {self.fail_share:.0%} fail it (performed, 500)"
        )


@dataclass(frozen=True)
class Bmc:
    """One node's BMC as drawn: its config entry and the switches set at start."""

    node: str
    port: int
    boot_s: float
    shutdown_s: float
    control: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kind(self) -> str:
        if "refuse" in self.control:
            return "refuses once"
        if "failAfterReset" in self.control:
            return "fails once"
        if "slowAnswers" in self.control:
            return "slow answers"
        return "well-behaved"


def draw(nodes: list[str], ports: list[int], timings: Timings) -> list[Bmc]:
    """Every node's BMC, drawn from ``timings.seed`` (the same nodes and seed: the same BMCs)."""
    rng = random.Random(timings.seed)
    out = []
    for node, port in zip(nodes, ports, strict=True):
        boot = round(rng.uniform(*timings.boot_s), 1)
        shutdown = round(rng.uniform(*timings.shutdown_s), 1)
        r = rng.random()
        control: dict[str, Any] = {}
        if r < timings.refuse_share:
            control = {"refuse": 1}
        elif r < timings.refuse_share + timings.fail_share:
            control = {"failAfterReset": 1}
        elif r < timings.refuse_share + timings.fail_share + timings.slow_share:
            control = {
                "slowAnswers": 1000,
                "slowAnswerSeconds": round(rng.uniform(*timings.slow_s), 1),
            }
        out.append(Bmc(node, port, boot, shutdown, control))
    return out


class Emulator:
    """The emulator process serving ``bmcs``, started as part of ``cluster`` (stopped with
    it, also when the bench is killed)."""

    def __init__(self, cluster: LocalCluster, run_dir: Path, bmcs: list[Bmc]) -> None:
        self.bmcs = bmcs
        self.password = secrets.token_hex(8)
        config = {
            "user": USER,
            "password": self.password,
            "poll_interval": POLL_INTERVAL_S,
            "bmcs": [
                {
                    "node": b.node,
                    "port": b.port,
                    "boot_seconds": b.boot_s,
                    "os_shutdown_seconds": b.shutdown_s,
                    "reset_restarts_boot": True,
                }
                for b in bmcs
            ],
        }
        path = run_dir / "bench-bmcs.json"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        self.log = run_dir / "logs" / "bench-bmcs.log"
        self.proc = cluster.launch(
            processes.ManagedProcess(
                "bench-bmcs",
                [sys.executable, "-m", "gpufleet.local.redfish", str(path)],
                self.log,
            )
        )
        self._http = httpx.Client(auth=(USER, self.password), timeout=10)
        self._read_at = 0
        self._posts: Counter[str] = Counter()
        """Reset POSTs seen in the log so far, by HTTP status."""

    @classmethod
    def start(
        cls, cluster: LocalCluster, run_dir: Path, nodes: list[str], timings: Timings
    ) -> Emulator:
        """Draw the BMCs of ``nodes``, serve them, set their misbehaviour switches."""
        bmcs = draw(nodes, processes.free_ports(len(nodes)), timings)
        emu = cls(cluster, run_dir, bmcs)
        emu.proc.wait_ready(
            emu._serving, timeout=300, what=f"serving {len(bmcs)} BMCs", interval=0.5
        )
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(emu._control, [b for b in bmcs if b.control]))
        return emu

    def _serving(self) -> bool:
        try:
            return all(self._http.get(f"{b.url}/redfish/v1").status_code == 200 for b in self.bmcs)
        except httpx.HTTPError:
            return False

    def _control(self, bmc: Bmc) -> None:
        r = self._http.patch(f"{bmc.url}/gpufleet/control", json=bmc.control)
        r.raise_for_status()

    def give_secrets(self, api: Api) -> None:
        """A Secret per BMC (namespace ``gpufleet-system``, plain http) and its Node's
        annotation, as the integration tests and the demo write them."""
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(
                    lambda b: add_bmc_secret(api, b.node, b.url, USER, self.password), self.bmcs
                )
            )

    def describe(self) -> str:
        kinds = Counter(b.kind() for b in self.bmcs)
        boots = [b.boot_s for b in self.bmcs]
        shutdowns = [b.shutdown_s for b in self.bmcs]
        return (
            f"{len(self.bmcs)} BMCs (pid {self.proc.pid}): boot median"
            f" {statistics.median(boots):.0f} s ({min(boots):.0f}-{max(boots):.0f}), OS"
            f" shutdown median {statistics.median(shutdowns):.0f} s"
            f" ({min(shutdowns):.0f}-{max(shutdowns):.0f}); "
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        )

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def posts(self) -> Counter[str]:
        """Reset POSTs the emulator answered so far, by HTTP status (read from its log up
        to its last complete line)."""
        with self.log.open("rb") as f:
            f.seek(self._read_at)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._read_at += end
        for m in _RESET_LINE.finditer(data[:end]):
            self._posts[m.group(1).decode()] += 1
        return Counter(self._posts)

    def counters(self) -> dict[str, int]:
        """Every BMC's ``Oem.Gpufleet`` counters summed (a request per BMC: at the end)."""

        def one(b: Bmc) -> dict[str, Any]:
            r = self._http.get(f"{b.url}/redfish/v1/Systems/1")
            r.raise_for_status()
            oem: dict[str, Any] = r.json()["Oem"]["Gpufleet"]
            return oem

        total: Counter[str] = Counter()
        with ThreadPoolExecutor(8) as pool:
            for oem in pool.map(one, self.bmcs):
                for key in ("ResetPosts", "ResetCount", "GracefulJoined", "BootCount"):
                    total[key] += int(oem.get(key) or 0)
                for kind, n in (oem.get("ResetPostsByType") or {}).items():
                    total[f"posts {kind}"] += int(n)
        return dict(total)

    def close(self) -> None:
        self._http.close()


def count_posts(before: Counter[str], after: Counter[str]) -> tuple[int, str]:
    """Reset POSTs between two :meth:`Emulator.posts` readings: how many, and by status."""
    diff = after - before
    return sum(diff.values()), ", ".join(f"{k} x{v}" for k, v in sorted(diff.items())) or "none"


def _samples(metrics: str, family: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of one metric family of the controller's /metrics: (sample name,
    labels, value), parsed by prometheus_client."""
    return [
        (s.name, s.labels, s.value)
        for f in text_string_to_metric_families(metrics)
        if f.name == family
        for s in f.samples
    ]


def controller_steps(metrics: str) -> dict[str, tuple[float, float]]:
    """The controller's finished remediation steps: ``"step outcome"`` -> (count, seconds
    in all), from ``gpufleet_remediation_step_seconds``."""
    out: dict[str, list[float]] = {}
    for name, labels, value in _samples(metrics, "gpufleet_remediation_step_seconds"):
        part = name.rsplit("_", 1)[1]
        if part in ("count", "sum"):
            key = f"{labels.get('step', '')} {labels.get('outcome', '')}"
            out.setdefault(key, [0.0, 0.0])[0 if part == "count" else 1] = value
    return {k: (v[0], v[1]) for k, v in sorted(out.items()) if v[0]}


def controller_bmc_actions(metrics: str) -> dict[str, float]:
    """The controller's BMC acts (``bmc-reboot ok``, ``bmc-power-cycle failed``, ...), from
    ``gpufleet_actions_total``."""
    out: dict[str, float] = {}
    for name, labels, value in _samples(metrics, "gpufleet_actions"):
        if name.endswith("_total") and labels.get("action", "").startswith("bmc-") and value:
            out[f"{labels['action']} {labels.get('result', '')}"] = value
    return dict(sorted(out.items()))


def step_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> str:
    """The steps finished between two :func:`controller_steps` readings, with their mean
    duration: ``reboot failed x12 (mean 84 s)``."""
    parts = []
    for key, (n, total) in after.items():
        n0, t0 = before.get(key, (0.0, 0.0))
        if n > n0:
            parts.append(f"{key} x{n - n0:.0f} (mean {(total - t0) / (n - n0):.0f} s)")
    return ", ".join(parts) or "none"
