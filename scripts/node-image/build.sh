#!/usr/bin/env bash
# Builds the stateless node image from Debian packages: a kernel, an initrd
# that fetches the root filesystem over HTTP and runs it from RAM (live-boot,
# `boot=live fetch=<url>`), and that root filesystem as a squashfs.
#
# Called by `gpufleet local image build` (gpufleet.local.node_image), which
# computes the cache key, prepares the inputs and moves OUT into the cache only
# when this script succeeded; run by hand it builds into any empty directory:
#
#   scripts/node-image/build.sh --out DIR --mirror http://deb.debian.org/debian \
#       --kubelet PATH --kubeadm PATH --kube-proxy PATH --pause-tar PATH \
#       --netcheck-tar PATH --requirements FILE --wheels DIR
#
# Needs root (debootstrap, chroot, mounts). Everything comes from the Debian
# mirror (packages), the Go binaries given (kubelet, kubeadm, kube-proxy, built
# from the pinned Kubernetes modules), the two container images given (pause,
# netcheck) and the Python wheels given (downloaded by the
# caller through pip's configured index). Writes into OUT: vmlinuz, initrd.img,
# rootfs.squashfs, packages.tsv (every installed package and its version).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite=trixie
out="" mirror="" kubelet="" kubeadm="" kube_proxy="" pause_tar="" netcheck_tar=""
requirements="" wheels="" work=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --kubelet) kubelet="$2"; shift 2 ;;
    --kubeadm) kubeadm="$2"; shift 2 ;;
    --kube-proxy) kube_proxy="$2"; shift 2 ;;
    --pause-tar) pause_tar="$2"; shift 2 ;;
    --netcheck-tar) netcheck_tar="$2"; shift 2 ;;
    --requirements) requirements="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    *) echo "node-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in out mirror kubelet kubeadm kube_proxy pause_tar netcheck_tar requirements wheels; do
  [[ -n "${!v}" ]] || { echo "node-image: --${v//_/-} is required" >&2; exit 2; }
done
fail() { echo "node-image: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "needs root (debootstrap, chroot and mounts)"
for tool in debootstrap mksquashfs chroot mount; do
  command -v "$tool" >/dev/null || fail "$tool is missing: apt-get install debootstrap squashfs-tools"
done
for f in "$kubelet" "$kubeadm" "$kube_proxy" "$pause_tar" "$netcheck_tar" "$requirements"; do
  [[ -f "$f" ]] || fail "input missing: $f"
done
mkdir -p "$out"
work="${work:-$out/.work}"
root="$work/root"
rm -rf "$work"
mkdir -p "$root"
start=$(date +%s)
step() { echo "== [$1/8] $2 ($(( $(date +%s) - start )) s)"; }

mounted=()
cleanup() {
  local i
  for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Free space: about 1.5 GiB for the root tree and the images.
avail_kib=$(df -Pk "$out" | awk 'NR==2 {print $4}')
((avail_kib > 2 * 1024 * 1024)) || fail "less than 2 GiB free under $out (df: ${avail_kib} KiB)"

step 1 "debootstrap --variant=minbase $suite from $mirror"
debootstrap --variant=minbase --include=ca-certificates "$suite" "$root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || {
  tail -15 "$work/debootstrap.log" >&2
  fail "debootstrap $suite from $mirror failed (is the mirror reachable? log above)"
}

step 2 "image configuration (dpkg excludes, initramfs, no service starts in the chroot)"
cp -a "$here/files/etc/dpkg/dpkg.cfg.d/." "$root/etc/dpkg/dpkg.cfg.d/"
mkdir -p "$root/etc/initramfs-tools/conf.d"
cp -a "$here/files/etc/initramfs-tools/conf.d/." "$root/etc/initramfs-tools/conf.d/"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"
for fs in proc sys dev dev/pts; do
  mkdir -p "$root/$fs"
  mount --bind "/$fs" "$root/$fs"
  mounted+=("$root/$fs")
done

step 3 "apt-get install $(grep -cv '^\s*\(#\|$\)' "$here/packages.txt") packages (kernel, live-boot, systemd, containerd, cloud-init, python3)"
mapfile -t packages < <(grep -v '^\s*\(#\|$\)' "$here/packages.txt")
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -q > "$work/apt.log" 2>&1 \
  || { tail -15 "$work/apt.log" >&2; fail "apt-get update in the image failed"; }
chroot "$root" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${packages[@]}" >> "$work/apt.log" 2>&1 \
  || { tail -25 "$work/apt.log" >&2; fail "apt-get install in the image failed (log above)"; }

step 4 "kubelet, kubeadm, kube-proxy, pause and netcheck images, units and configuration"
install -m 0755 "$kubelet" "$root/usr/bin/kubelet"
install -m 0755 "$kubeadm" "$root/usr/bin/kubeadm"
install -m 0755 "$kube_proxy" "$root/usr/bin/kube-proxy"
mkdir -p "$root/usr/lib/gpufleet" "$root/etc/gpufleet" "$root/etc/kubernetes/manifests" \
  "$root/var/lib/kubelet"
install -m 0644 "$pause_tar" "$root/usr/lib/gpufleet/pause.tar"
install -m 0644 "$netcheck_tar" "$root/usr/lib/gpufleet/netcheck.tar"
cp -a "$here/files/." "$root/"
chroot "$root" systemctl enable --quiet systemd-networkd.service systemd-resolved.service \
  containerd.service kubelet.service gpufleet-containerd-root.service gpufleet-pause-image.service \
  gpufleet-pod-network.path gpufleet-agent-install.service gpufleet-agent.service \
  gpufleet-fabric.service
# No interactive first-boot questions on a serial console with nobody behind it.
chroot "$root" systemctl mask --quiet systemd-firstboot.service
# A root password nobody knows; the console login stays useful with an override
# from cloud-init (users/chpasswd) if an operator wants one.
chroot "$root" passwd -l root > /dev/null

step 5 "Python $(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') venv at /opt/gpufleet/venv ($(wc -l < "$requirements") pinned packages)"
mkdir -p "$root/tmp/wheels"
cp "$wheels"/*.whl "$root/tmp/wheels/"
cp "$requirements" "$root/tmp/requirements.txt"
chroot "$root" python3 -m venv /opt/gpufleet/venv
chroot "$root" /opt/gpufleet/venv/bin/pip install --quiet --no-index --find-links /tmp/wheels \
  --disable-pip-version-check -r /tmp/requirements.txt > "$work/pip.log" 2>&1 \
  || { tail -20 "$work/pip.log" >&2; fail "pip install of the agent's dependencies failed"; }
rm -rf "$root/tmp/wheels" "$root/tmp/requirements.txt"

step 6 "kernel modules without sound, radio, media and desktop GPUs; initrd (live-boot, network drivers, zstd)"
kernel="$(cd "$root/boot" && ls vmlinuz-* | sort -V | tail -1)"
version="${kernel#vmlinuz-}"
# A node in a GPU fleet has none of these; the root image is held in RAM.
mods="$root/usr/lib/modules/$version/kernel"
rm -rf "$mods/sound" "$mods/net/wireless" "$mods/net/mac80211" "$mods/net/bluetooth" \
  "$mods/drivers/net/wireless" "$mods/drivers/bluetooth" "$mods/drivers/media" \
  "$mods/drivers/staging" "$mods/drivers/gpu/drm/amd" "$mods/drivers/gpu/drm/radeon" \
  "$mods/drivers/gpu/drm/nouveau" "$mods/drivers/gpu/drm/i915" "$mods/drivers/gpu/drm/xe"
chroot "$root" depmod -a "$version"
chroot "$root" update-initramfs -u -k all > "$work/initramfs.log" 2>&1 \
  || { tail -20 "$work/initramfs.log" >&2; fail "update-initramfs failed"; }
cp "$root/boot/vmlinuz-$version" "$out/vmlinuz"
cp "$root/boot/initrd.img-$version" "$out/initrd.img"
chroot "$root" dpkg-query -W -f '${Package}\t${Version}\n' > "$out/packages.tsv"
echo "$version" > "$out/kernel-version"

step 7 "clean the root tree (apt lists and caches, docs, machine id, logs, kernel files)"
for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}"; done
mounted=()
rm -f "$root/usr/sbin/policy-rc.d"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old "$root"/var/log/*.log \
  "$root"/var/log/apt/* "$root"/tmp/* "$root"/root/.cache "$root"/boot/vmlinuz-* \
  "$root"/boot/initrd.img-* "$root"/boot/System.map-*
# /boot/config-<version> stays: kubeadm's SystemVerification reads the kernel's config.
# What debootstrap installed before the dpkg excludes were in place.
find "$root/usr/share/doc" -type f ! -name copyright -delete
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/i18n \
  "$root"/usr/share/locale/*/
# CNI plugins the bridge configuration does not use; containerd's v1 shims
# (the CRI plugin runs io.containerd.runc.v2).
find "$root/usr/lib/cni" -type f ! -name bridge ! -name host-local ! -name portmap \
  ! -name loopback -delete
rm -f "$root/usr/bin/containerd-shim" "$root/usr/bin/containerd-shim-runc-v1"
# Timers that would download or tidy a root filesystem that lives for one boot.
chroot "$root" systemctl mask --quiet apt-daily.timer apt-daily-upgrade.timer \
  dpkg-db-backup.timer fstrim.timer e2scrub_all.timer 2>/dev/null || true
# Done now rather than at every boot: systemd runs ldconfig, the journal
# catalogue and the sysusers/hwdb updates when /usr is newer than /etc/.updated.
chroot "$root" ldconfig
chroot "$root" journalctl --update-catalog 2>/dev/null || true
chroot "$root" systemd-hwdb update 2>/dev/null || true
touch "$root/etc/.updated" "$root/var/.updated"
# Empty: systemd makes a new machine id at every boot, so no two nodes share one.
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
echo "gpufleet-node" > "$root/etc/hostname"

step 8 "rootfs.squashfs (zstd)"
mksquashfs "$root" "$out/rootfs.squashfs" -comp zstd -Xcompression-level 15 -b 1M \
  -noappend -no-progress -quiet > "$work/mksquashfs.log" 2>&1 \
  || { tail -10 "$work/mksquashfs.log" >&2; fail "mksquashfs failed (disk full?)"; }
echo "== node image built in $(( $(date +%s) - start )) s: $(du -sh "$out" | cut -f1) in $out"
