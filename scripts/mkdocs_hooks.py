"""mkdocs hooks for the docs site (mkdocs.yml): the decisions' section is built from the folder.

Every other page is named in mkdocs.yml's nav, and the strict build fails on a
page the nav omits. Decisions are added by many changes, one file each, and each
is a page of its own: the nav entry ``Decisions: decisions/`` stands for every
``docs/decisions/NNNN-*.md`` in number order, after an index page generated
here (number and title of each), so a new decision needs no edit of mkdocs.yml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

SECTION = "decisions/"
INDEX = "decisions/index.md"


def _decisions(docs_dir: str) -> list[Path]:
    return sorted(p for p in (Path(docs_dir) / "decisions").glob("[0-9]*.md"))


def _title(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[:1]
    return first[0].lstrip("# ").strip() if first and first[0].startswith("# ") else path.stem


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Replace the nav's ``decisions/`` entry by the index and every decision."""

    def expand(entry: Any) -> Any:
        if isinstance(entry, dict):
            return {k: expand(v) for k, v in entry.items()}
        if isinstance(entry, list):
            return [expand(e) for e in entry]
        if entry == SECTION:
            pages = [f"decisions/{p.name}" for p in _decisions(config.docs_dir)]
            return [INDEX, *pages]
        return entry

    config.nav = expand(config.nav)
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated index of decisions (not a file in the repository)."""
    lines = [
        "# Decisions",
        "",
        "Why things are the way they are: one short record per decision a newcomer would",
        "question, numbered in the order they were taken.",
        "",
    ]
    for path in _decisions(config.docs_dir):
        lines.append(f"- [{_title(path)}]({path.name})")
    files.append(File.generated(config, INDEX, content="\n".join(lines) + "\n"))
    return files
