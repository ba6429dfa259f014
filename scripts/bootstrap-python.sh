#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
#
# Idempotent: the install runs again only when pyproject.toml changed since the
# last successful install (a hash is kept in .venv/.gpufleet-installed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
extras="${GPUFLEET_EXTRAS:-dev}"
stamp="$venv/.gpufleet-installed"
want="$(cat "$root/pyproject.toml" | sha256sum | cut -d' ' -f1) extras=$extras"

# One install at a time: a second run waits for the first, then finds it done.
exec 9>"$root/.venv.lock"
flock 9

if [[ ! -x "$venv/bin/python" ]]; then
    echo "[bootstrap] creating virtual environment in $venv" >&2
    python3 -m venv "$venv"
fi
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
echo "[bootstrap] installing Python dependencies (extras: $extras)" >&2
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e "$root[$extras]"
echo "$want" > "$stamp"
