#!/usr/bin/env bash
# Builds the CNCF distribution registry (the reference OCI registry,
# github.com/distribution/distribution/v3/cmd/registry) from the Go module proxy
# into the gpufleet cache (${GPUFLEET_CACHE:-~/.cache/gpufleet}/bin/registry-<version>/registry),
# for the test that pushes the packaged charts to an OCI registry and installs them
# from there (tests/integration/test_chart_release.py). Skipped when already built.
set -euo pipefail
version="${REGISTRY_VERSION:-v3.1.2}"
out="${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}/bin/registry-$version"
if [[ -x "$out/registry" ]]; then echo "  registry $version: cached"; exit 0; fi
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"
go_tool_install registry "$version" \
  "github.com/distribution/distribution/v3/cmd/registry@$version" "$out" \
  -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$version"
