#!/usr/bin/env bash
# Prints a Go toolchain that can build the local cluster: $GO, then `go` on PATH,
# then /usr/local/go, if one of them is >= 1.21 (it then switches to the
# version the modules ask for by itself); otherwise one fetched from the Go
# module proxy into the gpufleet cache (scripts/fetch-go.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
go_minor() { "$1" env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p'; }
for candidate in "${GO:-}" "$(command -v go || true)" /usr/local/go/bin/go; do
  if [[ -n "$candidate" && -x "$candidate" ]]; then
    minor="$(go_minor "$candidate")"
    if [[ -n "$minor" && "$minor" -ge 21 ]]; then echo "$candidate"; exit 0; fi
  fi
done
version="${GO_FETCH_VERSION:-1.26.8}"
echo "  no Go >= 1.21 on this machine: fetching go$version from the module proxy" >&2
"$root/scripts/fetch-go.sh" "$version" "${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}/go" || {
  echo "find-go: no Go toolchain here and none could be fetched." >&2
  echo "  Install Go >= 1.26 from https://go.dev/dl or set GO=/path/to/go." >&2
  exit 1
}
