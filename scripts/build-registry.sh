#!/usr/bin/env bash
# Builds the CNCF distribution registry (the reference OCI registry,
# github.com/distribution/distribution/v3/cmd/registry) from the Go module proxy
# into the gpufleet cache (${GPUFLEET_CACHE:-~/.cache/gpufleet}/bin/registry-<version>/registry),
# for the test that pushes the packaged chart to an OCI registry and installs it
# from there (tests/integration/test_chart_oci.py). Skipped when already built.
set -euo pipefail
version="${REGISTRY_VERSION:-v3.1.2}"
cache="${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}"
out="$cache/bin/registry-$version"
if [[ -x "$out/registry" ]]; then echo "  registry $version: cached"; exit 0; fi
go_bin="$("$(dirname "${BASH_SOURCE[0]}")/find-go.sh")"
mkdir -p "$out"
echo "  registry $version: building github.com/distribution/distribution/v3/cmd/registry (log: $out/build.log)"
start=$(date +%s)
if ! GOBIN="$out" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
    "$go_bin" install -trimpath \
    -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$version" \
    "github.com/distribution/distribution/v3/cmd/registry@$version" > "$out/build.log" 2>&1; then
  echo "build-registry: FAILED; last lines of $out/build.log:" >&2
  tail -20 "$out/build.log" >&2
  exit 1
fi
echo "  registry $version: built in $(( $(date +%s) - start )) s"
