"""The node agent: passive monitors, active checks and hardware backends.

One agent runs per node. Passive monitors read the kernel log, NVML and
sysfs continuously; active checks (GEMM and silent-data-corruption, HBM
bandwidth, intra-node all-reduce, DCGM diagnostics) run on demand or while
the node is idle. Every problem becomes a :class:`gpufleet.domain.FaultEvent`
with evidence, is debounced with :mod:`gpufleet.domain.debounce`, and is
reported as a Node condition, a Node Event and Prometheus metrics.

Hardware sits behind :class:`hardware.Hardware` with two backends: ``real``
(NVML, ``/dev/kmsg``, sysfs, ``dcgmi``) and ``simulated`` (in-memory devices
with fault injection) that produces the same raw formats the real parsers
read. Vendor libraries (pynvml, torch) are imported lazily, only in the
adapter modules ``_nvml`` and ``_torch``; ``kube_report`` (imported lazily
too) reaches Kubernetes through :mod:`gpufleet.kubeapi`.
"""
