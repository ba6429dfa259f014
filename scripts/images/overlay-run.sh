#!/usr/bin/env bash
# Runs a command chrooted into an overlay of read-only lower trees, so that what it
# writes lands in UPPER: one image layer (gpufleet.local.images turns UPPER into a
# layer tar, overlayfs whiteouts into OCI ones).
#
#   scripts/images/overlay-run.sh --lower TOP:...:BOTTOM --upper DIR --work DIR \
#       [--bind SRC:DST]... [--net] -- COMMAND [ARG...]
#
# Everything is mounted in a private mount namespace (unshare), so nothing is left
# mounted on the host when the command ends or is killed. --net bind-mounts the
# host's /etc/resolv.conf (apt needs the mirror's name); --bind makes SRC visible
# read-only at DST inside. Mount points it had to create are removed from UPPER
# afterwards, so they are not part of the layer. Needs root.
set -euo pipefail
lower="" upper="" work="" net=0
binds=()
while (($#)); do
  case "$1" in
    --lower) lower="$2"; shift 2 ;;
    --upper) upper="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --bind) binds+=("$2"); shift 2 ;;
    --net) net=1; shift ;;
    --) shift; break ;;
    *) echo "overlay-run: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$lower" && -n "$upper" && -n "$work" && $# -gt 0 ]] \
  || { echo "overlay-run: --lower, --upper, --work and a command are required" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "overlay-run: needs root (mount, chroot)" >&2; exit 1; }

if [[ -z "${GPUFLEET_OVERLAY_INNER:-}" ]]; then
  mkdir -p "$upper" "$work/ovl" "$work/merged"
  GPUFLEET_OVERLAY_INNER=1 exec unshare --mount --propagation private "$0" \
    --lower "$lower" --upper "$upper" --work "$work" \
    $(for b in "${binds[@]}"; do printf -- '--bind %s ' "$b"; done) \
    $( ((net)) && echo --net) -- "$@"
fi

merged="$work/merged"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work/ovl" "$merged"
created=()
mountpoint_at() {  # $1: path inside; $2: d (directory) or f (file)
  local inside="$merged$1"
  if [[ ! -e "$inside" ]]; then
    if [[ $2 == d ]]; then mkdir -p "$inside"; else touch "$inside"; fi
    created+=("$1")
  fi
}
for fs in proc dev sys; do mountpoint_at "/$fs" d; mount --rbind "/$fs" "$merged/$fs"; done
if ((net)); then
  mountpoint_at /etc/resolv.conf f
  mount --bind "$(readlink -f /etc/resolv.conf)" "$merged/etc/resolv.conf"
fi
for b in "${binds[@]}"; do
  src="${b%%:*}" dst="${b#*:}"
  mountpoint_at "$dst" d
  mount --bind -o ro "$src" "$merged$dst"
done
mountpoint_at /tmp d
mount -t tmpfs tmpfs "$merged/tmp"
set +e
chroot "$merged" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
code=$?
set -e
umount -R "$merged/tmp" "$merged/proc" "$merged/dev" "$merged/sys" 2>/dev/null || true
for b in "${binds[@]}"; do umount "$merged${b#*:}" || true; done
((net)) && umount "$merged/etc/resolv.conf"
umount "$merged"
# Mount points that exist only because of this run: not part of the layer.
for ((i=${#created[@]}-1; i>=0; i--)); do
  path="$upper${created[$i]}"
  if [[ -d "$path" && ! -L "$path" ]]; then rmdir "$path" 2>/dev/null || true; else rm -f "$path"; fi
done
exit $code
