"""Slurm and Kubernetes as one fleet: owns the Slurm side of every node (drain, resume,
requeue, lending) and the SlurmCluster's slurm.conf. Three products, three processes:

- the **syncer** (:mod:`.syncer`, ``gpufleet slurm sync``): Node state and conditions ->
  Slurm drain/resume and job requeue; Slurm node and job state -> Node annotations and the
  ``SlurmNode`` condition. :mod:`.background` runs it in a thread for synchronous callers;
- the **lender** (:mod:`.lender`, run inside the syncer's process): lends idle Slurm nodes
  to high-priority Pods and takes them back (preemption); it reaches the syncer only through
  ``lender.SyncerPort`` (an import-linter contract);
- the **SlurmCluster operator** (:mod:`.operator`, ``gpufleet slurm operator``): renders
  slurm.conf, gres.conf and topology.conf (:mod:`.render`) into a ConfigMap and reconfigures.

Shared by the three: :mod:`.ports` (what they use of Slurm, as Protocols), :mod:`.restapi`
(slurmrestd reads), :mod:`.scontrol` (writes), :mod:`.nodes` (Node JSON <-> the syncer's
view), :mod:`.hostlist`, :mod:`.errors`, :mod:`.metrics`, :mod:`.crd` (the SlurmCluster
model, from :mod:`gpufleet.api`).
"""
