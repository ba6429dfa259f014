"""Node image bench: boot the cached image in qemu and check what a node needs.

Starts one virtual machine under software emulation (TCG, 1 vCPU, ``--memory``
MiB; the kernel and initrd are given to qemu directly, no PXE) whose initrd
fetches the root image from a small HTTP server on 127.0.0.1 (the guest sees it
at 10.0.2.2, qemu's user-mode network). The same server is the cloud-init seed
(``ds=nocloud;s=...``): meta-data, vendor-data and network-config as the
provisioning service serves them, and a user-data that installs the agent's
wheel (built from this checkout, as the local cluster does) and prints one
check line on the serial console after multi-user.target: containerd active,
``kubelet --version``, ``kubeadm version``, the pause image in containerd,
the agent wheel installed, memory in use. Prints:

- the cached lookup (key from the checkout + manifest check) and the image sizes;
- power-on -> initrd, -> root image fetched, -> systemd, -> the check line (seen on the
  console by the bench), and kernel -> systemd, kernel -> multi-user.target as
  the guest's systemd recorded them (a getty on the serial console hides systemd's
  own status lines once it starts); qemu's resident memory and the guest's view.

    .venv/bin/python bench/node_image_boot.py                  # the image of this checkout
    .venv/bin/python bench/node_image_boot.py --runs 3 --memory 1536

Needs the image (``gpufleet local image build``) and qemu-system-x86. The console
goes to ``--console`` (default: a temporary file, printed at the end).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpufleet.local import node_image, vm
from gpufleet.provision import render

MARKERS = {
    "initrd": re.compile(r"Run /init as init process"),
    "root image fetched": re.compile(r"rootfs\.squashfs' saved"),
    "systemd": re.compile(r"systemd\[1\]: systemd \d+"),
    "check line": re.compile(r"GPUFLEET-CHECK .*"),
}

CHECK = r"""#!/bin/sh
# Wait (bounded) for the agent install that runs beside cloud-init, then report.
for i in $(seq 1 180); do
  s=$(systemctl is-active gpufleet-agent-install.service)
  [ "$s" = active ] || [ "$s" = failed ] && break
  sleep 1
done
mem=$(free -m | awk '/^Mem:/ {print "used=" $3 "MiB,available=" $7 "MiB"}')
# Seconds since the kernel started (systemd's monotonic timestamps, microseconds).
at() { echo "$1" | awk '{printf "%.1f", $1 / 1e6}'; }
userspace=$(at "$(systemctl show -p UserspaceTimestampMonotonic --value)")
multiuser=$(at "$(systemctl show -p ActiveEnterTimestampMonotonic --value multi-user.target)")
echo "GPUFLEET-CHECK multi-user=$(systemctl is-active multi-user.target)" \
  "kernel->systemd=${userspace}s kernel->multi-user=${multiuser}s" \
  "containerd=$(systemctl is-active containerd)" \
  "kubelet=$(kubelet --version | tr ' ' _)" \
  "kubeadm=$(kubeadm version -o short)" \
  "pause=$(ctr -n k8s.io images ls -q | grep -c '^gpufleet.local/pause:')" \
  "agent-install=$s agent=$(/opt/gpufleet/venv/bin/gpufleet --version 2>/dev/null | tr ' ' _)" \
  "agent-unit=$(systemctl is-active gpufleet-agent.service)" \
  "hostname=$(hostname) listening=$(ss -Hltun | awk '{print $5}' | sort -u | tr '\n' ,)" \
  "mem=$mem uptime=$(cut -d' ' -f1 /proc/uptime)s" > /dev/console
"""


def user_data(wheel_env: str) -> str:
    import yaml

    doc = {
        "write_files": [
            {"path": "/etc/gpufleet/agent.env", "permissions": "0644", "content": wheel_env},
            {"path": "/usr/local/sbin/gpufleet-check", "permissions": "0755", "content": CHECK},
        ],
        "runcmd": [["/usr/local/sbin/gpufleet-check"]],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)


def build_wheel(out: Path) -> Path:
    """A wheel of this checkout (what the local cluster serves to its machines)."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(root)],
        check=True,
    )  # fmt: skip
    (wheel,) = out.glob("gpufleet-*.whl")
    return wheel


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def accel(tb_size: int) -> str:
    """vm.accelerator(), with TCG's translation cache capped at ``tb_size`` MiB if given
    (qemu's default, 1 GiB, is host memory on top of the guest's)."""
    chosen = vm.accelerator()
    return f"{chosen},tb-size={tb_size}" if tb_size and chosen.startswith("tcg") else chosen


def boot_once(
    image: node_image.NodeImage,
    port: int,
    console: Path,
    memory: int,
    timeout: float,
    tb_size: int = 0,
) -> dict[str, object]:
    base = f"http://10.0.2.2:{port}"
    append = " ".join(
        [
            "console=ttyS0,115200n8",
            f"boot=live fetch={base}/rootfs.squashfs",
            f"ds=nocloud;s={base}/seed/",
            "panic=10",
        ]
    )
    console.write_bytes(b"")
    argv = [
        "qemu-system-x86_64", "-accel", accel(tb_size), "-cpu", "max", "-smp", "1",
        "-m", str(memory), "-nodefaults", "-no-user-config", "-display", "none",
        "-vga", "none", "-no-reboot",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", append,
        "-nic", "user,model=virtio-net-pci", "-device", "virtio-rng-pci",
        "-chardev", f"file,id=console,path={console}", "-serial", "chardev:console",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: dict[str, float] = {}
    check = ""
    peak_rss = 0.0
    try:
        while time.monotonic() - start < timeout and proc.poll() is None:
            text = console.read_bytes().decode(errors="replace")
            for name, pattern in MARKERS.items():
                if name not in seen and (m := pattern.search(text)):
                    seen[name] = time.monotonic() - start
                    if name == "check line":
                        check = m.group(0).strip()
            peak_rss = max(peak_rss, rss_mib(proc.pid))
            if "check line" in seen:
                break
            time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if "check line" not in seen:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(
            f"no check line within {timeout:.0f} s (qemu exit {proc.returncode}); "
            f"reached: {sorted(seen, key=seen.get)}; console: {console}\n{err[-2000:]}"  # type: ignore[arg-type]
        )
    return {"times": seen, "check": check, "qemu_rss_mib": peak_rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--memory", type=int, default=2048, help="MiB (at most 2048)")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per boot")
    parser.add_argument("--console", type=Path, default=None)
    parser.add_argument(
        "--tb-size", type=int, default=0, help="TCG translation cache MiB (0: qemu's default)"
    )
    args = parser.parse_args()
    if args.memory > 2048:
        parser.error("--memory: at most 2048 MiB")
    if shutil.which("qemu-system-x86_64") is None:
        raise SystemExit("qemu-system-x86_64 missing: apt-get install qemu-system-x86")

    t0 = time.perf_counter()
    key = node_image.Inputs.of_checkout().key()
    image = node_image.find(key)
    lookup_ms = (time.perf_counter() - t0) * 1000
    if image is None:
        raise SystemExit(f"no node image {key}: run `gpufleet local image build` first")
    print(f"node image {image.key}: cached lookup {lookup_ms:.0f} ms")
    for name, size in image.sizes().items():
        print(f"  {name:<16} {size / 2**20:8.1f} MiB")
    print(f"  first build: {image.manifest.get('build_seconds')} s")
    print(f"accelerator: {accel(args.tb_size)} (1 vCPU, {args.memory} MiB)")

    with tempfile.TemporaryDirectory(prefix="gpufleet-image-bench-") as tmp:
        web = Path(tmp) / "web"
        seed = web / "seed"
        seed.mkdir(parents=True)
        for f in ("rootfs.squashfs",):
            (web / f).symlink_to(image.directory / f)
        wheel = build_wheel(web)
        config = render.BootConfig(
            apiserver="10.0.2.2:6443",
            ca_hash="sha256:00",
            public_url="http://10.0.2.2",
            agent_wheel_url="",
            agent_args="--backend simulated",
        )
        server, port = serve(web)
        env = render.agent_env(config, "bench-node-0")
        env += f'GPUFLEET_WHEEL_URL="http://10.0.2.2:{port}/{wheel.name}"\n'
        env += f'GPUFLEET_WHEEL_SHA256="{hashlib.sha256(wheel.read_bytes()).hexdigest()}"\n'
        (seed / "meta-data").write_text(render.meta_data("bench-node-0"))
        (seed / "user-data").write_text(user_data(env))
        (seed / "vendor-data").write_text("")
        (seed / "network-config").write_text("config: disabled\n")
        console = args.console or Path(tmp) / "console.log"
        results = []
        try:
            for run in range(args.runs):
                r = boot_once(image, port, console, args.memory, args.timeout, args.tb_size)
                results.append(r)
                times = r["times"]
                assert isinstance(times, dict)
                print(f"run {run + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
                print(f"  qemu RSS peak {r['qemu_rss_mib']:.0f} MiB; {r['check']}")
        finally:
            server.shutdown()
        if args.runs > 1:
            for name in MARKERS:
                values = [r["times"][name] for r in results]  # type: ignore[index]
                print(f"  {name:<20} median {statistics.median(values):6.1f} s")
        if args.console is None:
            print(f"(console of the last run: {len(console.read_bytes())} bytes, not kept)")


if __name__ == "__main__":
    main()
