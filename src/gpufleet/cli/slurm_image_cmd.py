"""``gpufleet local slurm-image``: the Slurm 24.11 root that ``local up --slurm 24.11`` runs."""

from __future__ import annotations

import time

import typer
from rich.console import Console

from gpufleet.cli.errors import EXIT_NO, fail

app = typer.Typer(
    help="The Slurm 24.11 root filesystem (Debian 13 packages) that `gpufleet local up "
    "--slurm 24.11` chroots its Slurm daemons and commands into.",
    no_args_is_help=True,
)
console = Console(stderr=True)


@app.command()
def build(
    rebuild: bool = typer.Option(
        False, "--rebuild", help="Build even if the cache has this root (e.g. Debian updates)."
    ),
) -> None:
    """Build the Slurm 24.11 root into the cache, unless it is there already.

    The root is the Slurm image of images/slurm/Containerfile: its Debian base
    debootstrapped, its RUN steps chrooted in the same tree. Needs root (debootstrap,
    chroot) and the Debian mirror this host's apt uses (GPUFLEET_DEBIAN_MIRROR overrides
    it). About 100 s, then cached under ~/.cache/gpufleet/slurm-root/KEY, where KEY changes
    with the Containerfile's RUN steps and scripts/slurm-root/.

    Example:

        sudo .venv/bin/gpufleet local slurm-image build
    """
    from gpufleet.local import slurm_root

    start = time.perf_counter()
    try:
        console.print(f"Slurm root {slurm_root.Inputs.of_checkout().key()}")
        report = slurm_root.build(
            rebuild=rebuild,
            progress=lambda line: console.print(
                f"  {line}", highlight=False, markup=False, soft_wrap=True
            ),
        )
    except slurm_root.SlurmRootError as exc:
        fail(str(exc), hint="see docs/slurm.md#slurm-2411", code=EXIT_NO)
    verb = "built" if report.built else "cached"
    took = time.perf_counter() - start
    console.print(
        f"{verb} ({took:.1f} s): {report.root.tree} (slurm {report.root.version})", soft_wrap=True
    )
