#!/usr/bin/env bash
# Builds a root filesystem holding Slurm 24.11 from Debian 13 packages: the
# tree the local cluster chroots its Slurm daemons and commands into when it
# runs `--slurm 24.11` (gpufleet.local.slurm_root), on a host whose own Slurm
# is another release.
#
# Called by `gpufleet local slurm-image build`, which computes the cache key and
# moves OUT into ~/.cache/gpufleet/slurm-root/<key> only when this succeeded;
# by hand it builds into any empty directory:
#
#   scripts/slurm-root/build.sh --out DIR --mirror http://deb.debian.org/debian
#
# Needs root (debootstrap, chroot). Writes OUT/root (the tree) and
# OUT/packages.tsv (every installed package and its version).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite=trixie
out="" mirror=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    *) echo "slurm-root: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$out" && -n "$mirror" ]] || { echo "slurm-root: --out and --mirror are required" >&2; exit 2; }
fail() { echo "slurm-root: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "needs root (debootstrap and chroot)"
command -v debootstrap >/dev/null || fail "debootstrap is missing: apt-get install debootstrap"
root="$out/root"
mkdir -p "$root"
start=$(date +%s)
step() { echo "== [$1/4] $2 ($(( $(date +%s) - start )) s)"; }

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

step 2 "apt-get install $(grep -cv '^\s*\(#\|$\)' "$here/packages.txt") packages (Slurm daemons, commands, munge)"
# The packages' services must not start in the chroot.
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"
for fs in proc dev; do
  mount --bind "/$fs" "$root/$fs"
  mounted+=("$root/$fs")
done
mapfile -t packages < <(grep -v '^\s*\(#\|$\)' "$here/packages.txt")
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -q > "$out/apt.log" 2>&1 \
  || { tail -15 "$out/apt.log" >&2; fail "apt-get update in the root failed"; }
chroot "$root" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${packages[@]}" >> "$out/apt.log" 2>&1 \
  || { tail -25 "$out/apt.log" >&2; fail "apt-get install in the root failed (log above)"; }
chroot "$root" dpkg-query -W -f '${Package}\t${Version}\n' > "$out/packages.tsv"

step 3 "mount points the local cluster binds (/etc/hosts, /run, /tmp)"
for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}"; done
mounted=()
rm -f "$root/usr/sbin/policy-rc.d"
touch "$root/etc/hosts"
mkdir -p "$root/run" "$root/tmp"

step 4 "clean the tree (apt lists and caches, docs, logs)"
chroot "$root" apt-get clean
# openssh-server's postinst made host keys: every copy of this tree would share them.
rm -f "$root"/etc/ssh/ssh_host_*
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/var/log/apt/* \
  "$root"/tmp/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*/
find "$root/usr/share/doc" -type f ! -name copyright -delete
rm -f "$out/debootstrap.log" "$out/apt.log"
echo "== done ($(( $(date +%s) - start )) s): $(du -sm "$root" | cut -f1) MiB"
