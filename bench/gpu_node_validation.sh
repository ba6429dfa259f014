#!/usr/bin/env bash
# Validate the agent's real backend on a machine with NVIDIA GPUs, in one pass.
#
# Writes into DIR (default $OUT, else /tmp/gpufleet-gpu-validation):
#   nvidia-smi.txt        nvidia-smi and nvidia-smi -q (the formats the real backend parses)
#   kernel-nvidia.txt     the kernel log's NVRM / NVIDIA lines (format of Xid and bus messages)
#   gpu_checks.json       bench/gpu_checks.py: NVML readings, every check, GEMM TFLOP/s, HBM GB/s
#   health-check.txt      `gpufleet health check --backend real -o wide` and its exit code
#   sweep.json            GEMM and copy at several sizes (how the check's figure compares)
#   agent.log             that agent's log, the GPU processes and its RSS at the end
#   busy.json             whether NVML sees a running CUDA process (the active-check guard), and
#                         that none of ours is left after the child-process GEMM
#   agent-metrics.txt     /metrics of `gpufleet agent --backend real --no-kube --active-every 15`
#
# Needs python3 with torch (CUDA) and nvidia-ml-py; gpufleet from this checkout (src/ on
# PYTHONPATH) and its other dependencies installed. Usage:
#
#     bench/gpu_node_validation.sh [DIR]
set -u
out=${1:-${OUT:-/tmp/gpufleet-gpu-validation}}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cli='import sys; from gpufleet.cli.main import main; sys.exit(main())'
gpufleet() { python3 -c "$cli" "$@"; }
step() { echo "== $(date +%T) $*"; }

step "nvidia-smi"
{ nvidia-smi; nvidia-smi -q; } >"$out/nvidia-smi.txt" 2>&1
head -20 "$out/nvidia-smi.txt"
python3 -c 'import torch, pynvml, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nvidia-ml-py", getattr(pynvml, "__version__", "?"))'

step "kernel log"
{ dmesg 2>&1 || timeout 2 cat /dev/kmsg; } | grep -iE 'nvrm|nvidia|xid' >"$out/kernel-nvidia.txt"
wc -l "$out/kernel-nvidia.txt"; head -5 "$out/kernel-nvidia.txt"

step "bench/gpu_checks.py --iters 10"
t0=$SECONDS; python3 "$here/bench/gpu_checks.py" --iters 10 >"$out/gpu_checks.json"; echo "wall $((SECONDS - t0)) s"
python3 - "$out/gpu_checks.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("profile", d.get("profile"), "gemm", d.get("gemm_tflops"), "hbm", d.get("hbm_gbps"), "total_s", d.get("total_seconds"))
for c in d.get("checks", []):
    print(f"  {c['name']:12} {c['status']:8} {c.get('duration_s', 0):8.3f}s  {c.get('message', '')[:110]}")
EOF

step "gpufleet health check --backend real -o wide (default iters)"
t0=$SECONDS; gpufleet health check --backend real -o wide >"$out/health-check.txt" 2>&1
echo "exit $? wall $((SECONDS - t0)) s" >>"$out/health-check.txt"
cat "$out/health-check.txt" | cut -c1-200

step "size sweep"
python3 - <<'EOF' | tee "$out/sweep.json"
import json, time, torch
res = {"device": torch.cuda.get_device_name(0), "gemm": [], "copy": []}
for n in (2048, 4096, 8192, 16384):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); iters = 20 if n < 16384 else 5
    t = time.perf_counter()
    for _ in range(iters): a @ b
    torch.cuda.synchronize(); s = (time.perf_counter() - t) / iters
    res["gemm"].append({"n": n, "tflops": round(2 * n**3 / s / 1e12, 1), "ms": round(s * 1e3, 3)})
    del a, b
for nbytes in (64 << 20, 512 << 20, 2 << 30, 8 << 30):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    dst.copy_(src); torch.cuda.synchronize(); iters = 20
    t = time.perf_counter()
    for _ in range(iters): dst.copy_(src)
    torch.cuda.synchronize(); s = (time.perf_counter() - t) / iters
    res["copy"].append({"bytes": nbytes, "gbps_read_plus_write": round(2 * nbytes / s / 1e9, 1), "gbps_bytes_once": round(nbytes / s / 1e9, 1)})
    del src, dst
print(json.dumps(res))
EOF

step "busy guard: does NVML see a CUDA process?"
python3 -c 'import torch,time; x=torch.ones(1<<20,device="cuda"); open("/tmp/gf-busy","w").close(); time.sleep(40)' &
holder=$!
for _ in $(seq 60); do [ -e /tmp/gf-busy ] && break; sleep 0.5; done
python3 - "$holder" >"$out/busy.json" <<'EOF'
import json, sys, pynvml
from gpufleet.health.backend_real import RealHardware
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
procs = [{"pid": p.pid, "used": p.usedGpuMemory} for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
hw = RealHardware()
print(json.dumps({"holder_pid": int(sys.argv[1]), "nvml_processes": procs, "busy": hw.busy()}))
hw.close()
EOF
cat "$out/busy.json"
kill $holder 2>/dev/null; wait $holder 2>/dev/null; rm -f /tmp/gf-busy
python3 -c 'from gpufleet.health.backend_real import RealHardware as R; h=R(); print("busy after the holder exited:", h.busy()); h.close()' | tee -a "$out/busy.json"

step "isolation: the GEMM runs in a child; afterwards no process of ours holds the GPU"
cat >/tmp/gf-isolation.py <<'EOF2'
import json, os, time
from gpufleet.health.backend_real import RealHardware
if __name__ == "__main__":  # the GEMM's child process imports this file again
    hw = RealHardware()
    t = time.perf_counter()
    runs = hw.run_gemm(8192, 3, 1234)
    spent = time.perf_counter() - t
    print(json.dumps({"gemm_tflops": {i: round(r.tflops, 1) for i, r in runs.items()},
                      "run_gemm_seconds_with_child_start": round(spent, 2),
                      "busy_after": hw.busy(), "parent_pid": os.getpid()}))
    hw.close()
EOF2
python3 /tmp/gf-isolation.py >>"$out/busy.json"
tail -1 "$out/busy.json"

step "agent --backend real --no-kube --active-every 15, 50 s"
: >"$out/agent.log"  # the agent appends: the lines added after it stay
python3 -c "$cli" agent --node gpu-validation --backend real --no-kube --metrics-port 29440 --interval 1 \
    --active-every 15 >>"$out/agent.log" 2>&1 &
agent=$!
sleep 50
curl -s --max-time 5 http://127.0.0.1:29440/metrics >"$out/agent-metrics.txt"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$out/agent.log" 2>&1
grep -E "^VmRSS" /proc/$agent/status >>"$out/agent.log" 2>&1
kill $agent; wait $agent 2>/dev/null
grep -E '^gpufleet_(gpu|check)' "$out/agent-metrics.txt" | grep -v UUID | head -40
tail -8 "$out/agent.log"
step done
