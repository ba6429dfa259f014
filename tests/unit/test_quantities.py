"""Kubernetes quantities and a pod's requests, read as the apiserver and kube-scheduler do
(domain.quantities)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpufleet.domain.quantities import pod_requests, quantity

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("4Gi", Fraction(4 * 2**30)),
        ("1G", Fraction(10**9)),
        ("1e3", Fraction(1000)),
        ("1.5", Fraction(3, 2)),
        ("100k", Fraction(100_000)),
        (".5Mi", Fraction(2**19)),
        (3, Fraction(3)),
        ("4gb", None),
        ("", None),
        ("Gi", None),
        (None, None),
        (True, None),
    ],
)
def test_quantities_read_as_kubernetes_writes_them(raw: object, value: Fraction | None) -> None:
    assert quantity(raw) == value


def test_requests_sum_containers_and_sidecars_and_take_the_largest_init_container() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"limits": {"cpu": "500m", GPU: "4"}}},
        ],
        "initContainers": [
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
            {"resources": {"requests": {"cpu": "3", "memory": "512Mi"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    asked = pod_requests(spec)
    # containers 1.5 + sidecar 0.25 = 1.75 < init 3 + sidecar 0.25; then the overhead
    assert asked["cpu"] == Fraction(3) + Fraction(1, 4) + Fraction(1, 10)
    assert asked["memory"] == 2**30
    assert asked[GPU] == 4


def test_a_request_wins_over_a_limit_and_a_limit_alone_is_the_request() -> None:
    both = {"containers": [{"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}]}
    assert pod_requests(both) == {"cpu": 1}
    assert pod_requests({"containers": [{"resources": {"limits": {GPU: "8"}}}]}) == {GPU: 8}
    assert pod_requests({}) == {}
