"""The fake nodes' leases cost the apiserver what a small machine can take."""

from __future__ import annotations

import pytest

from gpufleet.local import kube
from gpufleet.local.binaries import Binaries

from .conftest import LayoutOf


@pytest.mark.parametrize("nodes", [1, 4, 500, 2_000, 5_000, 12_500, 25_000])
def test_renewals_stay_within_the_budget_and_the_grace_outlasts_them(
    layout_of: LayoutOf, bins: Binaries, nodes: int
) -> None:
    layout = layout_of(nodes=nodes)
    lease = kube.node_lease_seconds(layout)
    assert lease >= kube.MIN_LEASE_S
    # KWOK renews every quarter of the lease (as the kubelet does).
    assert nodes / (lease / 4) <= kube.LEASE_RENEWALS_PER_S
    assert f"--node-lease-duration-seconds={lease}" in kube.kwok(layout, bins).argv
    grace = [a for a in kube.controller_manager(layout, bins).argv if "node-monitor-grace" in a]
    if lease == kube.MIN_LEASE_S:
        assert grace == []  # the controller-manager's own default, as with kubelets
    else:
        # Every renewal can be late by most of a lease before the node reads NotReady.
        assert int(grace[0].split("=")[1].rstrip("s")) > lease


def test_small_fleets_and_joinable_clusters_keep_the_kubelets_lease(
    layout_of: LayoutOf, bins: Binaries
) -> None:
    assert kube.node_lease_seconds(layout_of(nodes=500)) == 40
    # A power-cycled machine may rejoin only once its Node reads NotReady: 60 s grace
    # (a boot takes minutes; a loaded kubelet is not read NotReady for one late update).
    joinable = layout_of(nodes=12_500, joinable=True)
    assert kube.node_lease_seconds(joinable) == 40
    assert "--node-monitor-grace-period=60s" in kube.controller_manager(joinable, bins).argv
