"""The Slurm half of ``gpufleet cleanup``: lift gpufleet's own drains on the Nodes the
Kubernetes half released (:mod:`gpufleet.lifecycle.uninstall`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from gpufleet.slurm.restapi import SlurmRest


async def release_drains(
    rest: SlurmRest,
    *,
    clean: Collection[str],
    kept: Mapping[str, str],
    dry_run: bool,
    progress: Callable[[str], None],
) -> tuple[list[str], dict[str, str]]:
    """Undrain each Slurm node drained by gpufleet (reason ``gpufleet: ...``) whose Node is in
    ``clean`` (released, or never marked); a drain on a Node in ``kept`` (held out of
    service), on a node Kubernetes does not know, or set by anyone else stays.

    Returns the nodes undrained and the drains of ours kept, with why."""
    undrained: list[str] = []
    kept_drains: dict[str, str] = {}
    for name, view in sorted((await rest.nodes()).items()):
        if not (view.drained and view.ours):
            continue
        if name not in clean:
            why = kept.get(name) or "no Kubernetes Node of that name was cleaned"
            kept_drains[name] = why
            progress(f"slurm node {name}: drain kept ({why})")
            continue
        if not dry_run:
            await rest.undrain(name)
        undrained.append(name)
        verb = "would undrain" if dry_run else "undrained"
        progress(f"slurm node {name}: {verb} ({view.reason})")
    return undrained, kept_drains
