"""gpufleet.local: a whole GPU cluster on one machine (see docs/local-cluster.md).

Real etcd, kube-apiserver, kube-scheduler, kube-controller-manager and KWOK
(fake GPU nodes), real Slurm (munged, slurmctld, one slurmd per node,
slurmrestd) and one Redfish BMC per node, on loopback with free ports and a
private run directory. Modules, each with one job:

- ``binaries``: where the built Go binaries and the Slurm packages are;
- ``processes``: spawn in a process group, wait until ready, stop, sweep;
- ``kube``, ``slurm``, ``redfish``: each side's configuration, commands, readiness;
- ``cluster``: :class:`~gpufleet.local.cluster.LocalCluster` composing them.
"""
