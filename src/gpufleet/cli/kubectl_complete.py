"""``kubectl_complete-gpufleet``: completion of ``kubectl gpufleet <TAB>``.

kubectl (1.26 and later) completes a plugin's arguments by running
``kubectl_complete-<plugin>`` from PATH with the words typed after the plugin's name,
the last one the word being completed, and reads the answer in cobra's ``__complete``
form: one candidate a line (a tab, then its description), then ``:<directive>`` (4: no
file names; 0: let the shell complete a file, as when nothing else fits). The
candidates are the ones ``gpufleet``'s own completion offers (:mod:`gpufleet.cli.main`):
listing commands imports none of them.
"""

from __future__ import annotations

import sys
from typing import Any

from typer._click.shell_completion import CompletionItem, ShellComplete

FILES = 0
"""cobra's ShellCompDirectiveDefault: the shell completes file names."""
NO_FILES = 4
"""cobra's ShellCompDirectiveNoFileComp."""


class CobraComplete(ShellComplete):
    """Candidates in the form kubectl reads from a plugin's completion executable."""

    name = "cobra"
    source_template = ""

    def __init__(self, cli: Any, words: list[str]) -> None:
        super().__init__(cli, {}, "kubectl gpufleet", "")
        self.words = words or [""]

    def source_vars(self) -> dict[str, Any]:
        return {}  # no script to source: kubectl runs the executable itself

    def get_completion_args(self) -> tuple[list[str], str]:
        return self.words[:-1], self.words[-1]

    def format_completion(self, item: CompletionItem) -> str:
        lines = (item.help or "").strip().splitlines()
        return f"{item.value}\t{lines[0]}" if lines else str(item.value)

    def complete(self) -> str:
        args, incomplete = self.get_completion_args()
        items = self.get_completions(args, incomplete)
        # No candidate (an argument that is a path, a free value): the shell's file names,
        # as gpufleet's own bash script does (complete -o default).
        files = not items or any(i.type in ("file", "dir") for i in items)
        directive = FILES if files else NO_FILES
        return "\n".join([*(self.format_completion(i) for i in items), f":{directive}"])


def main() -> None:
    """Console-script entry point (``kubectl_complete-gpufleet WORD...``)."""
    import typer

    from gpufleet.cli.main import app

    words = sys.argv[1:]
    if words[:1] == ["__complete"]:  # also accept cobra's own form
        words = words[1:]
    print(CobraComplete(typer.main.get_command(app), words).complete())
