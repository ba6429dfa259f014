#!/bin/sh
# Runs inside the Slurm root (scripts/images/overlay-run.sh): Debian 13's Python and
# a venv at /opt/gpufleet holding gpufleet's runtime dependencies, installed from
# the wheels at /mnt/wheels (downloaded on the host, pinned to what the tests ran).
# What it writes is the gpufleet image's second layer; the package itself is the third.
set -eu
mirror="$1" suite="$2"
echo "deb $mirror $suite main" > /etc/apt/sources.list
# Package scripts must not start services in a build root.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d
apt-get update -q > /tmp/apt.log 2>&1 || { tail -15 /tmp/apt.log >&2; exit 1; }
apt-get install -y -q --no-install-recommends python3 python3-venv >> /tmp/apt.log 2>&1 \
  || { tail -25 /tmp/apt.log >&2; exit 1; }
echo "python3 $(dpkg-query -W -f '${Version}' python3)"
python3 -m venv /opt/gpufleet
/opt/gpufleet/bin/pip install --quiet --no-cache-dir --no-index --find-links /mnt/wheels \
  -r /mnt/wheels/requirements.txt
apt-get clean
rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/cache/debconf/*-old \
  /usr/sbin/policy-rc.d /usr/share/doc/python3* /usr/share/man/*
