"""The CRD reference pages are the generator's output, and every schema field is described."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.api import crd_docs, crds

ROOT = Path(__file__).resolve().parents[3]
REGENERATE = "run python -m gpufleet.api.crd_docs"


def test_committed_pages_are_the_generated_ones() -> None:
    generated = crd_docs.pages()
    committed = {p.name for p in (ROOT / crd_docs.DIR).glob("*.md")}
    assert committed == set(generated), f"{crd_docs.DIR}: pages differ from the CRDs; {REGENERATE}"
    for name, text in generated.items():
        assert (ROOT / crd_docs.DIR / name).read_text() == text, f"{name} is stale: {REGENERATE}"


@pytest.mark.parametrize("name", sorted(crds.manifests()))
def test_every_field_is_on_its_page(name: str) -> None:
    root = crd_docs.root_schema(crds.manifests()[name])
    text = crd_docs.pages()[name.replace(".yaml", ".md")]
    for part in ("spec", "status"):
        paths = [f.path for f in crd_docs.fields(root["properties"][part], part)]
        assert paths, part
        for path in paths:
            assert f"| `{path}` |" in text, f"{name}: {path} has no row"


@pytest.mark.parametrize("name", sorted(crds.manifests()))
def test_every_field_has_a_description(name: str) -> None:
    """``kubectl explain`` says what each field means: the root, spec, status and every
    field below them (an array's or map's own description covers its items)."""
    root = crd_docs.root_schema(crds.manifests()[name])
    schemas = [("", root)] + [(part, root["properties"][part]) for part in ("spec", "status")]
    schemas += [
        (f.path, f.schema)
        for part in ("spec", "status")
        for f in crd_docs.fields(root["properties"][part], part)
    ]
    missing = [path or "<root>" for path, schema in schemas if not schema.get("description")]
    assert not missing, f"{name}: no description for {', '.join(missing)}"


def test_a_row_names_type_required_default_and_allowed_values() -> None:
    text = crd_docs.pages()["slurmclusters.md"]
    row = next(line for line in text.splitlines() if line.startswith("| `spec.nodePools` |"))
    assert "| `[]object` | yes |" in row and "items ≥ 1; items ≤ 32" in row
    cpus = next(line for line in text.splitlines() if "`spec.nodePools[].cpus`" in line)
    assert "| `integer` |  | `64` | ≥ 1 |" in cpus
    mode = next(line for line in text.splitlines() if "`spec.preemption.mode`" in line)
    assert '`"REQUEUE"`' in mode and 'one of `"OFF"`' in mode
    assert "rule: every pool a partition names must be one of spec.nodePools" in text
    policy = crd_docs.pages()["fleetpolicies.md"]
    window = next(line for line in policy.splitlines() if "safety.breaker.windowSeconds`" in line)
    assert "| > 0; ≤ 2592000 |" in window  # a whole-number float bound reads as an integer


def test_a_cell_keeps_pipes_and_angle_brackets_out_of_the_table() -> None:
    assert crd_docs.cell("a | b") == "a &#124; b"
    assert crd_docs.cell("as <pod>.<service>") == "as &lt;pod>.&lt;service>"
    assert crd_docs.cell("pattern `^(a|b_c)$`") == "pattern <code>^(a&#124;b&#95;c)$</code>"
    assert crd_docs.cell("plain `code`") == "plain `code`"
    assert "|" not in crd_docs.cell("one ` backtick | pipe")


def test_types_read_like_go() -> None:
    assert crd_docs.type_of({"type": "array", "items": {"type": "string"}}) == "[]string"
    assert (
        crd_docs.type_of({"type": "object", "additionalProperties": {"type": "integer"}})
        == "map[string]integer"
    )
    assert crd_docs.type_of({"type": "string", "format": "date-time"}) == "string (date-time)"


def test_the_generator_writes_where_it_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert crd_docs.main(["--help"]) == 0
    assert "usage: python -m gpufleet.api.crd_docs" in capsys.readouterr().out
    assert crd_docs.main(["-o"]) == 2
    assert crd_docs.main([str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(crd_docs.pages())
