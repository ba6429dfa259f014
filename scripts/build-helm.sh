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
source "$(dirname "${BASH_SOURCE[0]}")/go-tool.sh"
kube="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
kube+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kube_minor"
kube+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1"
kube+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kube_minor"
go_tool_install helm "$version" "helm.sh/helm/v3/cmd/helm@$version" "$out" \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version $kube"
touch "$stamp"
