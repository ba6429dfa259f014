"""XIDs 144-150 (NVLink5: GB200, B200, B300): what one message asks for.

NVIDIA's catalogue does not give these XIDs one action: its sheet "XID
144-150 Decode" gives one per sub-unit (``RLW_REMAP``, ``NETIR_LINK_EVT``...)
and error status (the second register in the parentheses). Many
combinations are ``IGNORE`` (corrected or sympathetic), some ``RESET_GPU``,
some ``XID_154_EVAL`` (do what an accompanying XID 154 says; without one,
restart the application). Resetting the GPU for every XID 145 would take
healthy GB200 nodes out of production, so the bucket is decoded from the
message itself.

Message format (catalogue, bucket WORKFLOW_NVLINK5_ERR)::

    Xid (PCI:0000:BB:DF): <xid>, <sub-unit> <Fatal|Nonfatal> XC<n> i<n> Link <n>
        (<intrInfo> <errorStatus> <debug0> ... <debug4>)

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, sheet
"XID 144-150 Decode" (the edition with the V2 decode for drivers >= R575).
Pure data and one function: the agent and the controller both call
:func:`bucket` through the policy, so they cannot disagree.
"""

from __future__ import annotations

import re
from enum import StrEnum

FAMILY = frozenset(range(144, 151))
"""The XIDs whose action depends on the message (NVIDIA: WORKFLOW_NVLINK5_ERR)."""


class Bucket(StrEnum):
    """NVIDIA's immediate action for one decoded NVLink5 message."""

    IGNORE = "IGNORE"
    RESET_GPU = "RESET_GPU"
    XID_154_EVAL = "XID_154_EVAL"


_I, _R, _E = Bucket.IGNORE, Bucket.RESET_GPU, Bucket.XID_154_EVAL

# (xid, sub-unit) -> {error status: bucket}; the sub-unit names as the driver
# prints them (both the <R575 and the >=R575 spelling where they differ).
_TABLE: dict[tuple[int, str], dict[int, Bucket]] = {
    (144, "SAW_MVB"): {0x1: _I, 0x2: _R, 0x4: _I, 0x8: _I, 0x10: _R, 0x20: _I},
    (145, "RLW_CTRL"): {0x80000000: _I},
    (145, "RLW_REMAP"): {
        0x1: _E,
        0x2: _E,
        0x4: _E,
        0x8: _E,
        0x10: _E,
        0x20: _E,
        0x40: _R,
        0x80: _R,
        0x100: _I,
        0x200: _I,
        0x80000000: _I,
    },
    (145, "RLW_RSPCOL"): {0x1: _I, 0x2: _R, 0x80000000: _I},
    (145, "RLW_RXPIPE"): {0x1: _I, 0x2: _I, 0x4: _I, 0x8: _I, 0x80000000: _I},
    (145, "RLW_SRC_TRACK"): {
        0x1: _R,
        0x2: _I,
        0x4: _E,
        0x8: _E,
        0x10: _R,
        0x20: _R,
        0x80000000: _I,
    },
    (145, "RLW_TAGSTATE"): {
        0x1: _I,
        0x2: _R,
        0x10000: _I,
        0x20000: _R,
        0x100000: _R,
        0x80000000: _I,
    },
    (147, "TREX"): {0x1: _I, 0x80000000: _I},
    (148, "NVLPW_CTRL"): {0x80000000: _I},
    (148, "NVLPW"): {0x80000000: _I},
}
for _unit in ("TLW_CTRL",):
    _TABLE[(146, _unit)] = {0x1: _I, 0x2: _I, 0x4: _R, 0x80000000: _I}
for _unit in ("TLW_RX", "TLW_RX_PIPE0", "TLW_RX_PIPE1", "TLW_TX", "TLW_TX_PIPE0", "TLW_TX_PIPE1"):
    _TABLE[(146, _unit)] = {0x1: _I, 0x2: _I, 0x4: _R, 0x80000000: _I}

_NETIR_LINK_IGNORE = frozenset({0b100110, 0b101000})
"""NETIR_LINK_EVT link-down reasons (IntrInfo bits 20-25) whose action is IGNORE;
every other reason is "Link Fatal" and needs a GPU reset."""
_NETIR_BER_IGNORE = frozenset({0x0, 0x1, 0x2, 0x3})
_NETIR_MFDE = {0x1: _R, 0x3: _I, 0x4: _R, 0x5: _R, 0x7: _R}

_MESSAGE = re.compile(
    r"\):\s*(?P<xid>1(?:4[4-9]|50)),\s*(?P<unit>[A-Za-z0-9_]+)\s+(?P<sev>Fatal|Nonfatal)\b"
    r"[^(]*\(\s*(?P<intr>0x[0-9a-fA-F]+)\s+(?P<status>0x[0-9a-fA-F]+)"
)


def bucket(xid: int, message: str) -> Bucket | None:
    """NVIDIA's action for one NVLink5 XID message; None when ``xid`` is not in
    the family. A message that cannot be decoded gets the action its own
    severity word implies (``Fatal``: reset; ``Nonfatal``: ignore) and, with no
    severity word either, a reset: an undecodable error is not waved through."""
    if xid not in FAMILY:
        return None
    m = _MESSAGE.search(message)
    if m is None or int(m["xid"]) != xid:
        return _R if "Nonfatal" not in message else _I
    unit, fatal = m["unit"].upper(), m["sev"] == "Fatal"
    intr, status = int(m["intr"], 16), int(m["status"], 16)
    if xid == 150:
        return _R  # MSE degraded / watchdog: always fatal
    if xid == 149:
        if unit.startswith("NETIR_LINK"):
            reason = (intr >> 20) & 0x3F
            return _I if reason in _NETIR_LINK_IGNORE else _R
        if unit.startswith("NETIR_BER"):
            return _I if status in _NETIR_BER_IGNORE else (_R if fatal else _I)
        if unit.startswith("NETIR_MFDE"):
            return _NETIR_MFDE.get(status, _R if fatal else _I)
        return _R if fatal else _I  # NETIR / NETIR_INT: "Link Fatal"
    by_status = _TABLE.get((xid, unit))
    if by_status is not None and status in by_status:
        found = by_status[status]
        # RLW_RXPIPE 0x1-0x4 are promoted to a reset ("Action 2") when the driver
        # itself reports them as fatal.
        if found is _I and fatal and (xid, unit) == (145, "RLW_RXPIPE"):
            return _R
        return found
    return _R if fatal else _I
