"""``gpufleet controller --node-selector``: which Nodes the controller manages."""

from __future__ import annotations

import pytest

from gpufleet.cli.controller_cmd import parse_node_selector


@pytest.mark.parametrize(
    ("text", "labels"),
    [
        ("", {}),
        ("nvidia.com/gpu.present=true", {"nvidia.com/gpu.present": "true"}),
        (
            "gpufleet.io/pool=machines, nvidia.com/gpu.present=true",
            {"gpufleet.io/pool": "machines", "nvidia.com/gpu.present": "true"},
        ),
        ("role=", {"role": ""}),
    ],
)
def test_equality_selectors(text: str, labels: dict[str, str]) -> None:
    assert parse_node_selector(text) == labels


@pytest.mark.parametrize(
    "text", ["gpu", "gpu!=true", "a=b,a=c", "Bad_Prefix/x=y", "k=va lue", "k=-x"]
)
def test_anything_else_is_refused_naming_the_part(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected key=value|given twice"):
        parse_node_selector(text)
