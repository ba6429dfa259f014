"""Inventory files: valid ones become Machine specs, bad ones are refused with the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.provision import inventory, machines

HEADER = (
    "name,macs,serial,bmc_endpoint,bmc_secret,pool,gpu_model,gpu_count,hca_count,"
    "ib_leaf,ib_block,enrollment_digest\n"
)
ROW = (
    "gpu-node-0100,AA-BB-CC-00-01-00;aa:bb:cc:00:01:01,SN-0100,https://10.0.1.100/,"
    "gpufleet-system/bmc-0100,train,NVIDIA H100 80GB HBM3,8,8,leaf-01,block-a,\n"
)


def test_a_csv_row_becomes_a_normalised_machine() -> None:
    [entry] = inventory.parse_csv(HEADER + ROW)
    spec = entry.spec
    assert entry.name == "gpu-node-0100" and entry.line == 2
    assert spec.macs == ["aa:bb:cc:00:01:00", "aa:bb:cc:00:01:01"]
    assert spec.bmc.endpoint == "https://10.0.1.100"
    assert spec.hardware.gpu_model == "NVIDIA-H100-80GB-HBM3"
    assert spec.topology.leaf == "leaf-01" and spec.pool == "train"
    body = machines.manifest(entry.name, spec)
    assert body["metadata"]["labels"]["mac.gpufleet.io/aabbcc000100"] == "true"
    assert body["spec"]["hardware"] == {
        "gpuModel": "NVIDIA-H100-80GB-HBM3",
        "gpuCount": 8,
        "hcaCount": 8,
    }


def test_a_malformed_csv_is_rejected_whole_with_the_lines_at_fault() -> None:
    bad_mac = ROW.replace("gpu-node-0100", "gpu-node-0101").replace("AA-BB-CC-00-01-00;", "zz:1;")
    bad_count = ROW.replace("gpu-node-0100", "gpu-node-0102").replace(",8,8,", ",eight,8,")
    bad_count = bad_count.replace("aa:bb:cc:00:01:01", "aa:bb:cc:00:02:01").replace(
        "AA-BB-CC-00-01-00", "aa:bb:cc:00:02:00"
    )
    text = HEADER + ROW + "# a comment\n" + bad_mac + bad_count + "short,row\n"
    with pytest.raises(inventory.InventoryError) as err:
        inventory.parse_csv(text, "rack.csv")
    lines = [line for line, _ in err.value.problems]
    assert lines == [4, 5, 6]
    message = str(err.value)
    assert "rack.csv:4: " in message and "not a MAC address: 'zz:1'" in message
    assert "rack.csv:5: gpu-node-0102: hardware.gpuCount" in message
    assert "rack.csv:6: 2 fields" in message


def test_duplicate_macs_and_names_are_refused() -> None:
    other = ROW.replace("gpu-node-0100", "gpu-node-0101")
    with pytest.raises(inventory.InventoryError) as err:
        inventory.parse_csv(HEADER + ROW + other)
    assert "MAC aa:bb:cc:00:01:00 is also gpu-node-0100's (line 2)" in str(err.value)


def test_a_missing_column_is_named() -> None:
    with pytest.raises(inventory.InventoryError, match=r"missing column.*serial"):
        inventory.parse_csv("name,macs\nx,aa:bb:cc:dd:ee:ff\n")


YAML = """\
machines:
  - name: gpu-node-0200
    spec:
      macs: ["aa:bb:cc:00:02:00"]
      serial: SN-0200
      bmc: {endpoint: "http://10.0.2.1", credentialsSecret: gpufleet-system/bmc-0200}
      hardware: {gpuModel: NVIDIA-H100-80GB-HBM3, gpuCount: 8, hcaCount: 8}
  - name: gpu-node-0201
    spec:
      macs: ["aa:bb:cc:00:02:01"]
      serial: SN-0201
      bmc: {endpoint: "ftp://10.0.2.2", credentialsSecret: gpufleet-system/bmc-0201}
      hardware: {gpuModel: NVIDIA-H100-80GB-HBM3, gpuCount: 8, hcaCount: 8}
"""


def test_yaml_errors_name_the_line_of_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "rack.yaml"
    path.write_text(YAML)
    with pytest.raises(inventory.InventoryError) as err:
        inventory.load(path)
    assert err.value.problems[0][0] == 8
    assert "bmc.endpoint" in err.value.problems[0][1]
    path.write_text(YAML.split("  - name: gpu-node-0201")[0])
    [entry] = inventory.load(path)
    assert entry.name == "gpu-node-0200" and entry.line == 2


def test_broken_yaml_names_its_line() -> None:
    with pytest.raises(inventory.InventoryError) as err:
        inventory.parse_yaml("machines:\n  - name: a\n    spec: {macs: [\n", "x.yaml")
    assert err.value.problems[0][0] >= 3
