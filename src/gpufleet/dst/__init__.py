"""Deterministic simulation of gpufleet: the real products against in-memory systems.

The real lifecycle controller, Slurm syncer and node agent run on a deterministic event
loop (:mod:`~gpufleet.dst.loop`) against in-memory Kubernetes (:mod:`~gpufleet.dst.kube`),
Slurm (:mod:`~gpufleet.dst.slurm`) and BMCs (:mod:`~gpufleet.dst.bmc`), wired together in
a :mod:`~gpufleet.dst.world`. A seed draws the environment (:mod:`~gpufleet.dst.scenario`)
and every scheduling choice (:mod:`~gpufleet.dst.choices`): crashes at any await, lost,
late and duplicated answers, partitions, a second replica, forged writes. The
invariants (:mod:`~gpufleet.dst.invariants`) are checked at every write and every act;
:mod:`~gpufleet.dst.runner` runs, replays and shrinks seeds (docs/dst.md).
"""
