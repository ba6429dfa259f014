"""gpufleet's data on a Node, read and written by one codec for every product.

The lifecycle record (``gpufleet.io/record``) is read by the controller, the
agent, the Slurm syncer, the CLI and the demo; this module is the one place
that parses it, and says how far it can be trusted:

- ``SIGNED``: carries a valid signature (``gpufleet.io/record-signature``) by a
  key the reader holds: the controller wrote it;
- ``UNSIGNED``: no signature (a record of an earlier version, or someone else's);
- ``INVALID``: a signature that does not verify (forged, copied from another
  node, or signed by a key this reader does not have);
- ``UNREADABLE``: not a record at all; ``ABSENT``: no record.

Only the controller holds the key (a Secret no other identity may read), so only
it can tell ``SIGNED`` from the rest; other readers get ``UNVERIFIED`` for a
record with a signature and rely on the admission policy that lets only the
controller's identity write these annotations (docs/decisions/0144). The
signature covers the node's name, so a record copied to another Node does not
verify. Pure: hashing only, no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.records import NodeRecord, record_from_json, record_to_json

SCHEME = "v1"


class Trust(enum.Enum):
    SIGNED = "signed"
    UNVERIFIED = "unverified"
    UNSIGNED = "unsigned"
    INVALID = "invalid"
    UNREADABLE = "unreadable"
    ABSENT = "absent"


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A key the controller signs with; ``kid`` names it in every signature."""

    kid: str
    secret: bytes

    @classmethod
    def of(cls, secret: bytes) -> SigningKey:
        """A key whose id is derived from its bytes (first 12 hex digits of SHA-256)."""
        if len(secret) < 16:
            raise ValueError("a signing key needs at least 16 bytes")
        return cls(hashlib.sha256(secret).hexdigest()[:12], secret)


def sign(key: SigningKey, node: str, purpose: str, text: str) -> str:
    """``v1:<kid>:<hex>``: HMAC-SHA256 over purpose, node name and text."""
    mac = hmac.new(key.secret, f"{purpose}\n{node}\n{text}".encode(), hashlib.sha256)
    return f"{SCHEME}:{key.kid}:{mac.hexdigest()}"


def verify(
    keys: Sequence[SigningKey], node: str, purpose: str, text: str, signature: str | None
) -> Trust:
    """How far ``text`` on ``node`` can be trusted, given the signature beside it."""
    if not signature:
        return Trust.UNSIGNED
    scheme, _, rest = signature.partition(":")
    kid, _, _ = rest.partition(":")
    if not keys:
        return Trust.UNVERIFIED
    for key in keys:
        if key.kid == kid and scheme == SCHEME:
            return (
                Trust.SIGNED
                if hmac.compare_digest(sign(key, node, purpose, text), signature)
                else Trust.INVALID
            )
    return Trust.INVALID


RECORD = "record"
MARK = "bmc-action"


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A Node's lifecycle record as stored, and how far it can be trusted."""

    record: NodeRecord | None
    trust: Trust
    problem: str = ""
    """Why it cannot be used (unreadable or not trusted), in words."""

    @property
    def trusted(self) -> bool:
        """Written by the controller as far as this reader can tell: signed, or
        unverified (a reader without the key relies on admission)."""
        return self.record is not None and self.trust in (Trust.SIGNED, Trust.UNVERIFIED)


def annotations_of(body: Mapping[str, Any]) -> Mapping[str, str]:
    return (body.get("metadata") or {}).get("annotations") or {}


def name_of(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def read_record(body: Mapping[str, Any], keys: Sequence[SigningKey] = ()) -> StoredRecord:
    """The record on a Node. ``keys``: the controller's (verifies); empty: any other reader."""
    ann = annotations_of(body)
    text = ann.get(well_known.ANNOTATION_RECORD)
    if not text:
        return StoredRecord(None, Trust.ABSENT)
    try:
        record = record_from_json(str(text))
    except ValueError as exc:
        return StoredRecord(None, Trust.UNREADABLE, f"the record cannot be read: {exc}"[:300])
    node = name_of(body)
    signature = ann.get(well_known.ANNOTATION_RECORD_SIGNATURE)
    trust = verify(keys, node, RECORD, str(text), signature)
    if trust is Trust.UNSIGNED and not keys:
        trust = Trust.UNVERIFIED if record.name == node else Trust.INVALID
    problem = ""
    if record.name != node:
        trust, problem = Trust.INVALID, f"the record names node {record.name}, not {node}"
    elif trust is Trust.INVALID:
        problem = "its signature does not verify (not written by this controller's key)"
    elif trust is Trust.UNSIGNED:
        problem = "it carries no signature"
    return StoredRecord(record, trust, problem)


def trusted_record(body: Mapping[str, Any]) -> NodeRecord | None:
    """The record, for a reader without the key (agent, syncer, CLI, demo): None when absent,
    unreadable, or naming another node."""
    stored = read_record(body)
    return stored.record if stored.trusted else None


def record_annotations(record: NodeRecord, key: SigningKey) -> dict[str, str]:
    """The record and its signature, to be written together in one patch."""
    text = record_to_json(record)
    return {
        well_known.ANNOTATION_RECORD: text,
        well_known.ANNOTATION_RECORD_SIGNATURE: sign(key, record.name, RECORD, text),
    }


def record_state(body: Mapping[str, Any]) -> str | None:
    """The state the stored record names (None: no readable record): for display."""
    stored = read_record(body)
    return stored.record.state.value if stored.record is not None else None


def mark_annotations(node: str, text: str, key: SigningKey) -> dict[str, str]:
    """A write-ahead mark and its signature, to be written together."""
    return {
        well_known.ANNOTATION_BMC_ACTION: text,
        well_known.ANNOTATION_BMC_ACTION_SIGNATURE: sign(key, node, MARK, text),
    }


def read_mark_text(body: Mapping[str, Any], keys: Sequence[SigningKey]) -> tuple[str | None, Trust]:
    """The raw write-ahead mark on a Node and how far it can be trusted."""
    ann = annotations_of(body)
    text = ann.get(well_known.ANNOTATION_BMC_ACTION)
    if not text:
        return None, Trust.ABSENT
    sig = ann.get(well_known.ANNOTATION_BMC_ACTION_SIGNATURE)
    return str(text), verify(keys, name_of(body), MARK, str(text), sig)
