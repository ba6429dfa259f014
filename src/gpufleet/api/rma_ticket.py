"""The RMA ticket webhook's JSON schema, committed for receivers:
``python -m gpufleet.api.rma_ticket`` writes ``docs/schemas/rma-ticket.schema.json``.

The schema is generated from the payload model
(:class:`gpufleet.domain.rma_payload.TicketPayload`); ``tests/unit/api/test_rma_ticket.py``
fails when the committed file differs from :func:`render`, so the contract a ticketing
system is built against is the one the controller sends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpufleet.domain.rma_payload import payload_schema

PATH = "docs/schemas/rma-ticket.schema.json"
"""Where the committed copy lives, relative to the repository root."""


def render() -> str:
    return json.dumps(payload_schema(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else PATH)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    print(out)


if __name__ == "__main__":
    main()
