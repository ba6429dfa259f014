"""Storage that binds on the local cluster's machines: a default StorageClass and volumes.

The chart's slurmctld keeps its StateSaveLocation on a PersistentVolumeClaim of the
cluster's default StorageClass. A cluster an operator installs into has a provisioner;
the local cluster has none, so with ``ClusterSpec.images`` it creates what a static
local-volume setup has: a default StorageClass ``local-machines`` (no provisioner,
``WaitForFirstConsumer``: a claim binds once its pod is scheduled, to a volume where
the pod can run) and :data:`VOLUMES` volumes of :data:`SIZE`, each a directory of a
system machine (``hostPath``, created by the kubelet), pinned there by node affinity.

A machine's root is RAM, so what is written there lives until the machine reboots:
enough for slurmctld's state across restarts of its pod, not across a power cycle of
the machine (a real cluster's volume survives both).
"""

from __future__ import annotations

from typing import Any

from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import machines

Json = dict[str, Any]
CLASS = "local-machines"
VOLUMES = 2
SIZE = "10Gi"
"""What the chart's claim asks by default (``slurm.controller.persistence.size``)."""
ROOT = "/var/lib/gpufleet/volumes"


def objects(pool: str | None) -> list[tuple[str, Json]]:
    """(collection path, object): the StorageClass, then the volumes (on machines of
    ``pool`` when given, else on any machine)."""
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }
    where = machines.service_node_terms(pool)
    out: list[tuple[str, Json]] = [("/apis/storage.k8s.io/v1/storageclasses", storage_class)]
    for i in range(VOLUMES):
        name = f"{CLASS}-{i}"
        out.append(
            (
                "/api/v1/persistentvolumes",
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": name},
                    "spec": {
                        "capacity": {"storage": SIZE},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": CLASS,
                        "hostPath": {"path": f"{ROOT}/{name}", "type": "DirectoryOrCreate"},
                        "nodeAffinity": {
                            "required": {"nodeSelectorTerms": [{"matchExpressions": where}]}
                        },
                    },
                },
            )
        )
    return out


def install(api: SyncKube, pool: str | None = None) -> None:
    """Create every object (one that exists already is kept)."""
    for path, body in objects(pool):
        api.create(path, body)
