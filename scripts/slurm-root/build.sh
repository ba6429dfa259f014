#!/usr/bin/env bash
# Builds the Slurm image of images/slurm/Containerfile as one root filesystem:
# the tree the local cluster chroots its Slurm daemons and commands into when it
# runs `--slurm 24.11` (gpufleet.local.slurm_root), on a host whose own Slurm
# is another release, and the Slurm image's layer.
#
# The Containerfile's FROM (Debian's slim image of SUITE) is a debootstrap of SUITE;
# its RUN steps come in STEPS (NN.sh: the command; NN.env: its environment,
# NUL-separated NAME=value) and run chrooted in the tree, in order. With no steps, OUT/root
# is the base alone: what `scripts/release/build-images --base-from-local` imports into
# buildah or podman as the Containerfile's FROM image (gpufleet.local.engine).
#
# Called by `gpufleet local slurm-image build`, which reads the Containerfile,
# computes the cache key and moves OUT into ~/.cache/gpufleet/slurm-root/<key> only
# when this succeeded; by hand it builds into any empty directory:
#
#   scripts/slurm-root/build.sh --out DIR --mirror http://deb.debian.org/debian --steps STEPS
#
# Needs root (debootstrap, chroot). Writes OUT/root (the tree) and
# OUT/packages.tsv (every installed package and its version).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite=trixie
out="" mirror="" steps=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "slurm-root: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$out" && -n "$mirror" && -d "$steps" ]] \
  || { echo "slurm-root: --out, --mirror and --steps are required" >&2; exit 2; }
fail() { echo "slurm-root: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "needs root (debootstrap and chroot)"
command -v debootstrap >/dev/null || fail "debootstrap is missing: apt-get install debootstrap"
root="$out/root"
mkdir -p "$root"
start=$(date +%s)
step() { echo "== [$1/3] $2 ($(( $(date +%s) - start )) s)"; }

mounted=()
cleanup() {
  local i
  for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

step 1 "debootstrap --variant=minbase $suite from $mirror"
debootstrap --variant=minbase "$suite" "$root" "$mirror" > "$out/debootstrap.log" 2>&1 || {
  tail -15 "$out/debootstrap.log" >&2
  fail "debootstrap $suite from $mirror failed (is the mirror reachable? log above)"
}

shopt -s nullglob
runs=("$steps"/*.sh)
step 2 "the Containerfile's RUN steps (${#runs[@]})"
# The packages' services must not start in the chroot (Debian's images ship this too).
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"
for fs in proc dev; do
  mount --bind "/$fs" "$root/$fs"
  mounted+=("$root/$fs")
done
for run in "${runs[@]}"; do
  mapfile -d '' env < "${run%.sh}.env"
  echo "   RUN $(head -c 100 "$run" | tr -s ' \n' ' ')..."
  chroot "$root" /usr/bin/env -i "${env[@]}" /bin/sh -c "$(cat "$run")" < /dev/null \
    > "$out/run.log" 2>&1 || { tail -25 "$out/run.log" >&2; fail "RUN $(basename "$run") failed (log above)"; }
done
chroot "$root" dpkg-query -W -f '${Package}\t${Version}\n' > "$out/packages.tsv"

step 3 "mount points the local cluster binds (/etc/hosts, /run, /tmp)"
for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}"; done
mounted=()
touch "$root/etc/hosts"
mkdir -p "$root/run" "$root/tmp"
rm -f "$out/debootstrap.log" "$out/run.log"
echo "== done ($(( $(date +%s) - start )) s): $(du -sm "$root" | cut -f1) MiB"
