"""``gpufleet status``: the fleet on one screen."""

from __future__ import annotations

from gpufleet.cli.options import LOCAL_NAME, LocalNameOpt, RunDirOpt, local_cluster
from gpufleet.cli.output import Format, OutputOpt, emit
from gpufleet.demo import status as fleet_status


def status(
    name: LocalNameOpt = LOCAL_NAME,
    run_dir: RunDirOpt = None,
    output: OutputOpt = Format.TABLE,
) -> None:
    """Nodes by state, nodes out and why, active remediations, Slurm partitions and the
    circuit breaker, for a local cluster (-o wide: nothing cut).

    The demo's cluster (gpufleet demo --keep) is named demo.

    Example:

        gpufleet status --name demo -o yaml
    """
    st = fleet_status.gather(local_cluster(name, run_dir))
    emit(output, fleet_status.to_data(st), lambda wide: fleet_status.render(st, wide=wide))
