"""The lifecycle controller: owns each Node's record, state label, cordon and taints, and
carries out ``domain.decide``'s actions (drain, BMC steps, Events, NodeRemediation objects).

Entry points: :mod:`.operator` (the kopf process, ``gpufleet controller``) and
:class:`.controller.Controller`, whose module docstring states the contract (record first,
act second) and names the module of each part. Below it: :mod:`.nodes` (the Node codec),
:mod:`.bmc` (identity and the write-ahead mark), :mod:`.draining` (what to evict),
:mod:`.machines` (registration), :mod:`.remediations`, :mod:`.fleet`, :mod:`.metrics`.
"""
