#!/usr/bin/env bash
# Builds the local cluster's Go binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl, kwok) and the node image's kubelet, kubeadm
# and kube-proxy from the Go module proxy, pinned by the committed wrapper modules
# under deps/, into a cache outside the repo:
#
#   ${GPUFLEET_CACHE:-~/.cache/gpufleet}/bin/<k8s>-<etcd>-<kwok>-<hash>/
#
# <hash> covers deps/*/go.mod and go.sum, so a version bump builds into a new
# directory and never mixes binaries. A binary already in the cache is not
# rebuilt. Each build's wall time and peak RSS go to build-times.tsv in that
# directory (docs/local-cluster.md quotes them).
#
# Usage: scripts/build-go-binaries.sh [--print-dir]
#   --print-dir  only print the cache directory and exit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$root/deps"

k8s_version="$(sed -n 's/^require k8s.io\/kubernetes \(v[^ ]*\)$/\1/p' "$deps/kubernetes/go.mod")"
etcd_version="$(sed -n 's/^\s*go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\).*/\1/p' "$deps/etcd/go.mod" | head -1)"
kwok_version="$(sed -n 's/^\s*sigs.k8s.io\/kwok \(v[^ ]*\).*/\1/p' "$deps/kwok/go.mod" | head -1)"
for v in k8s_version etcd_version kwok_version; do
  [[ -n "${!v}" ]] || { echo "build-go-binaries: cannot read $v from deps/*/go.mod" >&2; exit 1; }
done
hash="$(cat "$deps"/{kubernetes,etcd,kwok}/go.{mod,sum} | sha256sum | cut -c1-12)"
cache="${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}"
out="$cache/bin/k8s-$k8s_version-etcd-$etcd_version-kwok-$kwok_version-$hash"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi

go_bin="$("$root/scripts/find-go.sh")"
# The wrapper modules say 'go 1.26.0'; use the installed toolchain when it is
# new enough, otherwise let cmd/go fetch go1.26.x from the module proxy.
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
mkdir -p "$out"
times="$out/build-times.tsv"
[[ -f "$times" ]] || printf 'binary\twall_s\tpeak_rss_mib\n' > "$times"

build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
minor="$(echo "$k8s_version" | cut -d. -f2)"
k8s_ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags="$k8s_ldflags -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  k8s_ldflags="$k8s_ldflags -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
done

# build <name> <module dir> <package> <ldflags> [tags]
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4" tags="${5:-}"
  if [[ -x "$out/$name" ]]; then
    echo "  $name: cached"
    return 0
  fi
  echo "  $name: building $pkg (this takes minutes on a small machine; log: $out/$name.build.log)"
  local start end rss
  start=$(date +%s)
  if ! (cd "$dir" && /usr/bin/time -f '%M' -o "$out/$name.rss" \
        "$go_bin" build -trimpath ${tags:+-tags=$tags} -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg") \
        > "$out/$name.build.log" 2>&1; then
    echo "build-go-binaries: FAILED to build $name ($pkg). Last lines of $out/$name.build.log:" >&2
    tail -20 "$out/$name.build.log" >&2
    exit 1
  fi
  end=$(date +%s)
  rss=$(( $(tail -1 "$out/$name.rss") / 1024 ))
  mv "$out/$name.tmp" "$out/$name"
  printf '%s\t%s\t%s\n' "$name" "$((end - start))" "$rss" >> "$times"
  echo "  $name: built in $((end - start)) s, peak RSS $rss MiB"
}

echo "== Go binaries -> $out"
[[ -x /usr/bin/time ]] || { echo "build-go-binaries: /usr/bin/time missing (apt-get install time)" >&2; exit 1; }
build etcd "$deps/etcd" go.etcd.io/etcd/server/v3 "-s -w"
build kwok "$deps/kwok" sigs.k8s.io/kwok/cmd/kwok "-s -w"
# kubelet, kubeadm and kube-proxy go into the node image (scripts/node-image/build.sh);
# kubeadm also runs on the host (kubeadm phases against the local cluster).
for c in kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kubeadm kube-proxy; do
  build "$c" "$deps/kubernetes" "k8s.io/kubernetes/cmd/$c" "$k8s_ldflags" selinux,notest,grpcnotrace
done
rm -f "$out"/*.rss
# Where the Python side finds them without re-deriving the hash.
ln -sfn "$out" "$cache/bin/current"
echo "== Go binaries ready in $out"
