"""``gpufleet demo``: a fault and its recovery, end to end, on the local cluster.

The demo starts what a user would run -- the local cluster
(:mod:`gpufleet.local`), one agent per node on simulated hardware, the
lifecycle controller and the Slurm syncer, each as its own process with a log
in the cluster's run directory -- submits the example training job through
Slurm, injects a fault and prints a timeline of what the real systems show
(Node conditions, labels and taints; Slurm node and job state; BMC event logs;
the job's own event log). It sits above the products in the import layers: it
composes them, and none of them knows it exists.
"""
