#!/usr/bin/env bash
# Fetches a Go toolchain from the Go module proxy, for machines without a Go
# new enough to build the local cluster (Debian 12 ships 1.19; toolchain
# switching needs 1.21+). The proxy serves every Go release as the module
# golang.org/toolchain; its zip is a complete GOROOT.
#
# Usage: scripts/fetch-go.sh VERSION DEST   (e.g. 1.26.8 ~/.cache/gpufleet/go)
# Prints the path of the go binary. Idempotent: an existing toolchain is reused.
set -euo pipefail
version="${1:?usage: fetch-go.sh VERSION DEST}"
dest="${2:?usage: fetch-go.sh VERSION DEST}"
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "fetch-go: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
module="v0.0.1-go$version.linux-$arch"
goroot="$dest/golang.org/toolchain@$module"
if [[ -x "$goroot/bin/go" ]]; then echo "$goroot/bin/go"; exit 0; fi
proxy="${GOPROXY:-https://proxy.golang.org}"
proxy="${proxy%%,*}"
[[ "$proxy" == http* ]] || proxy=https://proxy.golang.org
url="$proxy/golang.org/toolchain/@v/$module.zip"
mkdir -p "$dest"
zip="$dest/$module.zip"
echo "fetch-go: downloading Go $version from $url" >&2
if command -v curl >/dev/null; then
  curl -fsSL --retry 3 -o "$zip.part" "$url" || { echo "fetch-go: download failed: $url" >&2; exit 1; }
else
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "$url" "$zip.part" || { echo "fetch-go: download failed: $url" >&2; exit 1; }
fi
mv "$zip.part" "$zip"
# Unzip keeping the executable bits (zipfile does not by itself).
python3 - "$zip" "$dest" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PY
rm -f "$zip"
[[ -x "$goroot/bin/go" ]] || { echo "fetch-go: no bin/go in the toolchain zip" >&2; exit 1; }
echo "$goroot/bin/go"
