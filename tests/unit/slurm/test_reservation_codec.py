"""slurm.scontrol.parse_reservations: the one reader of ``scontrol -o show reservation``."""

from __future__ import annotations

from gpufleet.slurm.scontrol import parse_reservations

TEXT = (
    "ReservationName=gpufleet-tenant-vision StartTime=2026-11-30T00:40:00 "
    "EndTime=Unknown Duration=UNLIMITED Nodes=gpu-node-[0001-0002] NodeCnt=2 CoreCnt=8 "
    "Features=(null) PartitionName=(null) Flags=IGNORE_JOBS,SPEC_NODES TRES=cpu=8 "
    "Users=(null) Groups=(null) Accounts=vision Licenses=(null) State=ACTIVE "
    "BurstBuffer=(null) MaxStartDelay=(null)\n"
    "ReservationName=gpufleet-maint-plan StartTime=2026-12-01T00:00:00 EndTime=Unknown "
    "Nodes=gpu-node-0003 Users=root Accounts=(null) Flags=MAINT,IGNORE_JOBS\n"
)


def test_accounts_and_nodes_are_read() -> None:
    tenant, maint = parse_reservations(TEXT)
    assert tenant.name == "gpufleet-tenant-vision"
    assert tenant.nodes == {"gpu-node-0001", "gpu-node-0002"}
    assert tenant.accounts == {"vision"}
    assert maint.accounts == frozenset() and maint.nodes == {"gpu-node-0003"}
    assert parse_reservations("No reservations in the system\n") == []
