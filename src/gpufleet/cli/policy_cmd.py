"""``gpufleet policy``: explain and validate remediation policies."""

from __future__ import annotations

import typer

app = typer.Typer(help="Explain and validate remediation policies.", no_args_is_help=True)
