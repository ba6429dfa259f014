#!/usr/bin/env bash
# Builds promtool from the Go module proxy into the gpufleet cache
# (${GPUFLEET_CACHE:-~/.cache/gpufleet}/bin/promtool-<version>/promtool), for the
# test that lints every component's /metrics with `promtool check metrics`
# (tests/e2e/test_metrics_lint.py). Skipped when already built.
# Built with the Go build tag remove_all_sd (Prometheus 3.10+, README "Service discovery
# plugins"): `promtool check metrics` needs none of the optional service discoveries, whose
# cloud SDKs (AWS, Azure, GCE, Kubernetes, ...) were most of the build (docs/testing.md).
set -euo pipefail
version="${PROMTOOL_VERSION:-v0.316.0}"
cache="${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}"
out="$cache/bin/promtool-$version"
if [[ -x "$out/promtool" ]]; then echo "  promtool $version: cached"; exit 0; fi
go_bin="$("$(dirname "${BASH_SOURCE[0]}")/find-go.sh")"
mkdir -p "$out"
echo "  promtool $version: building github.com/prometheus/prometheus/cmd/promtool (log: $out/build.log)"
start=$(date +%s)
if ! GOBIN="$out" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
    "$go_bin" install -trimpath -tags remove_all_sd -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@$version" > "$out/build.log" 2>&1; then
  echo "build-promtool: FAILED; last lines of $out/build.log:" >&2
  tail -20 "$out/build.log" >&2
  exit 1
fi
echo "  promtool $version: built in $(( $(date +%s) - start )) s"
