"""The built-in policy, as the YAML a user would write.

Kept as text (not Python objects) so that ``gpufleet policy show`` prints
exactly what is in force and users can start their own file from it.
The reasons for each choice are in docs/policy.md and docs/decisions/0004.
"""

DEFAULT_POLICY_YAML = """\
# gpufleet default policy (FleetPolicy spec). Times are in seconds.
dryRun: false
paused: false
unknownXid: log

drain:
  mode: evict                 # Eviction API; PodDisruptionBudgets are respected
  timeoutSeconds: 600

rules:
  # --- XIDs. Application-level ones restart the job and only count against
  # the GPU when they repeat; the rest start the ladder where NVIDIA says.
  - match: {xid: 8}
    action: restart-job
    repeat: {count: 3, windowSeconds: 3600, scope: component, then: gpu-reset}
  - match: {xid: 13}
    action: restart-job
    repeat: {count: 3, windowSeconds: 3600, scope: component, then: gpu-reset}
    note: usually a program bug; three on the same GPU within an hour points at the GPU
  - match: {xid: 31}
    action: restart-job
    repeat: {count: 3, windowSeconds: 3600, scope: component, then: gpu-reset}
  - match: {xid: 43}
    action: ignore
  - match: {xid: 45}
    action: log
    note: secondary to the XID before it
  - match: {xid: 48}
    action: gpu-reset
    taint: NoExecute
    note: double-bit ECC; the reset applies the row remap
  - match: {xid: 63}
    action: log
    repeat: {count: 4, windowSeconds: 86400, scope: component, then: gpu-reset}
  - match: {xid: 64}
    action: gpu-reset
    taint: NoExecute
  - match: {xid: 74}
    action: gpu-reset
    taint: NoExecute
  - match: {xid: 79}
    action: reboot
    taint: NoExecute
    note: GPU fell off the bus; a reboot (reimage for stateless nodes) is the first step
  - match: {xid: 92}
    action: log
  - match: {xid: 94}
    action: restart-job
    repeat: {count: 2, windowSeconds: 86400, scope: component, then: gpu-reset}
  - match: {xid: 95}
    action: gpu-reset
    taint: NoExecute
  - match: {xid: 119}
    action: reboot
    taint: NoExecute
    note: GSP timeouts rarely clear with a GPU reset in practice
  - match: {xid: 154}
    action: gpu-reset
    taint: NoExecute
    note: the rung is raised to what the driver's recovery action asks for

  # --- GPU memory and presence
  - match: {fault: ecc-uncorrectable}
    action: gpu-reset
    taint: NoExecute
  - match: {fault: row-remap-pending}
    action: gpu-reset
    drain: wait
    requeue: let-finish
    note: the remap needs a reset, but not before running jobs end
  - match: {fault: row-remap-failed}
    action: rma
  - match: {fault: retired-pages-limit}
    action: rma
  - match: {fault: gpu-missing}
    action: reboot
    taint: NoExecute
  - match: {fault: sdc-mismatch}
    action: triage
    taint: NoExecute
    note: a GPU that computes wrong answers must not run another step
  - match: {fault: dcgm-diag-failed}
    action: gpu-reset

  # --- links
  - match: {fault: nvlink-down}
    action: gpu-reset
    taint: NoExecute
  - match: {fault: ib-port-down}
    action: reboot
    taint: NoExecute
  - match: {fault: ib-link-flap}
    action: log
    repeat: {count: 3, windowSeconds: 600, scope: component, then: reboot}
  - match: {fault: ib-rate-degraded}
    action: reboot
    drain: wait
    requeue: let-finish
  - match: {fault: ib-symbol-errors}
    action: log
    repeat: {count: 3, windowSeconds: 3600, scope: component, then: reboot}
  - match: {fault: pcie-degraded}
    action: reboot
    drain: wait
    requeue: let-finish
  - match: {fault: nvswitch-fatal}
    action: reboot
    taint: NoExecute
    note: a fatal SXid stalls NVLink traffic until the GPUs and NVSwitches are reset
  - match: {fault: nvswitch-nonfatal}
    action: log
  - match: {fault: fabric-not-ready}
    action: reboot
    note: a GPU outside the NVLink fabric cannot start CUDA; a reboot re-registers it
  - match: {fault: fabric-degraded}
    action: reboot
    drain: wait
    requeue: let-finish
  - match: {fault: imex-not-ready}
    action: reboot
    drain: wait
    requeue: let-finish

  # --- thermal, kernel
  - match: {fault: thermal-throttle}
    action: log
    repeat: {count: 5, windowSeconds: 3600, scope: node, then: triage}
    note: cooling problems need a person, not a reboot
  - match: {fault: power-throttle}
    action: log
    repeat: {count: 5, windowSeconds: 3600, scope: node, then: triage}
  - match: {fault: kernel-soft-lockup}
    action: log
    repeat: {count: 3, windowSeconds: 3600, scope: node, then: reboot}
  - match: {fault: kernel-hung-task}
    action: log
    repeat: {count: 3, windowSeconds: 3600, scope: node, then: reboot}

  # --- performance (active checks and job telemetry)
  - match: {fault: gemm-below-threshold}
    action: gpu-reset
  - match: {fault: hbm-below-threshold}
    action: gpu-reset
  - match: {fault: nccl-below-threshold}
    action: reboot
  - match: {fault: straggler}
    action: log
    repeat: {count: 3, windowSeconds: 86400, scope: node, then: reboot}

  # --- Slurm's own health machinery (a foreign drain judged hardware by slurm.reasons)
  - match: {fault: slurm-drain}
    action: reboot
    drain: wait
    requeue: let-finish
    note: the drainer let running jobs finish; the reboot waits for them, verification follows

ladder:
  - {step: gpu-reset,   timeoutSeconds: 600,  attempts: 1}
  - {step: reboot,      timeoutSeconds: 1200, attempts: 1}
  - {step: power-cycle, timeoutSeconds: 1800, attempts: 1}
  - {step: reimage,     timeoutSeconds: 3600, attempts: 1, onFailure: triage}

# A decayed, class-weighted score per node and per GPU (docs/policy.md, "Lemons"):
# three GPU hardware incidents within about a week, or two on one GPU with more
# trouble on that GPU, send the node to triage instead of another repair cycle.
lemon:
  threshold: 2.5
  gpuThreshold: 2.0
  halfLifeDays: 14
  weights:                    # what one fault of each class adds (docs/policy.md)
    hardware: 1.0
    link: 0.5
    performance: 0.5
    software: 0.5
    environment: 0.1
    informational: 0.1
    application: 0
  then: triage

# Hot spares per node pool (docs/policy.md, "Hot spares"): verified nodes kept out of
# training work, promoted the moment a node of the pool leaves production.
spares:
  percent: 1                  # floor(pool size * 1%): none in pools under 100 nodes
  minNodes: 0
  maxNodes: 50

# The budget holds per node pool; add fleetMaxNodes and/or fleetMaxPercent to cap the
# whole fleet too (every pool together; none by default).
safety:
  budget:    {maxNodes: 50, maxPercent: 10, minNodes: 1}
  breaker:   {maxNodes: 20, maxPercent: 10, minNodes: 2, windowSeconds: 600, cooldownSeconds: 1800}
  rateLimit: {maxActions: 30, windowSeconds: 600}

checks:
  verificationProfile: verify
  verificationTimeoutSeconds: 1800
  burnInProfile: burn-in
  burnInTimeoutSeconds: 14400

detection:
  raiseAfterSeconds: 0
  clearAfterSeconds: 300
  stragglers:
    slowerThan: 1.08
    windowSteps: 50
    reportEverySeconds: 1800

# Drain reasons set in Slurm by others (first match wins; searched, case-insensitive).
# hardware: a slurm-drain fault (rule above); job: nothing done; admin: never touched.
slurm:
  unmatched: admin            # a reason no pattern knows is a person's hold
  reasons:
    - {pattern: '^gpufleet: health\\b', verdict: hardware, note: a gpufleet health check failed}
    - {pattern: '^NHC:', verdict: hardware, note: LBNL Node Health Check}
    - {pattern: '^Prolog error', verdict: hardware, note: the prolog failed on this node}
    - {pattern: '^Epilog error', verdict: hardware, note: the epilog failed on this node}
    - {pattern: '^Kill task failed', verdict: hardware, note: processes could not be killed}
    - {pattern: '^Not responding', verdict: hardware, note: slurmctld lost contact with slurmd}
    - {pattern: '^Node unexpectedly rebooted', verdict: hardware, note: an unplanned reboot}
    - {pattern: '^Low (RealMemory|TmpDisk|socket)', verdict: hardware, note: missing hardware}
    - {pattern: '^gres/gpu count', verdict: hardware, note: fewer GPUs than configured}
    - {pattern: '^batch job complete failure', verdict: job, note: the batch host failed a job}
    - {pattern: '^(job|user)\\b', verdict: job, note: a reason that names a job or user}
"""
