"""gpufleet's Kubernetes API: every custom resource's model, names and CRD schema.

Products import these models instead of each other; :mod:`gpufleet.api.crds`
is the one generator of the committed CRD YAMLs. Imports only ``domain``.
"""
