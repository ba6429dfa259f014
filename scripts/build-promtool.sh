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
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"
go_tool_install promtool "$version" "github.com/prometheus/prometheus/cmd/promtool@$version" \
  "$out" -tags remove_all_sd -ldflags "-s -w"
