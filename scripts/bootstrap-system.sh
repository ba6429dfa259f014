#!/usr/bin/env bash
# Installs what the local cluster (gpufleet.local) needs outside the Python
# virtual environment. Idempotent and quick when everything is present:
#   1. Debian packages for Slurm, munge, MariaDB and qemu (apt-get only when one is missing);
#   2. etcd, Kubernetes control-plane binaries, kubectl and KWOK, built from the
#      Go module proxy into ~/.cache/gpufleet (skipped when cached), see
#      scripts/build-go-binaries.sh; then helm (scripts/build-helm.sh),
#      promtool (scripts/build-promtool.sh) and the OCI registry (scripts/build-registry.sh);
#   3. the node image the real machines boot (`gpufleet local image build`, as
#      root: about 5 minutes once, then a cache lookup of about a second);
#   4. the Slurm 24.11 root (`gpufleet local slurm-image build`, as root: about
#      75 s once, then a cache lookup).
# Python dependencies are installed by scripts/bootstrap-python.sh.
# Needs root for apt-get on a fresh machine; fails naming the step that failed.
# Each step's wall time is printed at the end (scripts/test's summary shows them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
steps=()
# step NAME COMMAND...: run it and remember its wall time.
step() {
  local name="$1" t0 step_rc=0
  shift
  t0=$(date +%s)
  "$@" || step_rc=$?
  steps+=("$(printf '%-22s %5d s' "$name" "$(( $(date +%s) - t0 ))")")
  return "$step_rc"
}
# The steps that run gpufleet need the venv: when scripts/test installs it beside
# this script (GPUFLEET_VENV_PID), wait for that install to end first.
wait_for_venv() {
  local pid="${GPUFLEET_VENV_PID:-}"
  if [[ -n "$pid" ]]; then
    while kill -0 "$pid" 2>/dev/null; do sleep 1; done
  fi
}

# Debian packages. slurm-wlm-jwt-plugin gives slurmrestd its JWT auth; time
# provides /usr/bin/time for the build measurements; openssl and procps are
# used by the cluster tooling; ca-certificates lets Go reach the module proxy.
# qemu-system-x86, ipxe-qemu (the NIC's network-boot ROM) and socat (one per
# forwarded connection) run the local cluster's real machines (--machines);
# debootstrap and squashfs-tools build the image they boot; vde2 (vde_switch)
# links their second NICs, the pod network between machines (--images);
# e2fsprogs (mkfs.ext4 -d) writes their image seed disk. runc, iptables and
# conntrack run the host node (--host-node: the node image's kubelet, containerd
# and kube-proxy on this host; its runc needs a newer glibc than Debian 12's).
# mariadb-server is the database of Slurm accounting (--slurm-accounting): each
# cluster runs its own instance; the packaged service is never started.
# buildah builds the release images from their Containerfiles with no daemon and no
# registry (tests/integration/test_release_images.py: build-images --engine buildah);
# netavark, only a Recommends of it, is its network backend, which buildah 1.28 needs to
# make any container, even one on the host's network.
packages=(munge slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin
          time openssl procps ca-certificates qemu-system-x86 ipxe-qemu socat
          debootstrap squashfs-tools e2fsprogs vde2 mariadb-server
          runc iptables conntrack buildah netavark)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
apt_install() {
  echo "== apt-get install ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap-system: these Debian packages are missing: ${missing[*]}" >&2
    echo "  Run as root, or: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || { echo "bootstrap-system: apt-get update failed" >&2; exit 1; }
  # The packaged services (slurmctld, munge, mariadb) are never used: a policy-rc.d
  # keeps their postinst from starting them, only for this install when none exists.
  own_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  rc=0
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
  [[ -z "$own_policy" ]] || rm -f /usr/sbin/policy-rc.d
  ((rc == 0)) || { echo "bootstrap-system: apt-get install ${missing[*]} failed" >&2; exit 1; }
}
if ((${#missing[@]})); then step "apt-get install" apt_install; fi

# Go binaries (version-pinned by deps/*/go.mod, cached outside the repository).
step "Go binaries" env PATH="$PATH:/usr/local/go/bin" "$root/scripts/build-go-binaries.sh" >&2
# helm, for the chart tests (helm lint / template); after the Kubernetes builds.
step helm env PATH="$PATH:/usr/local/go/bin" "$root/scripts/build-helm.sh" >&2
# promtool, for the test that lints every component's /metrics.
step promtool env PATH="$PATH:/usr/local/go/bin" "$root/scripts/build-promtool.sh" >&2
# The CNCF distribution registry, for the test that pushes the packaged chart to an OCI
# registry and installs it from there (tests/integration/test_chart_release.py).
step registry env PATH="$PATH:/usr/local/go/bin" "$root/scripts/build-registry.sh" >&2
[[ -z "${GPUFLEET_VENV_PID:-}" ]] || step "wait: Python install" wait_for_venv
# The node image (after the Go binaries: it carries their kubelet and kubeadm).
# Not fatal: only the tests with real machines need it, and they say so.
if [[ $(id -u) -eq 0 ]]; then
  step "node image" env PATH="$PATH:/usr/local/go/bin" "$root/.venv/bin/gpufleet" local image build >&2 \
    || echo "bootstrap-system: the node image was not built (above); tests with real machines will fail" >&2
else
  echo "bootstrap-system: not root, node image not built (gpufleet local image build needs root)" >&2
fi
# The Slurm 24.11 root (Debian 13 packages) the local cluster's `--slurm 24.11`
# and tests/integration/test_slurm_24_11.py chroot into: about 75 s once.
if [[ $(id -u) -eq 0 ]]; then
  step "Slurm 24.11 root" "$root/.venv/bin/gpufleet" local slurm-image build >&2 \
    || echo "bootstrap-system: the Slurm 24.11 root was not built (above); its tests will fail" >&2
else
  echo "bootstrap-system: not root, Slurm 24.11 root not built (needs root)" >&2
fi
# The gpufleet and Slurm images the chart's pods run (tests/integration/
# test_chart_on_machines.py): on that root, a minute once, seconds per code change.
if [[ $(id -u) -eq 0 ]]; then
  step images "$root/.venv/bin/gpufleet" local images build >&2 \
    || echo "bootstrap-system: the images were not built (above); the chart's tests on machines will fail" >&2
else
  echo "bootstrap-system: not root, images not built (needs root)" >&2
fi

echo "== system dependencies ready ($(( $(date +%s) - start )) s)" >&2
for line in "${steps[@]}"; do echo "   $line" >&2; done
