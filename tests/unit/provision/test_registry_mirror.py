"""The user-data points the node's containerd at a registry (``--registry-mirror``): one
``hosts.toml`` per registry, in the directory containerd's ``config_path`` names."""

from __future__ import annotations

import tomllib

import pytest

from gpufleet.provision import render

from .test_agent_env import _files


def test_a_mirror_writes_hosts_toml_that_pulls_over_plain_http() -> None:
    config = render.BootConfig(
        apiserver="10.0.2.100:6443",
        ca_hash="sha256:00",
        public_url="x",
        registry_mirrors=(("gpufleet.local", "http://10.0.2.100:5000"),),
    )
    hosts = _files(config)["/etc/containerd/certs.d/gpufleet.local/hosts.toml"]
    parsed = tomllib.loads(hosts["content"])
    assert parsed["server"] == "http://10.0.2.100:5000"
    assert parsed["host"]["http://10.0.2.100:5000"]["capabilities"] == ["pull", "resolve"]
    assert hosts["permissions"] == "0644"


def test_no_mirror_no_hosts_file() -> None:
    config = render.BootConfig(apiserver="10.0.2.100:6443", ca_hash="sha256:00", public_url="x")
    assert not [p for p in _files(config) if p.startswith("/etc/containerd/")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpufleet.local=http://10.0.2.100:5000", ("gpufleet.local", "http://10.0.2.100:5000")),
        ("registry:5000=https://r.example/", ("registry:5000", "https://r.example")),
    ],
)
def test_parse_registry_mirror(text: str, expected: tuple[str, str]) -> None:
    assert render.parse_registry_mirror(text) == expected


@pytest.mark.parametrize(
    "text", ["gpufleet.local", "=http://x", "a b=http://x", "gpufleet.local=ftp://x", "r=http://"]
)
def test_a_bad_registry_mirror_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match=r"REGISTRY=URL|http"):
        render.parse_registry_mirror(text)
