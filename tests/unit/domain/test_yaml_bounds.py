"""YAML input is bounded: size before parsing, depth and expanded node count while composing.

The controller loads any FleetPolicy a user with edit rights wrote, with the
same :func:`load_policy`, so these bounds hold there too.
"""

from __future__ import annotations

import pytest

from gpufleet.domain import yamldoc
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.policy import PolicyError, load_policy

SMALL = yamldoc.Limits(max_bytes=1000, max_depth=4, max_nodes=50)


def _problem(text: str, limits: yamldoc.Limits = SMALL) -> str:
    with pytest.raises(yamldoc.DocumentError) as caught:
        yamldoc.parse_mapping(text, "a test", limits)
    (issue,) = caught.value.issues
    assert issue.location == "(file)"
    return str(issue)


def test_default_limits_hold_the_default_policy_with_room_to_spare() -> None:
    assert len(DEFAULT_POLICY_YAML.encode()) * 10 < yamldoc.LIMITS.max_bytes
    load_policy(DEFAULT_POLICY_YAML)


def test_size_is_refused_before_parsing() -> None:
    # Not even valid YAML: had it been parsed, the problem would be the syntax.
    assert "too large: more than 1000 bytes" in _problem("[" * 1001)
    # Multi-byte characters count as bytes: 300 characters, 1200 bytes.
    assert "too large" in _problem("a: " + "\u20ac" * 400)
    yamldoc.parse_mapping("a: " + "\u20ac" * 300, "a test", SMALL)  # 903 bytes: fine


def test_depth_is_bounded_in_flow_and_block_style() -> None:
    assert yamldoc.parse_mapping("a: [[[1]]]", "a test", SMALL)[1] == {"a": [[[1]]]}
    assert "too deep: nested more than 4 levels" in _problem("a: [[[[1]]]]")
    block = "".join("  " * i + f"k{i}:\n" for i in range(6))
    assert _problem(block).startswith("line 5: (file): too deep")  # the 5th mapping


def test_deep_nesting_far_beyond_the_recursion_limit_is_one_error_not_a_crash() -> None:
    text = "a: " + "[" * 100_000 + "]" * 100_000
    with pytest.raises(PolicyError) as caught:
        load_policy(text, "deep.yaml")
    assert "too deep" in str(caught.value)


def test_aliases_count_at_their_expanded_size() -> None:
    # 10 x 10 x 10 = 1000 values from a 100-byte document ("billion laughs", small).
    laughs = (
        "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b]\n"
    )
    assert "too large: more than 50 values (aliases counted expanded)" in _problem(laughs)
    roomy = yamldoc.Limits(max_depth=4, max_nodes=10_000)
    assert len(yamldoc.parse_mapping(laughs, "a test", roomy)[1]["c"]) == 5


def test_an_alias_adds_its_depth_where_it_is_used() -> None:
    text = "a: &a [[1]]\nb: [[*a]]\n"  # b expands to [[[[1]]]]: 5 levels with the mapping
    assert "too deep" in _problem(text)


def test_recursive_alias_is_refused() -> None:
    assert "recursive alias" in _problem("a: &a [1, *a]\n")


def test_billion_laughs_policy_is_refused_quickly() -> None:
    """Nine levels of ten aliases: 10**9 values if expanded; refused after about 100,000."""
    lines = ["a0: &a0 [x,x,x,x,x,x,x,x,x,x]"]
    for i in range(1, 9):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    with pytest.raises(PolicyError) as caught:
        load_policy("\n".join(lines) + "\n", "laughs.yaml")
    assert "aliases counted expanded" in str(caught.value)


def test_decode_bounds_size_and_names_the_bad_byte() -> None:
    assert yamldoc.decode("a: \u20ac\n".encode()) == "a: \u20ac\n"
    with pytest.raises(yamldoc.DocumentError, match="too large"):
        yamldoc.decode(b"a" * 1001, SMALL)
    with pytest.raises(yamldoc.DocumentError) as caught:
        yamldoc.decode(b"a: 1\nb: \xff\xfe\n")
    assert str(caught.value) == "line 2: (file): not UTF-8 text: byte 0xff at offset 8"


def test_syntax_errors_are_reported_as_before() -> None:
    assert "not valid YAML" in _problem("rules: [")
