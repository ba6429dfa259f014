"""The user-data tells the node image how to start its agent (``/etc/gpufleet/agent.env``)
only when the service is given a wheel to install; the join itself is unchanged."""

from __future__ import annotations

import yaml

from gpufleet.api.machine import MachineSpec
from gpufleet.provision import render

SPEC = MachineSpec.model_validate(
    {
        "macs": ["52:54:00:67:00:00"],
        "serial": "SN-vm-node-0000",
        "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": "ns/bmc"},
        "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
    }
)


def _files(config: render.BootConfig) -> dict[str, dict[str, str]]:
    doc = yaml.safe_load(
        render.user_data(config, "vm-node-0000", SPEC, "abcdef.0123456789abcdef").removeprefix(
            "#cloud-config\n"
        )
    )
    return {f["path"]: f for f in doc["write_files"]}


def test_no_wheel_no_agent_env() -> None:
    config = render.BootConfig(apiserver="10.0.2.100:6443", ca_hash="sha256:00", public_url="x")
    assert set(_files(config)) == {"/etc/gpufleet/kubeadm-join.yaml"}


def test_the_agent_env_names_the_node_the_wheel_and_the_arguments() -> None:
    config = render.BootConfig(
        apiserver="10.0.2.100:6443",
        ca_hash="sha256:00",
        public_url="http://10.0.2.100:8080",
        agent_wheel_url="http://10.0.2.100:8080/boot/gpufleet-0.1.0-py3-none-any.whl",
        agent_wheel_sha256="ab" * 32,
        agent_args="--backend simulated --inject-port 9401",
    )
    env = _files(config)["/etc/gpufleet/agent.env"]["content"]
    assert env.splitlines() == [
        'NODE_NAME="vm-node-0000"',
        'GPUFLEET_WHEEL_URL="http://10.0.2.100:8080/boot/gpufleet-0.1.0-py3-none-any.whl"',
        f'GPUFLEET_WHEEL_SHA256="{"ab" * 32}"',
        'GPUFLEET_AGENT_ARGS="--backend simulated --inject-port 9401"',
    ]
    join = yaml.safe_load(_files(config)["/etc/gpufleet/kubeadm-join.yaml"]["content"])
    assert join["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "10.0.2.100:6443"
