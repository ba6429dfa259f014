#!/usr/bin/env bash
# Builds helm v3 from the Go module proxy into the gpufleet cache
# (${GPUFLEET_CACHE:-~/.cache/gpufleet}/bin/helm-<version>/helm), for the chart
# tests (tests/integration/test_slurm_chart.py). Skipped when already built.
# Run it after the Kubernetes builds: on 2 cores it takes about 10 minutes.
# Like helm's own Makefile, the build sets the Kubernetes version `helm template` and
# `helm lint` assume without a cluster (the client-go helm is built with: 1.37 for
# v3.22.0); without it they assume 1.20 and refuse the chart's kubeVersion >= 1.30.
# A binary built before that (no kube-<minor> stamp beside it) is rebuilt.
set -euo pipefail
version="${HELM_VERSION:-v3.22.0}"
kube_minor="${HELM_KUBE_MINOR:-37}"
cache="${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}"
out="$cache/bin/helm-$version"
stamp="$out/kube-1.$kube_minor"
if [[ -x "$out/helm" && -e "$stamp" ]]; then echo "  helm $version: cached"; exit 0; fi
go_bin="$("$(dirname "${BASH_SOURCE[0]}")/find-go.sh")"
mkdir -p "$out"
echo "  helm $version: building helm.sh/helm/v3/cmd/helm (log: $out/build.log)"
start=$(date +%s)
# Built beside the cached one, then moved over it: a helm in use is never half-written.
tmp_bin="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp_bin"' EXIT
kube="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
kube+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kube_minor"
kube+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1"
kube+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kube_minor"
if ! GOBIN="$tmp_bin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
    "$go_bin" install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version $kube" \
    "helm.sh/helm/v3/cmd/helm@$version" > "$out/build.log" 2>&1; then
  echo "build-helm: FAILED; last lines of $out/build.log:" >&2
  tail -20 "$out/build.log" >&2
  exit 1
fi
mv -f "$tmp_bin/helm" "$out/helm"
touch "$stamp"
echo "  helm $version: built in $(( $(date +%s) - start )) s"
