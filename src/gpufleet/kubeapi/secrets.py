"""Secret ``data`` is base64: decoded and encoded here only.

The lifecycle controller (a Node's BMC Secret), the provisioning service (a
Machine's BMC Secret) and the demo (writing BMC Secrets) share this, so a
Secret reads the same everywhere.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any


def decode_data(secret: Mapping[str, Any]) -> dict[str, str]:
    """Every key of the Secret's ``data``, decoded as UTF-8 text."""
    data = secret.get("data") or {}
    return {str(k): base64.b64decode(v).decode() for k, v in data.items()}


def encode_data(values: Mapping[str, str]) -> dict[str, str]:
    """``data`` for a Secret holding these text values."""
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
