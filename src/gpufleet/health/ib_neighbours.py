"""Which InfiniBand switch each HCA port is cabled to: the node's own view of its leaf.

sysfs says what the node's ports are (state, LID, the SM's LID, the HCA's node GUID;
:mod:`gpufleet.health.sysfs`) but not who is at the other end of the cable. One
directed-route query per port asks the neighbour itself, two SMPs and no fabric sweep
(``ibnetdiscover`` and ``iblinkinfo`` walk the whole subnet: thousands of MADs per node,
times every node of the fleet)::

    smpquery -C mlx5_0 -P 1 -D nodeinfo 0,1
    smpquery -C mlx5_0 -P 1 -D nodedesc 0,1

Their output (infiniband-diags of rdma-core: ``smpquery.c``; the fields are
``libibmad``'s ``_mad_dump_field``: the name, ``:``, dots up to 32 characters, the
value)::

    # Node info: DR path slid 65535; dlid 65535; 0,1
    BaseVers:........................1
    NodeType:........................Switch
    NumPorts:........................65
    SystemGuid:......................0xfc6a1c0300e7a940
    Guid:............................0xfc6a1c0300e7a940
    LocalPort:.......................17
    Node Description:................MF0;leaf-07:MQM9700/U1

This module is the one codec of that output (:func:`parse_nodeinfo`,
:func:`parse_nodedesc`), for the real backend, which runs the tool, and the simulated
one, which writes the same text. :func:`leaf_labels` turns the ports' neighbours into the
Node labels the agent publishes (decision 0249): a node's leaf is the switch of its
**rail 0**, the first InfiniBand port in HCA order (``mlx5_0`` before ``mlx5_1`` before
``mlx5_10``). On a rail-optimized fabric each of a node's eight HCAs is on another leaf,
and the nodes of one scalable unit share all eight: rail 0's leaf groups them as the set
would, and Slurm's tree and the scheduler labels take one switch per node.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpufleet.domain import well_known
from gpufleet.domain.topology import NAME
from gpufleet.health import sysfs
from gpufleet.health.hardware import HardwareError

REDISCOVER_S = 600.0
"""How often the agent asks again though nothing it can see changed."""

_FIELD = re.compile(r"^([A-Za-z][A-Za-z ]*):\.+(.*)$")
_GUID = re.compile(r"^0x([0-9a-fA-F]{1,16})$")
_MELLANOX_DESC = re.compile(r"^[^;:]*;([^;:]+):")
"""NVIDIA/Mellanox switches describe themselves ``MF0;<hostname>:<model>/<ASIC>``."""


@dataclass(frozen=True, slots=True)
class SmpNodeInfo:
    """The NodeInfo of the node at the far end of a port (None: not in the output)."""

    node_type: str | None
    node_guid: str | None
    """``0x`` and 16 lower-case hex digits."""
    system_guid: str | None
    num_ports: int | None
    local_port: int | None
    """The port of that node the query came in through: the switch port the cable is on."""


@dataclass(frozen=True, slots=True)
class Neighbour:
    """One HCA port and the switch port at the other end of its cable."""

    hca: str
    port: int
    switch_guid: str
    switch_port: int | None
    description: str | None

    @property
    def switch_name(self) -> str | None:
        return switch_name(self.description)


def _fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _FIELD.match(line.rstrip())
        if m:
            out.setdefault(m[1], m[2].strip())
    return out


def normalize_guid(raw: str | None) -> str | None:
    """``0xFC6A1C0300E7A940`` / ``0xfc6a...`` -> ``0xfc6a1c0300e7a940``; None for garbage."""
    m = _GUID.match((raw or "").strip())
    return f"0x{int(m[1], 16):016x}" if m else None


def _uint(raw: str | None) -> int | None:
    return int(raw) if raw is not None and raw.isdigit() else None


def parse_nodeinfo(text: str) -> SmpNodeInfo | None:
    """``smpquery nodeinfo`` output; None when it holds no node GUID (an error, a
    timeout's partial output)."""
    f = _fields(text)
    guid = normalize_guid(f.get("Guid"))
    if guid is None:
        return None
    return SmpNodeInfo(
        node_type=f.get("NodeType"),
        node_guid=guid,
        system_guid=normalize_guid(f.get("SystemGuid")),
        num_ports=_uint(f.get("NumPorts")),
        local_port=_uint(f.get("LocalPort")),
    )


def parse_nodedesc(text: str) -> str | None:
    """``smpquery nodedesc`` output -> the description; None when absent or empty."""
    desc = _fields(text).get("Node Description")
    return desc or None


def switch_name(description: str | None) -> str | None:
    """The switch's name in its NodeDescription: the hostname of an NVIDIA/Mellanox
    ``MF0;leaf-07:MQM9700/U1``, or the whole description when it is a name (a label
    value Slurm takes as one word); None otherwise (``Quantum Mellanox Technologies``)."""
    if not description:
        return None
    m = _MELLANOX_DESC.match(description)
    candidate = m[1] if m else description
    return candidate if NAME.fullmatch(candidate) else None


def neighbour(hca: str, port: int, nodeinfo: str, nodedesc: str | None) -> Neighbour | None:
    """The switch at the far end of ``hca``/``port`` from the two queries' output; None
    when the answer is no switch (a back-to-back cable reaches another HCA: no leaf)."""
    info = parse_nodeinfo(nodeinfo)
    if info is None or info.node_guid is None or info.node_type != "Switch":
        return None
    desc = parse_nodedesc(nodedesc) if nodedesc is not None else None
    return Neighbour(hca, port, info.node_guid, info.local_port, desc)


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def rails(ports: Iterable[sysfs.IbPort]) -> list[sysfs.IbPort]:
    """The InfiniBand ports in rail order (HCA by natural name, then port); RoCE
    (Ethernet link layer) ports have no subnet manager to ask and are left out."""
    ib = [p for p in ports if (p.link_layer or "InfiniBand") == "InfiniBand"]
    return sorted(ib, key=lambda p: (_natural(p.hca), p.port))


Ask = Callable[[str, int], Neighbour | None]
"""(HCA, port) -> the switch at the other end, or None (unknown)."""


@dataclass(frozen=True, slots=True)
class LeafView:
    """What the node sees of its leaves: one entry per rail (None: unknown)."""

    rails: tuple[tuple[str, int, Neighbour | None], ...]

    @property
    def leaf(self) -> Neighbour | None:
        """Rail 0's switch, the node's leaf (None: rail 0 unknown or no rail)."""
        return self.rails[0][2] if self.rails else None

    def describe(self) -> str:
        """One line for the log: each rail and its switch port."""
        return ", ".join(
            f"{hca}/{port}->"
            + (f"{n.switch_guid}[{n.switch_port}]" if n is not None else "unknown")
            for hca, port, n in self.rails
        )


def discover(ports: Sequence[sysfs.IbPort], ask: Ask) -> LeafView:
    """Ask the far end of each active rail (a port not ACTIVE has no neighbour to ask)."""
    seen: list[tuple[str, int, Neighbour | None]] = []
    for p in rails(ports):
        seen.append((p.hca, p.port, ask(p.hca, p.port) if p.state == "ACTIVE" else None))
    return LeafView(tuple(seen))


def leaf_labels(view: LeafView | None) -> dict[str, str | None] | None:
    """The agent's leaf labels: rail 0's switch GUID and name; both removed on a node
    whose HCAs have no InfiniBand port (RoCE only); None (leave them as they are) while
    rail 0's neighbour is unknown or sysfs has no InfiniBand class (``view`` None: no
    driver yet, read as unknown like the port monitor does): a port that is down or a
    query that timed out is no move, and the labels stay until the node says otherwise."""
    if view is None:
        return None
    if not view.rails:
        return {well_known.LABEL_IB_SEEN_LEAF: None, well_known.LABEL_IB_SEEN_LEAF_NAME: None}
    leaf = view.leaf
    if leaf is None:
        return None
    return {
        well_known.LABEL_IB_SEEN_LEAF: leaf.switch_guid,
        well_known.LABEL_IB_SEEN_LEAF_NAME: leaf.switch_name,
    }


def render_nodeinfo(
    switch_guid: str, local_port: int, *, num_ports: int = 65, node_type: str = "Switch"
) -> str:
    """``smpquery -D nodeinfo`` output for a neighbour (the simulated backend's answer)."""
    rows = [
        ("BaseVers", "1"),
        ("ClassVers", "1"),
        ("NodeType", node_type),
        ("NumPorts", str(num_ports)),
        ("SystemGuid", switch_guid),
        ("Guid", switch_guid),
        ("PortGuid", switch_guid),
        ("PartCap", "8"),
        ("DevId", "0xd2f2"),
        ("Revision", "0x000000a0"),
        ("LocalPort", str(local_port)),
        ("VendorId", "0x0002c9"),
    ]
    head = "# Node info: DR path slid 65535; dlid 65535; 0,1\n"
    return head + "".join(f"{k}:{'.' * (32 - len(k))}{v}\n" for k, v in rows)


def render_nodedesc(description: str) -> str:
    """``smpquery -D nodedesc`` output (the simulated backend's answer)."""
    dots = "." * (32 - len(description)) if len(description) < 32 else "."
    return f"Node Description:{dots}{description}\n"


class LeafDiscovery:
    """Asks the hardware for the ports' neighbours when something may have moved: at
    start, when a port's state, its HCA (a new node GUID: replaced hardware), its subnet
    manager or its ``link_downed`` count changes (a cable pulled and plugged in again,
    too fast for a poll to see the port down), and every ``every_s`` otherwise."""

    def __init__(self, ask: Callable[[str, int], tuple[str, str | None]], every_s: float) -> None:
        self._ask = ask
        self.every_s = every_s
        self._key: tuple[tuple[object, ...], ...] | None = None
        self._due = float("-inf")
        self.view: LeafView | None = None
        self.errors: dict[str, str] = {}
        """``hca/port`` -> why its neighbour is unknown (the last discovery)."""

    def labels(
        self, ports: Sequence[sysfs.IbPort] | None, now: float
    ) -> dict[str, str | None] | None:
        """The leaf labels (see :func:`leaf_labels`), asking again only when due
        (``ports`` None: no InfiniBand class in sysfs, unknown)."""
        if ports is None:
            self.view, self._key = None, None
            return leaf_labels(None)
        key = tuple(
            (p.hca, p.port, p.state, p.node_guid, p.sm_lid, p.counters.get("link_downed"))
            for p in rails(ports)
        )
        if key != self._key or now >= self._due:
            self._key, self._due = key, now + self.every_s
            self.errors = {}
            self.view = discover(ports, self._query)
        return leaf_labels(self.view)

    def _query(self, hca: str, port: int) -> Neighbour | None:
        try:
            info, desc = self._ask(hca, port)
        except HardwareError as exc:  # unknown, never a fault
            self.errors[f"{hca}/{port}"] = str(exc)
            return None
        found = neighbour(hca, port, info, desc)
        if found is None:
            self.errors[f"{hca}/{port}"] = "the far end is no switch"
        return found
