#!/usr/bin/env bash
# Builds helm v3 from the Go module proxy into the gpufleet cache
# (${GPUFLEET_CACHE:-~/.cache/gpufleet}/bin/helm-<version>/helm), for the chart
# tests (tests/integration/test_slurm_chart.py). Skipped when already built.
# Run it after the Kubernetes builds: on 2 cores it takes about 10 minutes.
set -euo pipefail
version="${HELM_VERSION:-v3.22.0}"
cache="${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}"
out="$cache/bin/helm-$version"
if [[ -x "$out/helm" ]]; then echo "  helm $version: cached"; exit 0; fi
go_bin="$("$(dirname "${BASH_SOURCE[0]}")/find-go.sh")"
mkdir -p "$out"
echo "  helm $version: building helm.sh/helm/v3/cmd/helm (log: $out/build.log)"
start=$(date +%s)
if ! GOBIN="$out" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
    "$go_bin" install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
    "helm.sh/helm/v3/cmd/helm@$version" > "$out/build.log" 2>&1; then
  echo "build-helm: FAILED; last lines of $out/build.log:" >&2
  tail -20 "$out/build.log" >&2
  exit 1
fi
echo "  helm $version: built in $(( $(date +%s) - start )) s"
