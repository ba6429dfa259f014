"""Control plane command lines built without starting anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest

from gpufleet.local import kube
from gpufleet.local.binaries import Binaries

LayoutOf = Callable[..., kube.KubeLayout]


@pytest.fixture
def bins() -> Binaries:
    """Every binary at /bin/<name>: only the command lines are looked at."""
    return Binaries(**{f.name: Path("/bin") / f.name for f in fields(Binaries)})


@pytest.fixture
def layout_of(tmp_path: Path) -> LayoutOf:
    """``layout_of(nodes=..., joinable=...)``: a control plane's layout under tmp_path."""

    def make(*, nodes: int = 4, joinable: bool = False) -> kube.KubeLayout:
        return kube.KubeLayout(
            root=tmp_path, logs=tmp_path / "logs", etcd_client_port=1, etcd_peer_port=2,
            apiserver_port=3, scheduler_port=4, controller_manager_port=5, token="t",
            joinable=joinable, fake_nodes=nodes,
        )  # fmt: skip

    return make
